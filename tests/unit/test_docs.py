"""The documentation holds together: every relative link in README.md and docs/ resolves (a file, and a
heading for a #anchor), the README stays a landing page, and no text points at this project's issue
tracker by number (the tracker is history; the code and docs must stand on their own)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import REPO

README_MAX_LINES = 200

# What the project's own text is made of. Walked rather than `git ls-files` (the unit tier runs no
# subprocess); data/ holds corpora (tiny Shakespeare speaks of "issue" freely) and caches, so only its README.
SCANNED_ROOTS = (
    "README.md",
    "pyproject.toml",
    "train.py",
    ".ci",
    "conf",
    "docs",
    "mini_gpt",
    "tests",
    "data/README.md",
)
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".ruff_cache"}

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
# The word issue (or issues) followed by a number, with or without "#", across a line break too;
# "issues/1457" (a URL) is not matched.
TRACKER_REF = re.compile(r"\bissues?[\s#-]*\d", re.I)
# Citing another project's tracker is a reference, not our history: allowed when its name comes first.
OTHER_TRACKERS = ("upstream", "lm-evaluation-harness")


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "data" / "README.md"]


def prose(markdown: str) -> str:
    """The text without fenced code blocks and inline code, where brackets are not links."""
    return INLINE_CODE.sub("", FENCE.sub("", markdown))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|__", "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(FENCE.sub("", markdown)):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(path: Path) -> list[str]:
    """Every relative link of the markdown file `path` that points at no file, or at no heading."""
    broken = []
    for target in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.is_file():
            broken.append(f"{target} (no file {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


def tracker_refs(text: str) -> list[str]:
    refs = []
    for match in TRACKER_REF.finditer(text):
        before = text[max(0, match.start() - 40) : match.start()].rstrip().lower()
        if not before.endswith(OTHER_TRACKERS):
            refs.append(text[max(0, match.start() - 30) : match.end() + 10].replace("\n", " "))
    return refs


def scanned_files() -> list[Path]:
    files = []
    for root in SCANNED_ROOTS:
        path = REPO / root
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files += [f for f in candidates if f.is_file() and not SKIPPED_DIRS & set(f.parts)]
    return files


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


def test_docs_pages_exist_and_are_linked_from_the_index() -> None:
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "index.md")
    assert {
        "training.md",
        "data.md",
        "fine-tuning.md",
        "evaluation.md",
        "model-and-export.md",
        "benchmarks.md",
    } <= set(pages)
    assert [p for p in pages if f"]({p})" not in index] == []


def test_readme_is_a_landing_page() -> None:
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES


def test_no_text_refers_to_tracker_numbers() -> None:
    found = {}
    for path in scanned_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file
            continue
        if refs := tracker_refs(text):
            found[str(path.relative_to(REPO))] = refs
    assert found == {}


# The checks themselves, on text made to fail them (so a check that passes everything is caught).


def test_link_check_catches_missing_files_and_headings(tmp_path: Path) -> None:
    (tmp_path / "other.md").write_text("# Other page\n\n## Weights & Biases, 2,500 steps\n")
    page = tmp_path / "page.md"
    page.write_text(
        "# Page\n[ok](other.md) [ok](other.md#weights--biases-2500-steps) [ok](#page) [web](https://x.org/y)\n"
        "[gone](missing.md) [bad anchor](other.md#nope) `[code](not-a-link.md)`\n"
        "```\n[in a block](also-not-a-link.md)\n```\n"
    )
    assert broken_links(page) == [
        f"missing.md (no file {tmp_path / 'missing.md'})",
        "other.md#nope (no heading #nope in other.md)",
    ]


def test_tracker_check_catches_references() -> None:
    word = "iss" + "ue"  # spelled apart so this file passes its own check
    assert tracker_refs(f"the name {word} 13 gives") != []
    assert tracker_refs(f"see {word} #7 and {word}s\n15, 16") != []
    assert tracker_refs(f"upstream {word}s #1457 and lm-evaluation-harness {word}s 1621") == []
    assert tracker_refs(f"github.com/o/r/{word}s/1457, a known {word} with 2 GPUs") == []


def where_rows(text: str) -> list[tuple[str, int, str]]:
    """(path, line, the code it names) of each row of architecture.md's "Where to change" table."""
    section = text.split("## Where to change\n", 1)[1].split("\n## ", 1)[0]
    return [
        (path, int(line), code)
        for path, line, code in re.findall(r"\[`([^`:]+):(\d+)`\]\([^)]*\) `([^`]+)`", section)
    ]


def test_where_to_change_points_at_the_lines_it_names() -> None:
    """Each file:line of architecture.md's table holds the code the row quotes (a moved line fails here:
    rerun the numbers)."""
    rows = where_rows((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert {"mini_gpt/model/gpt.py", "mini_gpt/train/optim.py", "mini_gpt/train/module.py"} <= {
        path for path, _, _ in rows
    }
    for path, line, code in rows:
        lines = (REPO / path).read_text(encoding="utf-8").splitlines()
        assert code in lines[line - 1], f"{path}:{line} is {lines[line - 1].strip()!r}, not {code!r}"


def test_the_where_reader_reads_a_row() -> None:
    text = "## Where to change\n| the loss | [`a/b.py:12`](../a/b.py#L12) `x = f(` | note |\n## Next\n"
    assert where_rows(text) == [("a/b.py", 12, "x = f(")]
