"""The documentation is self-contained: no tracked file points outside the repository for its
contract, and every pointer into docs/ (Markdown links, `docs/<name>.md, "Heading"` in code)
resolves.

Runs without a database: it reads the files `git ls-files` lists.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

import pytest

from tests import ROOT

_CONTRACT = "SPEC"  # spelled apart so that this file does not match its own patterns
OUTSIDE_REFERENCES = [
    re.compile(rf"\b{_CONTRACT}\.md"),
    re.compile(rf"\b{_CONTRACT}(?:'s)?\s+§"),
    re.compile(r"\.\./shared\b"),
]

MARKDOWN_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
DOC_MENTION = re.compile(r'(?<![\w/.])(docs/[\w./-]+\.md)(?:#([\w-]+))?(?:, "([^"]+)")?')
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


@cache
def tracked_files() -> tuple[Path, ...]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    listing = subprocess.run(
        ["git", "ls-files", "-z"],  # noqa: S607 (git from PATH, fixed arguments)
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return tuple(ROOT / name for name in listing.split("\0") if name)


def text_of(path: Path) -> str | None:
    """The file's text; None for binary files and links to directories."""
    if not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


@cache
def headings(path: Path) -> tuple[set[str], set[str]]:
    """(heading texts, anchors) of a Markdown file, ignoring fenced code."""
    texts: set[str] = set()
    anchors: set[str] = set()
    in_fence = False
    for line in (text_of(path) or "").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match:
            text = match.group(2)
            texts.add(text.replace("`", ""))
            anchor = base = slug(text)
            count = 1
            while anchor in anchors:  # repeated headings get -1, -2, …
                anchor = f"{base}-{count}"
                count += 1
            anchors.add(anchor)
    return texts, anchors


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_no_tracked_file_points_to_a_contract_outside_the_repository():
    found = []
    for path in tracked_files():
        for number, line in enumerate((text_of(path) or "").splitlines(), start=1):
            if any(pattern.search(line) for pattern in OUTSIDE_REFERENCES):
                found.append(f"{relative(path)}:{number}: {line.strip()}")
    assert not found, "point to the doc in docs/ that holds it instead:\n" + "\n".join(found)


def test_every_relative_markdown_link_resolves():
    broken = []
    for path in tracked_files():
        if path.suffix != ".md":
            continue
        in_fence = False
        for number, line in enumerate((text_of(path) or "").splitlines(), start=1):
            if FENCE.match(line):
                in_fence = not in_fence
            if in_fence:
                continue
            for target in MARKDOWN_LINK.findall(re.sub(r"`[^`]*`", "", line)):
                if re.match(r"^[a-z][a-z+.-]*:", target):  # http:, https:, mailto:
                    continue
                name, _, anchor = target.partition("#")
                file = (path.parent / name).resolve() if name else path
                where = f"{relative(path)}:{number}: {target}"
                if not file.exists():
                    broken.append(f"{where} (no such file)")
                elif anchor and file.suffix == ".md" and anchor not in headings(file)[1]:
                    broken.append(f"{where} (no such heading)")
    assert not broken, "\n".join(broken)


def test_every_mention_of_a_doc_resolves():
    """`docs/delivery.md`, `docs/api.md#ids` and `docs/delivery.md, "Ordering"` in any tracked
    text file name a doc that exists and, when given, a heading it has."""
    broken = []
    for path in tracked_files():
        for number, line in enumerate((text_of(path) or "").splitlines(), start=1):
            for name, anchor, heading in DOC_MENTION.findall(line):
                doc = ROOT / name
                where = f"{relative(path)}:{number}: {name}"
                if not doc.is_file():
                    broken.append(f"{where} (no such file)")
                elif anchor and anchor not in headings(doc)[1]:
                    broken.append(f"{where}#{anchor} (no such heading)")
                elif heading and heading not in headings(doc)[0]:
                    broken.append(f'{where}, "{heading}" (no such heading)')
    assert not broken, "\n".join(broken)
