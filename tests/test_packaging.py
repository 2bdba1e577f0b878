"""Packaging: the rooms are top-level folders that ship as ``fastvocab.<room>`` (docs/ARCHITECTURE.md,
"Rooms"); the wheel installs and runs as a user installs it; pyproject.toml bounds what requirements.txt pins.

The wheel is built from a copy of the packaging inputs (pyproject.toml, setup.py, README.md, fastvocab/ and
the rooms) in a temporary folder, offline and without build isolation (setuptools and wheel are pinned in
requirements.txt), so the test leaves nothing in the repository and needs no index. It is installed with
``--no-deps`` into a fresh virtual environment whose dependencies are this interpreter's site-packages (a
``.pth`` file), and run from a folder outside the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# The rooms of the design card, in import order (pipeline -> ... -> artifacts_schema).
ROOMS = ("pipeline", "experiments", "training", "tasks", "decoding", "kernels", "artifacts_schema")
PACKAGING_FILES = ("pyproject.toml", "setup.py", "README.md")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _source_files(room: str) -> set[Path]:
    return {p for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts}


def _expected_entries() -> dict[str, Path]:
    """Wheel entry -> source file: every module of every room, the package's own (fastvocab/__init__.py,
    fastvocab/switches.py) and the package data."""
    expected = {f"fastvocab/{p.name}": p for p in (ROOT / "fastvocab").glob("*.py")}
    for room in ROOMS:
        for path in _source_files(room):
            expected[f"fastvocab/{path.relative_to(ROOT).as_posix()}"] = path
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, patterns in package_data.items():
        room = package.split(".")[1]
        for pattern in patterns:
            for path in (ROOT / room).glob(pattern):
                expected[f"fastvocab/{path.relative_to(ROOT).as_posix()}"] = path
    return expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in PACKAGING_FILES:
        shutil.copy2(ROOT / name, src / name)
    for folder in ("fastvocab", *ROOMS):
        shutil.copytree(ROOT / folder, src / folder, symlinks=True, ignore=IGNORE)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    done = subprocess.run([*cmd, "-w", str(out), str(src)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    (whl,) = out.glob("fastvocab-*.whl")
    return whl


def test_every_folder_with_modules_is_a_package():
    # setup.py ships the folders that have an __init__.py; a module elsewhere would silently be left out.
    missing = sorted(
        str(folder.relative_to(ROOT))
        for room in ROOMS
        for folder in {p.parent for p in _source_files(room)}
        if not (folder / "__init__.py").is_file()
    )
    assert not missing, f"folders with modules but no __init__.py (not packaged): {missing}"


def test_wheel_holds_every_room_module_under_fastvocab(wheel: Path):
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        expected = _expected_entries()
        shipped = {n for n in names if ".dist-info/" not in n}
        missing = sorted(set(expected) - shipped)
        assert not missing, f"left out of the wheel: {missing}"
        extra = sorted(shipped - set(expected))
        assert not extra, f"in the wheel but not a room module or declared package data: {extra}"
        # What is shipped is the working tree's file, byte for byte.
        for name, path in expected.items():
            assert zf.read(name) == path.read_bytes(), name
        # The report's page template is package data, not a module: read at run time, it must ship.
        assert "fastvocab/pipeline/report_template.html" in names
        # Only fastvocab at the top level: no `tasks`, `pipeline`, ... package lands in site-packages.
        top = {n.split("/")[0] for n in names}
        assert {t for t in top if not t.endswith(".dist-info")} == {"fastvocab"}
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        assert "fastvocab = fastvocab.pipeline.cli:main" in zf.read(entry_points).decode()


def test_installed_wheel_finds_every_module(wheel: Path, tmp_path: Path):
    # Installed into a plain folder first on the path, run outside the repository: the wheel's modules are as
    # many as the rooms', each is found in that folder (its packages imported, not the module itself:
    # kernels.cupy_ops needs CuPy), the CLI imports, and the report reads its template from the package.
    site = tmp_path / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(site)]
    done = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    modules = sorted(
        str(p.relative_to(site).with_suffix("")).replace(os.sep, ".").removesuffix(".__init__")
        for p in (site / "fastvocab").rglob("*.py")
    )
    assert len(modules) == len([n for n in _expected_entries() if n.endswith(".py")])
    code = (
        "import importlib, importlib.util\n"
        f"for name in {modules!r}:\n"
        "    spec = importlib.util.find_spec(name)\n"
        f"    assert spec.origin.startswith({str(site)!r}), (name, spec.origin)\n"
        "importlib.import_module('fastvocab.pipeline.cli')\n"
        "from fastvocab.pipeline.report import template_text\n"
        "assert template_text().startswith('<!DOCTYPE html>')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------- pyproject vs requirements


def _pins() -> dict[str, Requirement]:
    """requirements.txt: canonical name -> its ``name[extras]==version`` line."""
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", line
            pins[canonicalize_name(req.name)] = req
    return pins


def _declared() -> dict[str, list[tuple[str, Requirement]]]:
    """pyproject.toml: canonical name -> (where, requirement) for the dependencies, every extra and the build
    requirements."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    groups = {"dependencies": meta["project"]["dependencies"]}
    groups["build-system"] = meta["build-system"]["requires"]
    groups |= {f"extra {k}": v for k, v in meta["project"]["optional-dependencies"].items()}
    declared: dict[str, list[tuple[str, Requirement]]] = {}
    for where, lines in groups.items():
        for line in lines:
            req = Requirement(line)
            declared.setdefault(canonicalize_name(req.name), []).append((where, req))
    return declared


