"""Docs move; what points at them must follow. Every relative link in the project's Markdown and every
``docs/...`` or ``benchmarks/...`` path that the package's code names in a comment or docstring must name a
file or folder that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROOMS = ("artifacts_schema", "kernels", "decoding", "tasks", "experiments", "training", "pipeline")
MARKDOWN = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").rglob("*.md")),
    *sorted((ROOT / "benchmarks").glob("*.md")),
    *sorted((ROOT / "benchmarks" / "history").glob("*.md")),
    ROOT / "benchmarks" / "results" / "history" / "README.md",
    *sorted((ROOT / "models").glob("*/README.md")),
    *sorted((ROOT / "deploy").rglob("*.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path the code names: a room-relative docs/ or benchmarks/ path ending in a file name; globs (*) and
# stems cut at a date or a setting (ending in - or _) are patterns, not files.
CODE_PATH = re.compile(r"\b((?:docs|benchmarks)/[A-Za-z0-9_./-]*[A-Za-z0-9_])")


def broken_links(md: Path) -> list[str]:
    broken = []
    for target in LINK.findall(md.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue  # an address or an anchor in the same page
        path = target.split("#", 1)[0]
        if not (md.parent / path).exists():
            broken.append(target)
    return broken


def test_the_markdown_links_resolve():
    assert len(MARKDOWN) > 10, "the docs were not found: the check checks nothing"
    broken = {str(md.relative_to(ROOT)): b for md in MARKDOWN if (b := broken_links(md))}
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_paths_the_code_names_exist():
    named = 0
    missing = []
    for room in ROOMS:
        for source in sorted((ROOT / room).rglob("*.py")):
            for match in CODE_PATH.finditer(source.read_text()):
                path = match.group(1).rstrip(".")
                end = match.end()
                if source.read_text()[end : end + 1] in "*-_":
                    continue
                named += 1
                if not (ROOT / path).exists():
                    missing.append(f"{source.relative_to(ROOT)}: {path}")
    assert named > 10, "no path found in the code: the check checks nothing"
    assert not missing, f"paths named in the code that do not exist: {missing}"
