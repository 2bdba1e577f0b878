"""A clustered int8 projection in union mode times its map step against the full int8 step once per machine
and map, keeps the answer in the cache folder, and skips the map at the row counts where it measured
slower; the full int8 logits there, the map's below."""

from __future__ import annotations

import json
import time

import pytest
import torch

from fastvocab.kernels import create_projection, int8, map_probe
from fastvocab.kernels.map_probe import MapStepProbe
from tests.test_clustered_int8 import batch, layer_and_map


@pytest.fixture
def cache(switch, tmp_path):
    switch(CACHE_DIR=str(tmp_path / "cache"), MAP_PROBE="auto")
    return tmp_path / "cache" / "probes" / "map-steps.json"


def test_a_step_skips_the_map_from_the_first_probed_row_count_that_measured_slower():
    p = MapStepProbe(
        rows=(16, 32, 64), map_us=(90.0, 210.0, 300.0), full_us=(100.0, 200.0, 400.0), measured="x"
    )
    assert [p.skips(r) for r in (1, 15, 16, 31)] == [False, False, False, False]
    assert [p.skips(r) for r in (32, 63)] == [True, True]  # 32's answer holds up to the next probed count
    assert not p.skips(64) and not p.skips(1000)
    assert "32 rows 210 / 200 us" in p.describe()


def test_measure_times_both_steps_at_each_row_count():
    seen: list[int] = []

    def sample(rows: int) -> torch.Tensor:
        seen.append(rows)
        return torch.zeros(rows, 4)

    got = map_probe.measure(lambda h: time.sleep(2e-3), lambda h: None, sample, rows=(16, 32), rounds=3)
    assert seen == [16, 32] and got.rows == (16, 32)
    assert all(m > 1500 for m in got.map_us) and all(f < 1000 for f in got.full_us)
    assert got.skips(16) and got.skips(32)


def fake_measure(monkeypatch, map_us: tuple[float, ...]) -> list[int]:
    calls: list[int] = []

    def measure(map_step, full_step, sample, rows=map_probe.PROBE_ROWS, rounds=map_probe.ROUNDS):
        h = sample(rows[0])
        map_step(h), full_step(h)  # the projection's own steps run
        calls.append(h.shape[0])
        return MapStepProbe(tuple(rows), map_us, (100.0,) * len(rows), "2026-12-04T00:00:00")

    monkeypatch.setattr(map_probe, "measure", measure)
    return calls


def test_the_projection_skips_the_map_where_its_probe_measured_it_slower(cache, monkeypatch):
    w, b, cmap = layer_and_map(size=8)  # small sets: the cost tables alone keep the map at every row count
    calls = fake_measure(monkeypatch, map_us=(50.0, 150.0, 150.0, 150.0))  # slower from 32 rows
    proj = create_projection("clustered", w, b, cluster_map=cmap, int8=True)
    assert calls == [16] and proj.counters["rows"] == 0  # the probe's steps are not counted
    full8 = create_projection("full", w, b, int8=True)
    for rows in (1, 16, 31):
        assert proj(batch(cmap, rows)).ids is not None
    h = batch(cmap, 32)
    out = proj(h)
    assert out.ids is None and proj.counters["full"] == 32
    torch.testing.assert_close(out.logits, full8(h).logits)
    kept = json.loads(cache.read_text())
    assert [entry["map_us"] for entry in kept.values()] == [[50.0, 150.0, 150.0, 150.0]]
    again = create_projection("clustered", w, b, cluster_map=cmap, int8=True)  # read back, not measured
    assert calls == [16] and again(h).ids is None
    other = create_projection("clustered", w, b, cluster_map=layer_and_map(size=9)[2], int8=True)
    assert calls == [16, 16] and other is not None  # another map is another probe
    on_ort = create_projection("clustered", w, b, cluster_map=cmap, int8=True)._w8.on_ort
    monkeypatch.setattr(int8, "ort_at", lambda d: not on_ort)  # the full GEMM on the other library
    create_projection("clustered", w, b, cluster_map=cmap, int8=True)
    assert calls == [16, 16, 16]


def test_no_probe_when_switched_off_or_without_union_int8(switch, monkeypatch, tmp_path):
    switch(CACHE_DIR=str(tmp_path))
    calls = fake_measure(monkeypatch, map_us=(1e9,) * 4)
    w, b, cmap = layer_and_map(size=8)
    switch(MAP_PROBE="off")
    assert create_projection("clustered", w, b, cluster_map=cmap, int8=True)(batch(cmap, 32)).ids is not None
    switch(MAP_PROBE="auto")
    create_projection("clustered", w, b, cluster_map=cmap)  # float32
    create_projection("clustered", w, b, cluster_map=cmap, int8=True, selection="per-row")
    assert calls == []
