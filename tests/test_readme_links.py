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


def test_the_benchmarks_pages_keep_a_readers_size():
    """benchmarks/README.md within 300 lines, each "Why each default" row within 300 characters (the argument lives in
    the study), and each study within 300 lines."""
    text = (ROOT / "benchmarks" / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    why = text.split("## Why each default\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in why.splitlines() if line.startswith("| ") and not line.startswith("| flag |")]
    assert rows and not [row[:60] for row in rows if len(row) > 300], "rows of Why each default over 300 characters"
    long = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "benchmarks" / "studies").rglob("*.md")
        if len(p.read_text().splitlines()) > 300
    ]
    assert not long, f"studies over 300 lines: {long}"


SITTINGS = re.compile(
    r"\bissues? #?\d+|(?<![\w/])#\d{2,}\b|\bsessions?\b|\bsittings?\b"
    r"|\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth|this|last) stop\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize(
    "page",
    ["README.md", "CHANGELOG.md", "benchmarks/README.md"]
    + [p for p in PAGES if p.startswith(("docs/", "benchmarks/studies/"))],
)
def test_the_pages_name_no_tracker_issue_and_no_sitting_of_the_work(page):
    """A decision is dated by its study and explained by its evidence; a reader cannot open a tracker's issue, and the
    order of the work is the git log's."""
    found = [m.group(0) for m in SITTINGS.finditer((ROOT / page).read_text())]
    assert not found, f"{page}: {found}"
