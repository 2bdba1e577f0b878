"""benchmarks/bench_model_scale.py end to end at the toy shape: it builds a random-weight model and its
tokenizer from a config, converts it for CTranslate2, writes a synthetic cluster map, decodes a fixed number
of steps in both engines and writes one JSON row per system with every field. It tests the harness, not
timings."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ctranslate2")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_model_scale.py"
FIELDS = {
    "shape",
    "d_model",
    "layers",
    "ffn",
    "vocabulary",
    "system",
    "engine",
    "dtype",
    "active_fraction",
    "batch",
    "beam",
    "threads",
    "parallel",
    "sentences",
    "steps",
    "src_tokens",
    "tokens",
    "seconds_median",
    "seconds",
    "tokens_per_s",
    "projection_share",
    "full_projection_share",
    "union_fraction",
    "full_rows_fraction",
    "bound",
    "gflops",
    "gemm_peak_share",
    "rss_mib",
    "rss_run_mib",
    "loadavg",
}


def _run_toy(tmp_path: Path, systems: str, batch: int = 2) -> tuple[dict, Path]:
    """The script on the toy shape with ``systems`` (2 steps, 10% sets, a batch of ``batch``): record and
    path."""
    out = tmp_path / "result.json"
    cmd = [
        sys.executable, str(SCRIPT), "--shapes", "toy", "--systems", systems,
        "--batch", str(batch), "--beam", "1", "--threads", "1", "--repeats", "1", "--steps", "2",
        "--active", "0.1", "--clusters", "20", "--root", str(tmp_path / "work"),
        "--real-map", str(tmp_path / "no-map"), "--out", str(out),
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), out


@pytest.mark.slow  # ~25 s on 2 idle cores, most of it the CTranslate2 conversion
def test_toy_shape_end_to_end(tmp_path):
    result, _ = _run_toy(tmp_path, "full-fp32,clustered-fp32,ct2-float32")
    assert result["real_map_union_growth"]["skipped"].startswith("skipped: no cluster map")
    assert result["ctranslate2"] and result["torch"] and result["device"]
    assert result["gemm_peak_gflops"]["1"] > 0
    shape = result["shapes"]["toy"]
    assert shape["shape"]["vocab"] == 2000 and shape["disk_mib"]["ct2"] > 0
    assert set(shape["synthetic_maps"]["0.1"]["union_fraction"]) == {"1", "8", "32", "128"}

    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"fastvocab full fp32", "fastvocab clustered fp32 10%", "ct2 float32"}
    for r in rows.values():
        assert set(r) >= FIELDS, FIELDS - set(r)
        assert (r["vocabulary"], r["d_model"], r["batch"], r["beam"], r["threads"]) == (2000, 64, 2, 1, 1)
        assert r["full_rows_fraction"] is None  # only the int8 clustered projection skips its map
        # both engines: every sentence decoded exactly --steps tokens
        assert r["tokens"] == r["sentences"] * r["steps"] == 2 * 2 * 2
        assert r["tokens_per_s"] > 0 and r["gflops"] > 0 and r["rss_mib"] > 0
        assert 0 < r["union_fraction"] <= 1
    full, clustered = rows["fastvocab full fp32"], rows["fastvocab clustered fp32 10%"]
    assert full["union_fraction"] == 1 and full["bound"] is None
    assert 0 < full["projection_share"] < 1
    assert clustered["active_fraction"] == 0.1 and clustered["union_fraction"] < 1
    s, u = clustered["full_projection_share"], clustered["union_fraction"]
    assert clustered["bound"] == pytest.approx(1 / ((1 - s) + s * u), abs=2e-3)
    assert rows["ct2 float32"]["engine"] == "ctranslate2" and rows["ct2 float32"]["projection_share"] is None


@pytest.mark.slow  # ~10 s: no CTranslate2 system, so no conversion
def test_toy_shape_clustered_int8_uses_the_int8_projection(tmp_path):
    """``clustered-int8`` is the int8 decoder with the clustered projection's own int8 option: its row is
    int8, its union and shares are measured, and the memory estimate counts its int8 W. At 8 rows the
    10% sets' expected union costs more than the full int8 GEMM: the steps skip the map (``full_rows``),
    and ``u`` is still the map's union, from a run with the skip off."""
    result, _ = _run_toy(tmp_path, "full-int8,clustered-int8", batch=8)
    needed = result["shapes"]["toy"]["memory"]["needed_mib"]
    assert any(k.startswith("int8 clustered W") for k in needed)
    rows = {r["system"]: r for r in result["rows"]}
    assert set(rows) == {"fastvocab full int8", "fastvocab clustered int8 10%"}
    clustered = rows["fastvocab clustered int8 10%"]
    assert clustered["dtype"] == "int8" and 0 < clustered["union_fraction"] < 1
    assert clustered["full_rows_fraction"] > 0.5
    assert 0 < clustered["projection_share"] < 1 and clustered["bound"] is not None
    assert clustered["tokens"] == clustered["sentences"] * clustered["steps"]
