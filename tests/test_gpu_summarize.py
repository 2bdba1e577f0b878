"""benchmarks/gpu/summarize.py: the campaign's results read out as tables, each goal marked met or missed
by the numbers (synthetic result files here; the campaign's smoke run feeds it real ones)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu" / "summarize.py"


@pytest.fixture(scope="module")
def summarize():
    spec = importlib.util.spec_from_file_location("gpu_summarize", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench_rec(method, backend, us, ratio, floor, rows=40, frac=0.1, n=128_112):
    return {"N": n, "d": 1024, "rows": rows, "active_fraction": None if method == "full" else frac,
            "method": method, "backend": backend, "dtype": "fp16", "time_us": us, "ratio_vs_full": ratio,
            "time_over_measured_floor": floor}  # fmt: skip


def e2e_rec(beam, batch, variant, tps):
    return {"beam": beam, "batch": batch, "variant": variant, "tokens_per_s": tps,
            "speedup_vs_full_static": 1.0}  # fmt: skip


def write(folder: Path, step: str, payload: dict) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"gpu-{step}.json").write_text(json.dumps(payload))


@pytest.mark.parametrize(
    ("us", "floor", "verdicts"), [(15.0, 1.2, ("met", "met")), (25.0, 1.5, ("missed", "missed"))]
)
def test_projection_goal_is_judged_by_the_numbers(summarize, tmp_path, us, floor, verdicts):
    recs = [bench_rec("full", "torch", 100.0, 1.0, 3.0), bench_rec("union", "cupy", us, 100.0 / us, floor),
            bench_rec("per-row", "cupy", 2 * us, 50.0 / us, 2 * floor),
            bench_rec("union/cupy-gemm", "cupy", us / 2, 200.0 / us, floor / 2)]  # fmt: skip
    write(tmp_path, "bench", {"meta": {}, "results": recs})
    text = summarize.summarize(summarize.load([tmp_path]))
    goal = next(line for line in text.splitlines() if line.startswith("Goal"))
    assert f"(>= 6: {verdicts[0]})" in goal and f"(<= 1.3: {verdicts[1]})" in goal
    assert "union/cupy" in text  # the fastest clustered variant is named, the GEMM alone is not a candidate


def test_end_to_end_goals_and_projection_share(summarize, tmp_path):
    recs = [e2e_rec(1, 1, "full/static", 100.0), e2e_rec(1, 1, "full/search-graph", 120.0),
            e2e_rec(1, 1, "union-static/0.1/search-graph", 180.0),
            e2e_rec(1, 1, "decoder-only/static", 900.0),
            e2e_rec(2, 20, "full/static", 1000.0), e2e_rec(2, 20, "union/cupy/0.1", 1100.0),
            {"beam": 1, "batch": 1, "variant": "projection-share", "full_step_ms": 2.0,
             "decoder_only_step_ms": 1.5, "projection_share_of_full_static_step": 0.25}]  # fmt: skip
    write(tmp_path / "call3", "e2e", {"meta": {"smoke": False}, "results": recs})
    text = summarize.summarize(summarize.load([tmp_path]))
    # 180 / 120 (the fastest full, graphed): met; decoder-only is not a clustered variant
    assert "beam 1 batch 1: fastest clustered union-static/0.1/search-graph" in text
    assert "1.50x (>= 1.4: met)" in text
    assert "1.10x (>= 1.25: missed)" in text
    assert "(>= 30%: missed)" in text


def test_cli_refuses_a_folder_without_results(summarize, tmp_path, capsys):
    assert summarize.main([str(tmp_path)]) == 2
    assert "no gpu-*.json" in capsys.readouterr().err
    assert summarize.main([str(tmp_path / "absent")]) == 2


@pytest.mark.parametrize(("bleu", "verdict"), [(25.0, "met"), (19.9, "missed")])
def test_training_steps_and_the_bleu_goal(summarize, tmp_path, bleu, verdict):
    def dev(b):
        return {"en-it": {"bleu": b}, "it-en": {"bleu": b + 1}, "en-fr": {"bleu": 3.0}}

    write(tmp_path, "train-1", {"meta": {}, "steps": 10, "train_minutes_total": 1.0, "train_tokens": 2e6,
                                "dev": dev(1.0)})  # fmt: skip
    write(tmp_path, "train-2", {"meta": {}, "steps": 20, "train_minutes_total": 2.0, "train_tokens": 4e6,
                                "dev": dev(bleu)})  # fmt: skip
    text = summarize.summarize(summarize.load([tmp_path]))
    rows = [line for line in text.splitlines() if line.startswith("| train-")]
    assert [r.split(" | ")[0] for r in rows] == ["| train-1", "| train-2"] and "en-fr" in text
    goal = next(line for line in text.splitlines() if line.startswith("Goal BLEU"))
    assert goal.endswith(verdict) and "(dev, train-2)" in goal  # the last step is judged
