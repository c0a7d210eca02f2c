"""Every reference in the repository resolves inside it.

A user of the repository has only the repository: no file may send them to
a document outside it (the planning notes the project started from), and a
"decision N" must be one docs/design.md defines.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.databases import ROOT

DESIGN = ROOT / "docs" / "design.md"
# Built from parts so this file does not match itself.
OUTSIDE = [
    re.compile(re.escape(".." + "/shared")),
    re.compile(r"\bshared/(?:PROTOCOL|DESIGN)"),
    re.compile("PROTOCOL" + r"\.md"),  # the repository's is docs/protocol.md
    re.compile("DESIGN" + r"(?:\.md|\s+decisions?\b)"),
]
CITED = re.compile(r"\bdecisions?\s+(\d+(?:\s*(?:,|and|-|\u2013)\s*\d+)*)", re.IGNORECASE)
TEXT_SUFFIXES = {".py", ".md", ".js", ".ts", ".html", ".css", ".toml", ".txt", ".cfg", ".ini"}


def repository_files() -> list[Path]:
    """The tracked and the new (not ignored) text files of the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    files = []
    for name in listed:
        path = ROOT / name
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name == "Makefile"):
            files.append(path)
    return files


def defined_decisions() -> set[int]:
    """The numbers of docs/design.md's "Decisions" list."""
    text = DESIGN.read_text()
    section = text[text.index("\n## Decisions\n") :]
    section = section[: section.index("\n#", 1)]
    return {int(n) for n in re.findall(r"^(\d+)\. \*\*", section, re.MULTILINE)}


def cited_numbers(text: str) -> set[int]:
    """Every decision number ``text`` cites ("decisions 1-3" cites 1, 2 and 3)."""
    numbers: set[int] = set()
    for match in CITED.finditer(text):
        for part in re.split(r"\s*(?:,|and)\s*", match.group(1)):
            ends = [int(n) for n in re.split(r"\s*[-\u2013]\s*", part)]
            numbers.update(range(ends[0], ends[-1] + 1))
    return numbers


def test_the_decision_list_is_there() -> None:
    assert defined_decisions() == set(range(1, 21))


def test_cited_numbers_are_read_with_ranges_and_lists() -> None:
    assert cited_numbers("decisions 1-3, and decision 14; design decisions 6 and 8") == {
        1,
        2,
        3,
        6,
        8,
        14,
    }


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in repository_files():
        text = path.read_text(errors="replace")
        # On the whole text: a citation may wrap onto the next line.
        for pattern in OUTSIDE:
            for match in pattern.finditer(text):
                number = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
    assert not found, "references to documents outside the repository:\n" + "\n".join(found)


def test_every_cited_decision_is_defined_in_docs_design() -> None:
    defined = defined_decisions()
    found = []
    for path in repository_files():
        text = path.read_text(errors="replace")
        # A citation may wrap onto the next line: read the file as one line.
        missing = cited_numbers(" ".join(text.split())) - defined
        if missing:
            found.append(f"{path.relative_to(ROOT)}: decision {sorted(missing)}")
    assert not found, "decisions docs/design.md does not define:\n" + "\n".join(found)


#: "issue 26", "issues 21 and 22": the project's tracker, which a reader of the docs does not have.
TRACKER = re.compile(r"\bissues?\s+\d+", re.IGNORECASE)


def test_the_docs_cite_no_tracker_issue() -> None:
    found = []
    for path in repository_files():
        if path.suffix != ".md":
            continue
        text = " ".join(path.read_text(errors="replace").split())
        found += [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for m in TRACKER.finditer(text)]
    assert not found, "the docs cite tracker issues a reader cannot look up:\n" + "\n".join(found)
