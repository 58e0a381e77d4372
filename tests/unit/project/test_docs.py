"""The README is the way in and ``docs/`` the reference: a short README, and every relative link resolves.

A link is ``[text](target)`` in ``README.md``, ``docs/*.md`` or ``bench/results/README.md``. A relative target
must name an existing file or folder; a ``#anchor`` on a Markdown file must name one of its headings, slugged
as GitHub does (lower case, punctuation but ``-``/``_`` dropped, spaces to ``-``, ``-1``... for repeats).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(importlib.util.find_spec("batch").submodule_search_locations[0]).parent
README_MAX_LINES = 150
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted(ROOT.joinpath("docs").glob("*.md")),
        ROOT / "bench" / "results" / "README.md",
    ]


def _anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        anchors.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def _broken(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(target)
    return broken


def test_readme_is_the_way_in_under_150_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; move reference text to docs/"


def test_every_relative_link_in_readme_and_docs_resolves():
    broken = {str(p.relative_to(ROOT)): b for p in _pages() if (b := _broken(p))}
    assert broken == {}


def test_the_link_check_catches_a_missing_file_and_a_missing_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Log output: `--verbose`\n")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md#log-output---verbose) [gone](c.md) [bad](a.md#nope) [self](#x) [web](https://e.org)\n"
    )
    assert _broken(page) == ["c.md", "a.md#nope", "#x"]


def test_every_docs_page_is_one_click_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in LINK.findall((ROOT / "README.md").read_text())}
    assert sorted(p.name for p in ROOT.joinpath("docs").glob("*.md") if p.resolve() not in linked) == []
