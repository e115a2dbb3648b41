"""The README and the docs/ pages point only at what exists: every relative link reaches a file
(and its `#anchor` a heading of that page, named as GitHub names it), and every repository path
the pages name (`engine/...`, `studio/...`, `tests/...`, ...) is there. When code moves, this
test names the sentences to fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A path into one of the repository's folders, as the pages write it in text, code or commands.
REPO_PATH = re.compile(r"(?<![\w/.-])((?:engine|pipelines|studio|serve|assets|tools|benchmarks|tests|docs|\.ci)/[\w./*-]*)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def ignored_folders() -> list[str]:
    """Folders the tools write into (the root's anchored .gitignore entries): named, never committed."""
    lines = (ROOT / ".gitignore").read_text().splitlines()
    return [line.strip("/") + "/" for line in lines if line.startswith("/") and line.endswith("/")]


def headings_anchors(text: str) -> list[str]:
    """The `#anchor` of every heading, as GitHub makes it: lower case, punctuation dropped,
    spaces as hyphens, a repeated one numbered -1, -2, ..."""
    anchors, seen = [], {}
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", FENCE.sub("", text), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        anchors.append(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return anchors


def relative_links(page: Path) -> list[str]:
    links = LINK.findall(FENCE.sub("", page.read_text()))
    return [link for link in links if not re.match(r"[a-z][a-z0-9+.-]*:", link)]  # http:, https:, mailto:


def test_the_pages_are_there_and_the_readme_is_a_guide():
    names = {page.name for page in PAGES}
    assert {"README.md", "http-api.md", "workflows.md", "reliability.md", "replicas.md", "benchmarks.md",
            "models.md", "testing.md", "configuration.md"} <= names
    assert len((ROOT / "README.md").read_text().splitlines()) <= 300
    # Every docs page is linked from the README.
    readme_links = {link.split("#")[0] for link in relative_links(ROOT / "README.md")}
    assert {f"docs/{page.name}" for page in PAGES[1:]} <= readme_links


def test_anchors_are_made_as_github_makes_them():
    text = "# Over HTTP: OpenAI's Images and Videos APIs\n## X/Y grids (`benchmarks/workflow_grid.py`)\n## Tests\n## Tests\n"
    assert headings_anchors(text) == ["over-http-openais-images-and-videos-apis",
                                      "xy-grids-benchmarksworkflow_gridpy", "tests", "tests-1"]
    assert headings_anchors("```\n# not a heading\n```\n# Real\n") == ["real"]


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    links = relative_links(page)
    broken = []
    for link in links:
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.exists():
            broken.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in headings_anchors(path.read_text()):
            broken.append(f"{link}: no heading #{anchor} in {path.relative_to(ROOT)}")
    assert broken == []
    if page.parent.name == "docs":
        assert "../README.md" in links  # every page leads back to the guide


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_repository_path_named_exists(page):
    written_by_tools = ignored_folders()
    named = {match.rstrip(".") for match in REPO_PATH.findall(page.read_text())}
    missing = sorted(path for path in named
                     if not path.startswith(tuple(written_by_tools))
                     and not (list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists()))
    assert missing == []
