"""README is for users and short; every relative link of README.md and docs/*.md leads to a file
that exists (the part before any #anchor)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
INLINE = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)


def links(text: str) -> list[str]:
    """The link targets of a Markdown text, outside code blocks and code spans."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return INLINE.findall(prose) + REFERENCE.findall(prose)


def relative(target: str) -> bool:
    return not re.match(r"^([a-z][a-z0-9+.-]*:|#|//)", target, re.I)


def test_readme_is_under_250_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 250


def test_links_are_found_outside_code_only() -> None:
    text = (
        'See [a](docs/a.md#part), [b](<b.md>), ![i](img.png "t"), [web](https://x.org), [top](#top).\n'
        "`[not](a-link.md)` and names match `[a-z](-*[a-z])*`\n"
        "```\n[no](inside-a-fence.md)\n```\n"
        "[ref]: docs/ref.md\n"
    )
    assert links(text) == ["docs/a.md#part", "b.md", "img.png", "https://x.org", "#top", "docs/ref.md"]
    assert [t for t in links(text) if relative(t)] == ["docs/a.md#part", "b.md", "img.png", "docs/ref.md"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    broken = [t for t in links(page.read_text()) if relative(t) and not (page.parent / t.split("#", 1)[0]).exists()]
    assert broken == []
