"""The README is a newcomer's page, and every relative link in the Markdown pages resolves inside the repository."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.helpers import ROOT

PAGES = ["README.md", "CONTRIBUTING.md", "CHANGELOG.md", "benchmarks/README.md"]
PAGES += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks" / "results").glob("*.md"))
PAGES += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks" / "studies").rglob("*.md"))
PAGES += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown page: lower case, punctuation dropped, spaces as hyphens."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


def relative_links(page: str) -> list[str]:
    text = (ROOT / page).read_text()
    return [link for link in LINK.findall(text) if not re.match(r"[a-z]+:", link) and not link.startswith("#")]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves_inside_the_repository(page):
    assert (ROOT / page).is_file(), page
    for link in relative_links(page):
        target = ((ROOT / page).parent / link.split("#")[0]).resolve()
        assert target.exists() and ROOT in target.parents, f"{page}: link {link!r} does not resolve inside the repository"
        if "#" in link and target.suffix == ".md":
            assert link.split("#")[1] in anchors(target), f"{page}: link {link!r} names no heading of its page"


def test_the_studies_index_links_every_study():
    studies = ROOT / "benchmarks" / "studies"
    linked = {(studies / link.split("#")[0]).resolve() for link in relative_links("benchmarks/studies/README.md")}
    pages = {p.resolve() for p in studies.rglob("*.md")} - {(studies / "README.md").resolve()}
    assert pages and not pages - linked, f"studies missing from benchmarks/studies/README.md: {sorted(pages - linked)}"


def test_every_picture_under_benchmarks_is_linked_from_a_page():
    """A PNG under benchmarks/ (the results, the studies) that no page links is one no reader finds: link it or delete it.
    report.py's results.md links each PNG it writes."""
    linked = {((ROOT / page).parent / link.split("#")[0]).resolve() for page in PAGES for link in relative_links(page)}
    pictures = {p.resolve() for p in (ROOT / "benchmarks").rglob("*.png")}
    unlinked = sorted(str(p.relative_to(ROOT)) for p in pictures - linked)
    assert pictures and not unlinked, f"pictures no page links: {unlinked}"


def test_the_readme_reads_in_two_minutes():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 120
    prose = re.sub(r"\]\([^)\s]+\)", "]()", text)  # a link's target may name a dated study; its text may not
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", prose), "a date in the README (history goes to CHANGELOG.md)"
    commits = [w for w in re.findall(r"\b[0-9a-f]{7,40}\b", text) if re.search(r"\d", w) and re.search(r"[a-f]", w)]
    assert not commits, f"commit ids in the README: {commits}"
