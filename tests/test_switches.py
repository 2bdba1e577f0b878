"""fastvocab.switches: every FASTVOCAB_ variable the package names is declared there and read nowhere else, no
room keeps a switch as a module global, and a switch set through the module (or its variable) reaches its
user."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from fastvocab import switches
from fastvocab.decoding.cache_memory import cache_limit
from fastvocab.kernels.union_costs import CostTable, load_cost_table
from fastvocab.tasks.dump import teacher_rows

ROOT = Path(__file__).resolve().parents[1]
# the rooms and the package's own folder
ROOMS = ("artifacts_schema", "kernels", "decoding", "tasks", "experiments", "training", "pipeline")
FOLDERS = (*ROOMS, "fastvocab")
SWITCHES = ROOT / "fastvocab" / "switches.py"
VARIABLE = re.compile(r"\bFASTVOCAB_[A-Z0-9_]+")


def _package_files() -> list[Path]:
    return sorted(p for room in FOLDERS for p in (ROOT / room).rglob("*.py") if p != SWITCHES)


def test_every_variable_the_package_names_is_declared():
    declared = set(switches.environment_variables())
    named = {
        (name, str(path.relative_to(ROOT)))
        for path in _package_files()
        for name in VARIABLE.findall(path.read_text())
    }
    assert named, "the package names no FASTVOCAB_ variable: the pattern is wrong"
    assert not {(n, p) for n, p in named if n not in declared}
    # and every declared variable has a user
    assert {n for n, _ in named} >= declared


def test_only_the_switches_module_reads_a_fastvocab_variable():
    # a read names the variable in code, as a string of its own (a docstring only mentions it)
    reads = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in _package_files()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and VARIABLE.fullmatch(node.value)
    ]
    reads += [
        f"{path.relative_to(ROOT)}:{i}"
        for path in _package_files()
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"os\.environ|getenv", line) and "FASTVOCAB" in line
    ]
    assert reads == []


def test_no_room_keeps_a_switch_as_a_module_global():
    kept = []
    for path in _package_files():
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            for target in targets:
                if isinstance(target, ast.Name) and target.id in switches.DECLARED:
                    kept.append(f"{path.relative_to(ROOT)}: {target.id}")
    assert kept == []


def test_a_switch_set_through_the_module_reaches_its_user(tmp_path):
    assert teacher_rows("cpu", 1000) == switches.TEACHER_ROWS.default
    with switches.override(TEACHER_ROWS=3):
        assert teacher_rows("cpu", 1000) == 3
        with switches.override(TEACHER_ROWS=5):  # nested blocks restore in turn
            assert teacher_rows("cpu", 1000) == 5
        assert teacher_rows("cpu", 1000) == 3
    assert teacher_rows("cpu", 1000) == switches.TEACHER_ROWS.default
    with switches.override(CACHE_DIR=tmp_path / "cache", CACHE_LIMIT_MB=2):
        assert switches.cache_root() == tmp_path / "cache"
        assert cache_limit(None) == 2 << 20 and cache_limit(1000) == 1000
    assert cache_limit(None) is None


def test_a_variable_is_read_when_its_user_asks_and_an_override_comes_first(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTVOCAB_CACHE_DIR", str(tmp_path / "env"))
    assert switches.cache_root() == tmp_path / "env"  # set after import: read at the call
    with switches.override(CACHE_DIR=tmp_path / "ours"):
        assert switches.cache_root() == tmp_path / "ours"
    monkeypatch.setenv("FASTVOCAB_CACHE_LIMIT_MB", "")  # empty: not set
    assert cache_limit(None) is None
    table = CostTable(rows=(1, 8), gather_us=(1.0, 2.0), dense_us=(0.5, 1.0))
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(table.to_json()))
    monkeypatch.setenv("FASTVOCAB_INT8_COSTS", str(path))
    assert load_cost_table() == table


@pytest.mark.parametrize(
    ("values", "refused"),
    [
        ({"NO_SUCH": 1}, "no switch 'NO_SUCH'; the switches: "),
        ({"INT8_GEMM": "mkl"}, "FASTVOCAB_INT8_GEMM='mkl': expected auto, fbgemm or onnxruntime"),
        ({"CACHE_LIMIT_MB": -1}, "FASTVOCAB_CACHE_LIMIT_MB=-1: expected a number >= 0"),
        ({"SYNC_EVERY": 0}, "SYNC_EVERY=0: expected an integer >= 1"),
        ({"SYNC_EVERY": True}, "SYNC_EVERY=True: expected an integer >= 1"),
        ({"SYNC_EVERY": None}, "SYNC_EVERY=None: it has no unset state"),
        ({"COMPACT_FRACTION": 2.0}, r"COMPACT_FRACTION=2.0: expected a number from 0.0 to 1.0"),
        ({"COMPILED_CANDIDATES": "no"}, "COMPILED_CANDIDATES='no': expected True or False"),
        ({"CACHE_DIR": 3}, "FASTVOCAB_CACHE_DIR=3: expected a path"),
    ],
)
def test_a_bad_value_is_refused_naming_the_switch(values, refused):
    with pytest.raises(ValueError, match=re.escape(refused)), switches.override(**values):
        pass
    assert not switches._overrides  # nothing left set


def test_a_bad_variable_is_refused_when_read(monkeypatch):
    monkeypatch.setenv("FASTVOCAB_CACHE_LIMIT_MB", "lots")
    refused = "FASTVOCAB_CACHE_LIMIT_MB='lots': expected a number >= 0"
    with pytest.raises(ValueError, match=re.escape(refused)):
        cache_limit(None)


def test_every_switch_is_documented_with_a_default_of_its_kind():
    for switch in switches.DECLARED.values():
        assert len(switch.doc) > 40, switch.name
        if switch.default is not None:
            assert switch.check(switch.default, switch.label) == switch.default, switch.name
