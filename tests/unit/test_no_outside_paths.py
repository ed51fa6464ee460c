"""A clone holds everything its files point at: no tracked file names a document outside the repository
(the specification it was built from lived beside it, not in it), and every relative link of the README and
docs/ leads to a file that exists. The forbidden names are assembled below so that this file does not name
them itself."""

from __future__ import annotations

import re
import subprocess
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MD = ".md"
# Documents that were never in the repository: a mention of one is a pointer a reader cannot follow.
OUTSIDE = ("../" + "shared", "CONTRACT" + MD, "DESIGN" + MD, "peer-implementations" + MD, "peer-systems" + MD)
# The per-paper specifications' file names; Guha's is also the name of an algorithm page of docs/, so a
# mention of one of these passes only as a path that exists in the repository.
SPEC_PAGES = ("vernade2017", "vernade2020", "pikeburke2018", "wang2021", "manegueu2020", "guha")
SPEC_MENTION = re.compile(r"([\w./-]*?)\b(" + "|".join(SPEC_PAGES) + r")\.md\b")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


@cache
def tracked() -> tuple[Path, ...]:
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return tuple(ROOT / name for name in listed.decode().split("\0") if name)


def text_of(path: Path) -> str | None:
    """The file's text; None for a binary file (a NUL byte) or one that is not UTF-8, or one deleted but
    still listed by git."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def resolves(path: Path, target: str) -> bool:
    """Whether ``target`` names an existing file or directory, relative to ``path``'s directory or, as code
    comments write paths, to the repository's root."""
    return any((base / target).exists() for base in (path.parent, ROOT))


def outside_mentions(path: Path, text: str) -> list[tuple[int, str]]:
    """(offset, name) of each mention of a document outside the repository, in order."""
    found = [(match.start(), name) for name in OUTSIDE for match in re.finditer(re.escape(name), text)]
    for match in SPEC_MENTION.finditer(text):
        if not (match.group(1) and resolves(path, match.group(0))):
            found.append((match.start(), match.group(0)))
    return sorted(found)


def test_no_tracked_file_names_a_document_outside_the_repository() -> None:
    offenders = []
    for path in tracked():
        text = text_of(path)
        if text is None:
            continue
        for offset, mention in outside_mentions(path, text):
            offenders.append(f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, offset) + 1}: {mention}")
    assert not offenders, "files name documents outside the repository:\n" + "\n".join(offenders)


def links_of(text: str) -> list[str]:
    """The link targets of a markdown text, code blocks and code spans left out (they show syntax)."""
    prose = CODE_SPAN.sub("", FENCE.sub("", text))
    return [match.group(1) for match in LINK.finditer(prose)]


def test_every_relative_link_of_the_docs_leads_to_a_file() -> None:
    pages = [path for path in tracked() if path.suffix == MD and (path == ROOT / "README.md" or "docs" in path.parts)]
    assert ROOT / "docs" / "README.md" in pages
    broken = []
    for page in pages:
        for target in links_of(page.read_text(encoding="utf-8")):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a URL, or an anchor in the same page
            relative = target.split("#", 1)[0]
            if not (page.parent / relative).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_the_checks_catch_what_they_are_for() -> None:
    """The two checks on made-up text: a spec mention, an outside path and a broken link are caught; an
    existing page and an in-repo link pass."""
    page = ROOT / "docs" / "README.md"
    spec, guha, shared = "vernade2017" + MD, "guha" + MD, "../" + "shared"
    assert outside_mentions(page, f"see {spec} §3") == [(4, spec)]
    assert outside_mentions(page, f"see {shared}/x") == [(4, shared)]
    assert [name for _, name in outside_mentions(page, f"the {guha}, or missing/{guha}")] == [guha, "missing/" + guha]
    assert outside_mentions(page, "[guide](operators.md) and docs/operators.md") == []
    assert links_of("[a](x.md) `[b](y.md)` ![c](img/z.png)\n```\n[d](w.md)\n```\n") == ["x.md", "img/z.png"]
