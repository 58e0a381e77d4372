"""Archive bombs on adapter import (issue 28, item 6): bounded before anything is written, nothing left behind.

A real export (``docpilot adapters export`` machinery) is rebuilt with extra or altered members. Each is refused by
:func:`adapters.registry.transfer.import_adapter` with an adapter integrity error naming the member, before extraction:
members not listed in ``SHA256SUMS`` (the 3 MB ``.tgz`` that wrote 3 GiB), a sparse member declaring 64 GiB,
members together over the stated cap, a member given twice; and the registry holds no file afterwards.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from adapters.registry import export_copy
from adapters.registry.registry import Registry
from adapters.registry.transfer import export_adapter, import_adapter
from classify.errors import AdapterIntegrityError
from classify.runs.export import SHA256SUMS
from tests.support.transfer import publish


class _Zeros(io.RawIOBase):
    """``n`` zero bytes, streamed (a member of any size without holding it)."""

    def __init__(self, n: int):
        self.left = n

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        k = min(len(buf), self.left)
        buf[:k] = bytes(k)
        self.left -= k
        return k


def _export(tmp_path: Path) -> tuple[Path, list[tarfile.TarInfo], dict[str, bytes]]:
    train = Registry(tmp_path / "train")
    ref = publish(train, tmp_path)
    folder = tmp_path / "export"
    export_adapter(train, ref, folder)
    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
    return folder, [], files


def _rebuild(out: Path, files: dict[str, bytes], extra: list[tuple[tarfile.TarInfo, object]], sums_last: bool = True) -> Path:
    """The export as an archive with ``extra`` members inserted before ``SHA256SUMS`` (as an attacker would)."""
    mode = "w:gz" if out.name.endswith((".tgz", ".gz")) else "w"
    with tarfile.open(out, mode, format=tarfile.GNU_FORMAT) as tar:
        for name, data in files.items():
            if name != SHA256SUMS:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        for info, fh in extra:
            tar.addfile(info, fh)
        info = tarfile.TarInfo(SHA256SUMS)
        info.size = len(files[SHA256SUMS])
        tar.addfile(info, io.BytesIO(files[SHA256SUMS]))
    return out


def _member(name: str, size: int) -> tuple[tarfile.TarInfo, object]:
    info = tarfile.TarInfo(name)
    info.size = size
    return info, _Zeros(size)


def _assert_nothing_left(reg: Registry) -> None:
    left = [p for p in reg.root.rglob("*")] if reg.root.exists() else []
    assert left == [] or all(p.is_dir() and not any(p.iterdir()) for p in left), left
    assert reg.names() == []


BOMBS = [
    ("unlisted-zeros", [("bomb.bin", 64 << 20)], r"archive members not listed in SHA256SUMS: 'bomb.bin'"),
    ("unlisted-many", [(f"junk/{i}.bin", 1024) for i in range(30)], r"not listed in SHA256SUMS: 'junk/0.bin'"),
    ("unlisted-nested", [("a/b/c/d.safetensors", 4096)], r"not listed in SHA256SUMS: 'a/b/c/d.safetensors'"),
]


@pytest.mark.parametrize("suffix", [".tgz", ".tar"])
@pytest.mark.parametrize(("what", "members", "message"), BOMBS, ids=[b[0] for b in BOMBS])
def test_unlisted_members_are_refused_before_extraction(tmp_path, suffix, what, members, message, monkeypatch):
    _, _, files = _export(tmp_path)
    archive = _rebuild(tmp_path / f"bomb{suffix}", files, [_member(n, s) for n, s in members])
    if what == "unlisted-zeros":
        assert archive.stat().st_size < 1 << 20 or suffix == ".tar"  # small archive, 64 MiB declared
    written: list[str] = []
    real_open = open

    def watching_open(path, mode="r", *args, **kwargs):  # nothing but SHA256SUMS is written before the refusal
        if "w" in str(mode) and "import" in str(path):
            written.append(Path(path).name)
        return real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(export_copy, "open", watching_open, raising=False)
    reg = Registry(tmp_path / "serve")
    with pytest.raises(AdapterIntegrityError, match=message):
        import_adapter(archive, reg)
    assert set(written) <= {SHA256SUMS}, written
    _assert_nothing_left(reg)


def test_members_over_the_cap_are_refused_before_writing(tmp_path, monkeypatch):
    _, _, files = _export(tmp_path)
    archive = _rebuild(tmp_path / "big.tgz", files, [])
    total = sum(len(v) for v in files.values())
    monkeypatch.setattr(export_copy, "IMPORT_MAX_BYTES", total - 1)
    monkeypatch.setattr(export_copy.extract_archive, "__defaults__", (total - 1,))
    reg = Registry(tmp_path / "serve")
    with pytest.raises(AdapterIntegrityError, match=f"more than the import cap of {total - 1} bytes"):
        import_adapter(archive, reg)
    _assert_nothing_left(reg)
    monkeypatch.setattr(export_copy.extract_archive, "__defaults__", (total,))
    adapter, created = import_adapter(archive, reg)  # at the cap: imported
    assert created and adapter.ref == "ok@1"


def test_a_listed_name_given_twice_is_refused(tmp_path):
    _, _, files = _export(tmp_path)
    name = "adapter_config.json"
    info = tarfile.TarInfo(name)
    info.size = 5
    archive = _rebuild(tmp_path / "twice.tar", files, [(info, io.BytesIO(b"{}   "))])
    reg = Registry(tmp_path / "serve")
    with pytest.raises(AdapterIntegrityError, match=f"archive member '{name}' is given twice"):
        import_adapter(archive, reg)
    _assert_nothing_left(reg)


@pytest.mark.skipif(shutil.which("tar") is None, reason="GNU tar writes the sparse member")
@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_a_sparse_member_is_refused(tmp_path, fmt):
    folder, _, files = _export(tmp_path)
    sparse = folder / "huge.bin"
    with sparse.open("wb") as fh:  # 64 GiB declared, a few KB on disk and in the archive
        fh.truncate(64 << 30)
    (folder / SHA256SUMS).write_bytes(files[SHA256SUMS] + f"{'0' * 64}  huge.bin\n".encode())  # even listed
    archive = tmp_path / f"sparse-{fmt}.tar"
    names = [n for n in files if n != SHA256SUMS]
    subprocess.run(["tar", "--sparse", f"--format={fmt}", "-cf", str(archive), "-C", str(folder), *names, "huge.bin",
                    SHA256SUMS], check=True)
    assert archive.stat().st_size < 1 << 20
    reg = Registry(tmp_path / "serve")
    with pytest.raises(AdapterIntegrityError, match="'huge.bin' is a sparse file"):
        import_adapter(archive, reg)
    _assert_nothing_left(reg)
    os.unlink(sparse)


def test_an_unlisted_or_special_file_in_an_export_folder_is_refused_before_copying(tmp_path):
    folder, _, _ = _export(tmp_path)
    (folder / "extra.bin").write_bytes(b"x" * 100)
    reg = Registry(tmp_path / "serve")
    with pytest.raises(AdapterIntegrityError, match="files not listed in SHA256SUMS: extra.bin; nothing was copied"):
        import_adapter(folder, reg)
    _assert_nothing_left(reg)
    (folder / "extra.bin").unlink()
    os.mkfifo(folder / "pipe")
    with pytest.raises(AdapterIntegrityError, match="not listed in SHA256SUMS: pipe"):
        import_adapter(folder, reg)
    _assert_nothing_left(reg)
    (folder / "pipe").unlink()
    adapter, created = import_adapter(folder, reg)
    assert created and adapter.ref == "ok@1"
