"""The int8 union kernels' cost table: the packaged one is what its result file measured, another machine's
table replaces it through FASTVOCAB_INT8_COSTS, a malformed one is refused, and the table can be measured
here (``int8_union.measure_costs``, ``bench_int8_gather.py --cost-table``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastvocab import switches
from fastvocab.kernels import int8_union
from fastvocab.kernels.union_costs import CostTable, costs_from_timings, load_cost_table

COSTS_ENV = switches.INT8_COSTS.env

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def packaged(switch) -> CostTable:
    switch(INT8_COSTS=None)
    return load_cost_table()


def test_packaged_table_is_the_median_cost_per_column_of_its_result_file(packaged):
    on = packaged.measured_on
    result = json.loads((ROOT / on["source"]).read_text())
    assert (on["device"], on["cpu_capability"], on["threads"]) == (
        result["device"],
        result["cpu_capability"],
        result["threads"][0],
    )
    derived = costs_from_timings(result["rows"], result["sizes"]["N"], {})
    assert derived.rows == packaged.rows
    assert derived.gather_us == pytest.approx(packaged.gather_us, rel=2e-3)  # the packaged costs are rounded
    assert derived.dense_us == pytest.approx(packaged.dense_us, rel=2e-3)


def test_another_table_replaces_the_packaged_one_when_the_kernels_are_imported(tmp_path, packaged):
    other = CostTable(rows=(1, 64), gather_us=(0.5, 2.0), dense_us=(0.05, 0.25), measured_on={"device": "x"})
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(other.to_json()))
    code = (
        "from fastvocab.kernels import int8_union as u\n"
        "print(u.INT8_COST_ROWS, u.INT8_GATHER_US, u.INT8_DENSE_US, u.COST_TABLE.measured_on['device'])\n"
    )
    env = {**os.environ, COSTS_ENV: str(path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(1,", "64)", "(0.5,", "2.0)", "(0.05,", "0.25)", "x"]
    assert load_cost_table(path) == other != packaged


@pytest.mark.parametrize(
    ("table", "why"),
    [
        ({"rows": [2, 4], "gather_us": [1, 1], "dense_us": [1, 1]}, "ascending from 1"),
        ({"rows": [1, 4], "gather_us": [1], "dense_us": [1, 1]}, "1 gather costs"),
        ({"rows": [1], "gather_us": [0], "dense_us": [1]}, "> 0"),
        ({"rows": [1], "gather_us": [1]}, "dense_us"),
    ],
)
def test_a_malformed_table_is_refused_naming_the_variable(tmp_path, switch, table, why):
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(table))
    switch(INT8_COSTS=path)
    with pytest.raises(ValueError, match=f"{COSTS_ENV}=.*not an int8 cost table.*{why}"):
        load_cost_table()


def test_a_missing_table_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not an int8 cost table"):
        load_cost_table(tmp_path / "none.json")


def test_measured_table_has_a_cost_per_row_count_and_loads_back(tmp_path):
    table = int8_union.measure_costs(d=32, n_vocab=600, rows=(1, 3), unions=(0.1, 0.5), repeats=1)
    assert table.rows == (1, 3) and min(table.gather_us + table.dense_us) > 0
    assert {"cpu_capability", "threads", "d", "N", "unions"} <= set(table.measured_on)
    path = tmp_path / "costs.json"
    path.write_text(json.dumps(table.to_json()))
    assert load_cost_table(path) == table


def test_bench_writes_this_machines_table(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import bench_int8_gather

    out = tmp_path / "costs.json"
    argv = ["--quick", "--threads", "1", "--rows", "1,2", "--union", "0.1", "--cost-table", str(out)]
    threads = torch.get_num_threads()
    try:
        assert bench_int8_gather.main(argv) == 0
    finally:
        torch.set_num_threads(threads)  # the bench measures on the threads it is told
    table = load_cost_table(out)
    assert table.rows == (1, 2)
    assert table.measured_on["N"] == 8000 and "--cost-table" in table.measured_on["command"]