# Declared but not pinned: the GPU extra's CuPy (requirements.txt is the CPU machines' set).
UNPINNED = {"cupy-cuda13x"}


def test_pyproject_bounds_hold_every_pin_of_requirements():
    pins, declared = _pins(), _declared()
    undeclared = sorted(set(pins) - set(declared))
    assert not undeclared, f"pinned in requirements.txt, named nowhere in pyproject.toml: {undeclared}"
    unpinned = sorted(set(declared) - set(pins) - UNPINNED)
    assert not unpinned, f"in pyproject.toml, not pinned in requirements.txt: {unpinned}"
    for name, reqs in declared.items():
        if name not in pins:
            continue
        (version,) = [s.version for s in pins[name].specifier]
        for where, req in reqs:
            assert req.specifier.contains(version, prereleases=True), (
                f"{where}: {req} excludes requirements.txt's {pins[name]}"
            )
            assert req.extras == pins[name].extras, f"{where}: {req} and {pins[name]} name other extras"


@pytest.mark.parametrize("group", ["dependencies", "extra pipeline"])
def test_what_the_tool_runs_on_is_bounded_above(group: str):
    # an unbounded dependency resolves to whatever is newest (torch 2.14 against the tested 2.13)
    open_ended = [
        str(req)
        for reqs in _declared().values()
        for where, req in reqs
        if where == group and not any(s.operator in ("<", "<=", "==", "~=") for s in req.specifier)
    ]
    assert not open_ended, f"{group}: no upper bound: {open_ended}"


# ----------------------------------------------------------------------------- the wheel in a fresh venv

DEMO_MODEL = ROOT / "models" / "demo"
# one line from in.txt of the folder it runs in
TRANSLATE = ["translate", "--model", DEMO_MODEL, "--src-lang", "en", "--tgt-lang", "it", "-i", "in.txt"]
TRANSLATE += ["-o", "out.txt"]
# The CLI, with some of the pipeline extra's modules made absent (None in sys.modules: what Python reads as
# "not installed", for import and for importlib.util.find_spec): argv[1] names them, comma-separated.
HIDING = (
    "import sys\n"
    "for name in sys.argv.pop(1).split(','):\n"
    "    sys.modules[name] = None\n"
    "from fastvocab.pipeline.cli import main\n"
    "sys.exit(main())\n"
)


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory) -> Path:
    """A fresh virtual environment with the wheel installed (``--no-deps``); its dependencies come from this
    interpreter's site-packages folders (a .pth file): in a clean clone the venv's own, here also those its
    .pth files add. The wheel's fastvocab comes first on the path, before any editable install's."""
    env = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True, timeout=60)
    python = env / "bin" / "python"
    site = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]
    (Path(site) / "_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    done = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return env


@pytest.fixture
def elsewhere(tmp_path: Path) -> Path:
    """A folder outside the checkout (no models/demo in it) with one line to translate."""
    (tmp_path / "in.txt").write_text("Free software.\n")
    return tmp_path


def _run(args: list, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(not (DEMO_MODEL / "config.json").exists(), reason="models/demo is not built")
def test_installed_wheel_translates_from_another_folder(venv: Path, elsewhere: Path):
    where = "import fastvocab.pipeline.cli as m; print(m.__file__)"
    done = _run([venv / "bin" / "python", "-c", where], elsewhere)
    assert done.stdout.startswith(str(venv)), done.stdout + done.stderr  # the wheel's, not the checkout's
    done = _run([venv / "bin" / "fastvocab", *TRANSLATE], elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    (line,) = (elsewhere / "out.txt").read_text().splitlines()
    assert line.strip()


def test_installed_wheel_without_model_says_model_is_required(venv: Path, elsewhere: Path):
    # the demo model is in the checkout, not in the wheel: without --model no default exists
    argv = ["translate", "--src-lang", "en", "--tgt-lang", "it", "-i", "in.txt", "-o", "out.txt"]
    done = _run([venv / "bin" / "fastvocab", *argv], elsewhere)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "fastvocab translate: error: --model is required: this install of fastvocab has no demo model (it is "
        "models/demo of the source checkout); pass --model DIR, a Hugging Face model folder such as "
        "CHECKOUT/models/demo"
    ]
    assert not (elsewhere / "out.txt").exists()


INSTALL = "pip install 'fastvocab[pipeline]'"


@pytest.mark.parametrize(
    ("hidden", "argv", "error"),
    [
        (
            "ray",
            [*TRANSLATE, "--workers", "2"],
            f"fastvocab translate: error: --workers 2 needs Ray, which is not installed: {INSTALL} "
            "(or drop --workers to translate in this process)",
        ),
        (
            "mlflow",
            ["report", "latest", "-o", "report.html"],
            f"fastvocab report: error: the report needs MLflow, which is not installed: {INSTALL}",
        ),
        (
            "ray,mlflow",
            ["run", ROOT / "configs" / "demo.yaml", "--set", f"model={DEMO_MODEL}"],
            f"fastvocab run: error: the pipeline needs Ray and MLflow, which are not installed: {INSTALL}",
        ),
    ],
    ids=["translate-workers", "report", "run"],
)
def test_installed_wheel_without_the_extra_is_one_line(venv: Path, elsewhere: Path, hidden, argv, error):
    done = _run([venv / "bin" / "python", "-c", HIDING, hidden, *argv], elsewhere)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.splitlines() == [error]
    assert sorted(p.name for p in elsewhere.iterdir()) == ["in.txt"], "nothing written"
