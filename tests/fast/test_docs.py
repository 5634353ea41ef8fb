"""The docs say what is: links that resolve, a README a newcomer reads, no lab notebook.

Checked over README.md, CHANGES.md and docs/*.md:
- every relative link and image (`[text](target)`, `![alt](src)`) names a file or directory
  that exists, and a `#anchor` names a heading of that file (GitHub's slugs);
- README.md is at most 200 lines;
- no git commit hash (git has the history; the docs say what is true now);
- no dated heading ("## 5 December: run on ..."): a figure carries its date in its text.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 200
MONTHS = ("January|February|March|April|May|June|July|August|September|October|November"
          "|December")
# A commit hash as the docs would quote one: 7 to 40 lowercase hex digits, standing alone,
# with at least one digit and one letter (so "decade", "1234567" and "faced" are not).
HASH = re.compile(r"(?<![0-9A-Za-z_])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}"
                  r"(?![0-9A-Za-z_])")
DATED_HEADING = re.compile(rf"\b\d{{1,2}}(?:st|nd|rd|th)? (?:{MONTHS})\b"
                           rf"|\b(?:{MONTHS}) \d{{1,2}}\b|\b\d{{4}}-\d{{2}}-\d{{2}}\b")
# [text](target) and ![alt](src); the target up to whitespace (a title may follow) or ")".
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")


def doc_files() -> list[Path]:
    """The pages the checks cover: README, CHANGES (when it exists) and docs/*.md."""
    files = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    if (ROOT / "CHANGES.md").exists():
        files.append(ROOT / "CHANGES.md")
    return files


def prose_lines(text: str) -> list[tuple[int, str]]:
    """Each line outside fenced code blocks, numbered from 1, with inline code blanked out."""
    lines, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, INLINE_CODE.sub("", line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped, spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text only
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and "_", as GitHub does
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor in a markdown file, numbered as GitHub numbers repeats."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fenced or not heading:
            continue
        base = slug(heading.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of one page that names no file, or no heading of its file."""
    broken = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto: and the like: not this repository's files
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}: ({target})"
            if not linked.exists():
                broken.append(f"{where} names no file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{where} names no heading of {linked.name}")
    return broken


def hashes(text: str) -> list[str]:
    return HASH.findall(text)


def dated_headings(text: str) -> list[str]:
    return [line for _, line in prose_lines(text)
            if re.match(r"^#{1,6}\s", line) and DATED_HEADING.search(line)]


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


def test_the_readme_is_at_most_200_lines():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_commit_hash(path):
    text = path.read_text(encoding="utf-8")
    found = [(number, h) for number, line in enumerate(text.splitlines(), start=1)
             for h in hashes(line)]
    assert found == [], f"{path.relative_to(ROOT)}: commit hashes (line, hash): {found}"


@pytest.mark.parametrize("path", doc_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_dated_heading(path):
    assert dated_headings(path.read_text(encoding="utf-8")) == []


# The checks themselves, on made-up pages: each must fail on a broken doc.

def test_a_broken_link_and_anchor_are_caught(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "other.md").write_text("# The sparse model (`--model ctr`) at 200 Mbit/s: 1, 2\n"
                                       "## Exit codes\n## Exit codes\n")
    (tmp_path / "img.png").write_bytes(b"")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md) [ok](other.md#the-sparse-model---model-ctr-at-200-mbits-1-2)\n"
        "[ok](other.md#exit-codes-1) ![ok](img.png) [ok](#a-heading) [web](https://x.y/z)\n"
        "# A heading\n"
        "`[code](nowhere.md)`\n```\n[fenced](nowhere.md)\n```\n"
        "[gone](nowhere.md) ![gone](no.png) [bad](other.md#nope) [bad](#nope)\n")
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == [
        "(nowhere.md) names no file", "(no.png) names no file",
        "(other.md#nope) names no heading of other.md",
        "(#nope) names no heading of page.md"]


def test_the_hash_pattern_takes_hashes_not_words_or_numbers():
    assert hashes("fixed in 97dee2d, and 7808e7d's run; 0852f58.") == [
        "97dee2d", "7808e7d", "0852f58"]
    assert hashes("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b") != []
    not_hashes = ("a decade of accepted, deadbeef, effaced and faded cafe beads",
                  "1077288 bytes, 1796446735, 2,400 updates, 0.9829, 1e-5, 10^7",
                  "abc1234x, x1234abc, DEADBEEF1, ab12, 0x7f, SHA-256",
                  "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")
    for text in not_hashes:
        assert hashes(text) == [], text


def test_the_hash_pattern_catches_this_repositorys_commits():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("no git repository here")
    log = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%h %H"],
                         capture_output=True, text=True, check=False)
    if log.returncode != 0 or not log.stdout.strip():
        pytest.skip(f"git log failed: {log.stderr.strip()}")
    commits = [line.split() for line in log.stdout.splitlines()]
    # A hash of digits alone, or of letters alone, reads as a number or a word: the pattern
    # leaves those (about 1 in 25 short hashes) and takes every other.
    mixed = [(short, full) for short, full in commits
             if re.search("[0-9]", short) and re.search("[a-f]", short)]
    assert len(mixed) >= 0.9 * len(commits)
    for short, full in mixed:
        assert hashes(f"fixed in {short}.") == [short]
        assert hashes(f"({full})") == [full]


def test_a_dated_heading_is_caught():
    page = ("# Chaos\n## 4 December: run on 7808e7d\n### 2026-12-05, the full run\n"
            "## Run of December 5\n```\n# 5 December, a shell comment\n```\n"
            "## The latest full run\nMeasured on 5 December 2026.\n")
    assert dated_headings(page) == ["## 4 December: run on 7808e7d",
                                    "### 2026-12-05, the full run", "## Run of December 5"]
