"""Packaging: the rooms are top-level folders that ship as ``fastvocab.<room>`` (shared/DESIGN.md, "Rooms").

The wheel is built from a copy of the packaging inputs (pyproject.toml, setup.py, README.md, fastvocab/ and
the rooms) in a temporary folder, offline and without build isolation (setuptools and wheel are pinned in
requirements.txt), so the test leaves nothing in the repository and needs no index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]
# The rooms of the design card, in import order (pipeline -> ... -> artifacts_schema).
ROOMS = ("pipeline", "experiments", "training", "tasks", "decoding", "kernels", "artifacts_schema")
PACKAGING_FILES = ("pyproject.toml", "setup.py", "README.md")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc")


def _source_files(room: str) -> set[Path]:
    return {p for p in (ROOT / room).rglob("*.py") if "__pycache__" not in p.parts}


def _expected_entries() -> dict[str, Path]:
    """Wheel entry -> source file: every module of every room, fastvocab/__init__.py and the package data."""
    expected = {"fastvocab/__init__.py": ROOT / "fastvocab" / "__init__.py"}
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
