"""The repository stands alone: no tracked file points outside it.

A clone anywhere must pass `make test`, so no file under version control
(code, tests, docs, Makefile, CI) may hold an absolute path of a build
machine, nor a relative path that climbs above the repository's root. Links
in Markdown must also land on a file the repository has. What a test needs
from elsewhere is copied into the repository with its licence
(`tests/reference/`).

How paths are resolved: Markdown links are relative to the file that holds
them; in every other file a path that climbs (starts with a parent-folder
step) could be read relative to its own folder or to the root (the working
directory of `make` and pytest), and leaving the repository from either is a
violation.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Home folders of build machines. Spelt in pieces so this file does not match itself.
MACHINE_ROOTS = tuple("/" + name + "/" for name in ("wo" + "rk", "home", "root", "Users"))

# A climbing path starting a token: at the start of a line or after a quote,
# bracket, space or `=`; ends at the first character that cannot be in it.
CLIMB = re.compile(r"(?:^|(?<=[\s\"'`(\[=:,<]))((?:\.\./)+[^\s\"'`)\]>,;#]*)")


def machine_roots(root: Path = ROOT) -> tuple[str, ...]:
    """The known home folders, plus the folder this clone sits in when it is
    specific enough to be a machine's path (not `/` or `/tmp`)."""
    parent = root.parent
    extra = (str(parent) + "/",) if len(parent.parts) > 2 else ()
    return MACHINE_ROOTS + extra


def escapes(text: str, where: PurePosixPath, roots: tuple[str, ...]) -> list[str]:
    """Every path in `text` (the content of tracked file `where`, relative to
    the root) that points outside the repository, one message each."""
    found: list[str] = []
    markdown = where.suffix == ".md"
    for number, line in enumerate(text.splitlines(), 1):
        for root in roots:
            if root in line:
                found.append(f"{where}:{number}: absolute path of a build machine ({root}…)")
        for match in CLIMB.finditer(line):
            target = match.group(1)
            bases = [where.parent] if markdown else [where.parent, PurePosixPath(".")]
            for base in bases:
                resolved = _normalise(base / target)
                if resolved is None:
                    found.append(f"{where}:{number}: {target} leaves the repository")
                    break
                if markdown and not (ROOT / resolved).exists():
                    found.append(f"{where}:{number}: {target} links to {resolved}, not in it")
                    break
    return found


def _normalise(path: PurePosixPath) -> PurePosixPath | None:
    """`path` with `..` applied, or None when it climbs above the root."""
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part != ".":
            parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def tracked_files() -> list[PurePosixPath]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    return [PurePosixPath(name) for name in listed.split("\0") if name]


def test_no_tracked_file_points_outside_the_repository() -> None:
    files = tracked_files()
    assert PurePosixPath("Makefile") in files, "git ls-files listed nothing useful"
    roots = machine_roots()
    found: list[str] = []
    for name in files:
        try:
            text = (ROOT / name).read_text(encoding="utf-8")
        except (UnicodeDecodeError, FileNotFoundError):
            continue  # binary, or deleted in the work tree and not yet committed
        found += escapes(text, name, roots)
    assert not found, "paths outside the repository:\n" + "\n".join(found)


# The checker itself: each row must be caught (or not), so the guard cannot pass vacuously.
# Paths are spelt with UP so that this file does not match itself.
UP = "." + "./"
SHARED = UP + "shared"
CASES = [
    ("absolute home", "tests/x.py", 'P = Path("' + MACHINE_ROOTS[0] + 'shared/a.yaml")', True),
    ("link to the shared folder", "docs/a.md", "follows `" + SHARED + "/DESIGN.md`", True),
    ("code path from the root", "tests/x.py", 'open("' + SHARED + '/x.json")', True),
    ("two levels up from docs", "docs/a.md", "[x](" + UP + UP + "README.md)", True),
    ("missing file in the repository", "docs/a.md", "[x](" + UP + "nothing-here.md)", True),
    (
        "link to a file we have",
        "docs/a.md",
        "see [README](" + UP + "README.md#configuration)",
        False,
    ),
    ("climb inside a path", "tests/x.py", '"a/' + UP + 'x"', False),
    ("ellipsis in a route", "docs/a.md", "`/_sim/.../crash`", False),
    ("a temp folder", "deploy/c.yaml", "- -data-dir=/tmp/nrc-dev", False),
]


@pytest.mark.parametrize(
    ("name", "where", "line", "caught"), CASES, ids=[case[0] for case in CASES]
)
def test_the_checker(name: str, where: str, line: str, caught: bool) -> None:
    found = escapes(line, PurePosixPath(where), MACHINE_ROOTS)
    assert bool(found) is caught, found


def test_the_folder_of_a_deep_clone_counts_as_a_machine_path() -> None:
    assert "/srv/build/" in machine_roots(Path("/srv/build/main"))
    assert machine_roots(Path("/tmp/main")) == MACHINE_ROOTS
