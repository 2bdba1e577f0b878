"""The benchmark scripts import helpers from one another (``bench_meta``, ``bench_peer``, ...) as siblings:
no test runs most of them, so a name removed from one script breaks another silently. Read the scripts' own
source and check that every name a script imports from a sibling is defined there, without importing any."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPTS = sorted(BENCH.rglob("*.py"))


def top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def sibling_imports(path: Path) -> list[tuple[Path, str]]:
    """(sibling script, name) for each ``from <sibling> import name`` in ``path`` (at any depth)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            sibling = path.parent / f"{node.module}.py"
            if sibling.exists():
                found += [(sibling, a.name) for a in node.names]
    return found


def test_the_scripts_import_siblings():
    assert any(sibling_imports(p) for p in SCRIPTS), "no script imports a sibling: the check checks nothing"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCH)))
def test_every_name_a_script_imports_from_a_sibling_is_defined(script: Path):
    missing = [f"{s.name}: {name}" for s, name in sibling_imports(script) if name not in top_level_names(s)]
    assert not missing, f"{script.name} imports names its siblings do not define: {missing}"
