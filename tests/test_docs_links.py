"""Every relative link in the README and in docs/ points to a file that exists (and, for a link to
a heading of a Markdown file, to a heading or anchor that exists), so moving a page cannot leave a
dangling reference behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")
EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # http:, https:, mailto:, ...


def prose(text: str) -> str:
    """The page without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"<[^>]+>", "", heading).replace("`", "")
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    found: set[str] = set(EXPLICIT_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", text)):
        base = slug(heading)
        n = seen.get(base, 0)
        found.add(base if n == 0 else f"{base}-{n}")
        seen[base] = n + 1
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(prose(path.read_text(encoding="utf-8")))


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken_links(path: Path) -> list[str]:
    out = []
    for target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            out.append(f"{target}: no file {shown(resolved)}")
        elif fragment and resolved.suffix == ".md" and fragment not in anchors(resolved):
            out.append(f"{target}: no heading or anchor '#{fragment}' in {shown(resolved)}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert not broken_links(page), f"{page.relative_to(ROOT)}: " + "; ".join(broken_links(page))


def test_the_pages_are_found_and_linked() -> None:
    # The check must see the pages and their links, or it proves nothing.
    assert ROOT / "README.md" in PAGES and ROOT / "docs" / "records" / "README.md" in PAGES
    assert any("docs/records/README.md" in target for target in links(ROOT / "README.md"))


def test_a_missing_file_and_a_missing_heading_are_reported(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# A heading, with `code` and punctuation!\n\n<a id=\"kept\"></a>\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#a-heading-with-code-and-punctuation) [ok](other.md#kept)\n"
        "[gone](missing.md) [no heading](other.md#nowhere) [web](https://example.com/x.md)\n"
        "`[in code](missing2.md)`\n\n```\n[in a block](missing3.md)\n```\n"
    )
    problems = broken_links(page)
    assert len(problems) == 2, problems
    assert problems[0].startswith("missing.md: no file")
    assert problems[1].startswith("other.md#nowhere: no heading")


def test_the_readme_stays_short() -> None:
    # The README is for users; measurements and details live in docs/ (docs/records/README.md).
    assert len((ROOT / "README.md").read_bytes()) <= 16_000
