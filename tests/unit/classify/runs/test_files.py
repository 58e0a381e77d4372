"""classify.runs.files: content hashes and folders that appear whole."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import pytest

from classify.runs.files import atomic_dir, file_sha256, ids_sha256, stream_sha256, tree_sha256


def test_hashes_match_hashlib(tmp_path: Path) -> None:
    data = b"x" * (3 * 1024 + 7)
    (tmp_path / "a.bin").write_bytes(data)
    want = hashlib.sha256(data).hexdigest()
    assert file_sha256(tmp_path / "a.bin", chunk_bytes=1000) == want
    assert stream_sha256(io.BytesIO(data), chunk_bytes=10) == want


def test_tree_sha256_skips_hidden_and_listed(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.txt").write_text("b")
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "SHA256SUMS").write_text("ignored")
    (tmp_path / ".tmp-x").mkdir()
    (tmp_path / ".tmp-x" / "c.txt").write_text("c")
    (tmp_path / ".hidden").write_text("h")
    got = tree_sha256(tmp_path, skip={"SHA256SUMS"})
    assert list(got) == ["a.txt", "sub/b.txt"]
    assert got["a.txt"] == hashlib.sha256(b"a").hexdigest()
    assert set(tree_sha256(tmp_path, hidden=True)) == {"a.txt", "sub/b.txt", "SHA256SUMS", ".tmp-x/c.txt", ".hidden"}


def test_atomic_dir_renames_whole_folder(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "out"
    with atomic_dir(target, suffix=".tmp", mode=0o755) as staged:
        assert staged.path.parent == target.parent and staged.path.name.startswith(".out-")
        assert staged.path.name.endswith(".tmp")
        (staged.path / "f").write_text("1")
        assert not target.exists()
    assert (target / "f").read_text() == "1"
    assert target.stat().st_mode & 0o777 == 0o755
    assert [p.name for p in target.parent.iterdir()] == ["out"]


def test_atomic_dir_failure_leaves_nothing(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_dir(target) as staged:
        (staged.path / "f").write_text("half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_existing_target(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    (target / "old").write_text("old")
    with pytest.raises(FileExistsError), atomic_dir(target) as staged:
        (staged.path / "new").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["old"]
    with atomic_dir(target, if_exists="keep") as staged:
        (staged.path / "new").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["old"]
    with atomic_dir(target, if_exists="replace") as staged:
        (staged.path / "new").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_atomic_dir_discard(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "out") as staged:
        (staged.path / "f").write_text("1")
        staged.discard()
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_target_named_inside_the_block(tmp_path: Path) -> None:
    with atomic_dir(tmp_path / "import", suffix=".tmp") as staged:
        assert staged.path.name.startswith(".import-") and staged.path.parent == tmp_path
        (staged.path / "card.json").write_text("{}")
        staged.target = tmp_path / "name" / "3"
    assert (tmp_path / "name" / "3" / "card.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["name"]


def test_ids_sha256_joins_with_newlines_and_keeps_lone_surrogates() -> None:
    assert ids_sha256(["a", "b"]) == hashlib.sha256(b"a\nb").hexdigest()
    assert ids_sha256(["x\ud800"]) == hashlib.sha256("x\ud800".encode("utf-8", "surrogatepass")).hexdigest()
