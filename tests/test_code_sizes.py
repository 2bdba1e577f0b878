"""Sizes that must not grow back: the benchmark scripts' lines, long functions, long parameter lists (read
from the source with ``ast``; nothing is imported), and the tracked tree (from ``git ls-files``)."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOMS = (
    "artifacts_schema",
    "kernels",
    "decoding",
    "tasks",
    "experiments",
    "training",
    "pipeline",
    "fastvocab",
)
BENCHMARKS = ROOT / "benchmarks"
# The current scripts (a retired one lives in git, named by benchmarks/history/retired-scripts.md). A script
# that grows the total past this retires one whose question is answered, or shares code through bench_meta.
# (bench_first_line stays while the engine's set-up goal, a second at most, is measured on new CPUs.)
BENCHMARK_LINES = 4_958
FUNCTION_LINES = 120
# A module of the kernels, decoding and tasks rooms is one a newcomer reads whole.
MODULE_LINES = 600
CORE_ROOMS = ("kernels", "decoding", "tasks")
PARAMETERS = 10
# The one public call allowed more: CTranslate2's Translator takes its options as keywords, and so does ours.
MANY_PARAMETERS = {"pipeline/translator.py:Translator.translate_file"}
# A numba kernel takes flat arrays and scalars (a container reaches it as an untyped object); its docstring
# says so in these words.
NUMBA_REASON = "parameters because this is a numba kernel"
# Every clone carries the tracked tree, and a GPU machine receives the working tree under 64 MiB: the shipped
# maps, the demo model and the records share this.
TREE_MIB = 60


def benchmark_scripts() -> list[Path]:
    return sorted(p for p in BENCHMARKS.rglob("*.py") if "history" not in p.relative_to(BENCHMARKS).parts)


def sources() -> list[Path]:
    return [p for room in ROOMS for p in sorted((ROOT / room).rglob("*.py"))] + benchmark_scripts()


def functions(path: Path):
    """(qualified name, node) of every function in ``path``, methods as ``Class.name``."""
    found = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((f"{prefix}{child.name}", child))
                walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")

    walk(ast.parse(path.read_text()), "")
    return found


def parameter_count(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    named = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs) if x.arg not in ("self", "cls")]
    return len(named) + (a.vararg is not None) + (a.kwarg is not None)


def is_numba_kernel(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    jitted = any("njit" in ast.unparse(d) or "numba.jit" in ast.unparse(d) for d in fn.decorator_list)
    return jitted and NUMBA_REASON in (ast.get_docstring(fn) or "")


def test_the_benchmark_scripts_stay_within_their_lines():
    scripts = benchmark_scripts()
    assert len(scripts) > 5, "no benchmark scripts found: the check checks nothing"
    lines = sum(len(p.read_text().splitlines()) for p in scripts)
    assert lines <= BENCHMARK_LINES, f"benchmarks/ holds {lines} lines of Python, more than {BENCHMARK_LINES}"


def test_no_module_of_the_core_rooms_is_over_600_lines():
    core = [p for room in CORE_ROOMS for p in sorted((ROOT / room).rglob("*.py"))]
    assert len(core) > 30, "the core rooms were not found: the check checks nothing"
    sizes = {p.relative_to(ROOT): len(p.read_text().splitlines()) for p in core}
    long = [f"{p} ({n} lines)" for p, n in sizes.items() if n > MODULE_LINES]
    assert not long, f"split these by what they hold: {long}"


def test_no_function_outside_the_tests_is_over_120_lines():
    long = [
        f"{p.relative_to(ROOT)}:{name} ({fn.end_lineno - fn.lineno + 1} lines)"
        for p in sources()
        for name, fn in functions(p)
        if fn.end_lineno - fn.lineno + 1 > FUNCTION_LINES
    ]
    assert not long, f"split these into named parts: {long}"


def test_at_most_one_package_function_takes_more_than_10_parameters():
    package = [p for room in ROOMS for p in sorted((ROOT / room).rglob("*.py"))]
    assert len(package) > 50, "the package was not found: the check checks nothing"
    many = {
        f"{p.relative_to(ROOT)}:{name}"
        for p in package
        for name, fn in functions(p)
        if parameter_count(fn) > PARAMETERS and not is_numba_kernel(fn)
    }
    assert many <= MANY_PARAMETERS, (
        f"group these parameters (a settings object): {sorted(many - MANY_PARAMETERS)}"
    )


@pytest.mark.parametrize(
    ("source", "long", "many"),
    [
        ("def f(a, b):\n    return a\n", False, False),
        ("def f(" + ", ".join(f"a{i}" for i in range(11)) + "):\n    pass\n", False, True),
        (
            "class C:\n    def m(self" + "".join(f", a{i}" for i in range(10)) + "):\n        pass\n",
            False,
            False,
        ),
        ("def f():\n" + "    x = 1\n" * 120, True, False),
        (
            "@njit\ndef k(" + ", ".join(f"a{i}" for i in range(12)) + '):\n    """Twelve parameters because '
            'this is a numba kernel: flat arrays."""\n',
            False,
            False,
        ),
    ],
)
def test_the_checks_see_what_they_count(tmp_path, source, long, many):
    path = tmp_path / "m.py"
    path.write_text(source)
    ((_, fn),) = functions(path)
    assert (fn.end_lineno - fn.lineno + 1 > FUNCTION_LINES) == long
    assert (parameter_count(fn) > PARAMETERS and not is_numba_kernel(fn)) == many


def test_the_tracked_tree_stays_under_its_size():
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked tree is not known")
    files = [ROOT / name.decode() for name in listed if name]
    assert len(files) > 100, "git listed no files: the check checks nothing"
    mib = sum(p.stat().st_size for p in files if p.is_file()) / 2**20
    assert mib < TREE_MIB, f"the tracked tree holds {mib:.1f} MiB, more than {TREE_MIB}"
