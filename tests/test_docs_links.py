"""Every relative link of README.md and docs/*.md resolves: to a file or directory of the repository, and
a `#fragment` to a heading of the page it names (GitHub's anchors). Links inside code blocks are text,
not links; links to other sites are not followed."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def prose(text: str) -> str:
    """`text` without its fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def anchors(page: Path) -> set[str]:
    """GitHub's heading anchors of a markdown page: lower case, punctuation dropped, spaces to hyphens,
    repeated headings numbered."""
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        title = line.lstrip("#").strip().lower()
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page: Path) -> list[str]:
    return [t for t in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, fragment = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no {resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            broken.append(f"{target}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert not broken, broken


def test_the_checker_sees_links_and_anchors(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("# Top\n\n## Truncation or key compaction: the cleanup policy\n## `epochlog up`\n\n"
                    "see [a](p.md#top) and [b](#epochlog-up) and ![img](x.png)\n```\n[c](nowhere.md)\n```\n"
                    "`[d](code.md)` [e](https://example.com)\n")
    assert links(page) == ["p.md#top", "#epochlog-up"]
    assert anchors(page) == {"top", "truncation-or-key-compaction-the-cleanup-policy", "epochlog-up"}


def test_the_readme_stays_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "make test" in readme   # .ci/run calls the README's test command
