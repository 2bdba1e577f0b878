"""Where a whole ``translate`` goes on one thread: encoder (with the decoder's start), decoder steps, cache
reorders, the output projection, and the rest (the search's own ops, tokenizing, detokenizing), per engine,
dtype, method and beam, on ``--n`` en-it test lines (clustered: the shipped map and shortlist tables), the
median of 3 runs after a warm-up. ``--run`` lists the systems as ``engine:dtype:method:beam``.

    python benchmarks/bench_step_profile.py --out benchmarks/results/run-breakdown-cpu-DATE.json

``--hot``: each of a step's main calls (the decoder body's ONNX Runtime run, the centroid assignment, the
cached blocks' GEMMs, the inactive-mass estimate) runs twice where the run reaches it, and the record gives
both times a call: in place (``in_run_us``, what the run pays, its caches holding what the step before left)
and repeated at once (``repeat_us``, its inputs and weights in cache, as a microbenchmark times it). Each
call is pure or rewrites what it wrote (the body writes the same position), so the outputs stay the same;
the ``total`` of such a run includes the repeats.

The step-level profile (ops a step, time by kind, against CTranslate2's step on the same shapes) that chose
the ONNX Runtime engine is retired: ``history/retired-scripts.md``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from bench_meta import ROOT, result_header, write_result

SYSTEMS = "onnx:int8:clustered:1,onnx:int8:clustered:4,onnx:float32:full:1,onnx:float32:full:4"


def twice(owner, name: str, part: str, held: dict[str, list[float]]) -> None:
    """``owner.name`` replaced by a call that runs it twice, adding to ``held[part]`` the first call's time,
    the repeat's and one call: the first call's result is returned."""
    fn = getattr(owner, name)

    def call(*a, **k):
        t0 = time.perf_counter()
        out = fn(*a, **k)
        t1 = time.perf_counter()
        fn(*a, **k)
        times = held.setdefault(part, [0.0, 0.0, 0])
        times[0] += t1 - t0
        times[1] += time.perf_counter() - t1
        times[2] += 1
        return out

    setattr(owner, name, call)


def run_breakdown(args) -> list[dict]:
    from fastvocab.artifacts_schema.corpus import read_direction
    from fastvocab.decoding import onnx_step, search, steppers
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.experiments.bench_methods import shortlist_folder
    from fastvocab.kernels import clustered
    from fastvocab.tasks.projections import clustered_options, make_projection
    from fastvocab.tasks.translate import SearchSettings, translate

    lines = read_direction(args.corpus, "en", "it", "test")[1][: args.n]
    spent: dict[str, float] = {}

    def timed(fn, part):
        def call(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            spent[part] = spent.get(part, 0.0) + time.perf_counter() - t0
            return out

        return call

    bind = search._bind
    search._bind = lambda proj, batch: timed(bind(proj, batch), "projection")
    for name, part in [("step", "steps"), ("reorder", "reorders"), ("start", "encoder and start")]:
        setattr(steppers.EagerStepper, name, timed(getattr(steppers.EagerStepper, name), part))
    calls: dict[str, list[float]] = {}
    if args.hot:
        twice(onnx_step._Bindings, "run", "body run", calls)
        twice(clustered.ClusteredProjection, "assign", "assignment", calls)
        twice(clustered, "batch_block_logits", "cached blocks", calls)
        twice(clustered, "inactive_log_mass", "inactive mass", calls)
    rows = []
    for engine, dtype, method, beam in (x.split(":") for x in args.run.split(",")):
        adapter, exact = Seq2SeqAdapter.load(args.model, engine=engine), Seq2SeqAdapter.load(args.model)
        if dtype == "int8":
            adapter.quantize_int8()
        opts = {} if method == "full" else dict(
            cluster_map=args.maps / "en-it", shortlist=shortlist_folder(args.maps, "en-it"),
            **clustered_options("union", "auto", False, int(beam), None, True),
        )  # fmt: skip
        proj = make_projection(exact, method, int8=dtype == "int8", **opts)
        settings = SearchSettings(beam=int(beam), batch_size=args.batch_size)
        parts, hot = [], []
        for _ in range(4):  # a warm-up, then 3
            spent.clear()
            calls.clear()
            r = translate(adapter, proj, lines, "en", "it", settings, workers=1, progress=False)
            parts.append({**spent, "total": r.seconds, "rest": r.seconds - sum(spent.values())})
            hot.append({part: (first / n, again / n) for part, (first, again, n) in calls.items()})
        row = {
            "engine": engine,
            "dtype": dtype,
            "method": method,
            "beam": int(beam),
            "batch": args.batch_size,
        }
        row.update({k: round(statistics.median(p[k] for p in parts[1:]), 3) for k in parts[0]})
        if args.hot:
            row["calls"] = {
                part: {
                    "in_run_us": round(1e6 * statistics.median(h[part][0] for h in hot[1:]), 1),
                    "repeat_us": round(1e6 * statistics.median(h[part][1] for h in hot[1:]), 1),
                }
                for part in hot[-1]
            }
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default in [("model", "models/demo"), ("corpus", "data/corpus"), ("maps", "models/demo-maps")]:
        p.add_argument(f"--{flag}", type=Path, default=ROOT / default)
    p.add_argument("--run", default=SYSTEMS, help="engine:dtype:method:beam,... (default: %(default)s)")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--hot", action="store_true", help="time a step's main calls in the run and repeated at once"
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    meta = {"model": str(args.model), "threads": 1, "lines": f"en-it test, first {args.n}", "hot": args.hot}
    write_result(args.out, {**result_header("run-breakdown"), **meta, "rows": run_breakdown(args)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
