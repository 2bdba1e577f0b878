"""How ``translate`` spends its threads on CPU: full against clustered decoding with the batches on worker
processes (forked, one thread each: ``parallel="processes"``, the default where the platform can fork), on
worker threads of one process (``parallel="threads"``), and one batch at a time on every thread
(``workers=1``), in one run with interleaved rounds.

Each round runs every (way, method) pair once in a rotated order; a way's speed-up is the median of its
rounds' full / clustered ratios. Writes ``benchmarks/results/workers-cpu-<date>.json`` (``--out``).

    .venv/bin/python benchmarks/bench_workers.py --batch-size 1 --n 100
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
from pathlib import Path

import torch
from bench_meta import result_header, round_order, write_result

from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.translate import translate

ROOT = Path(__file__).resolve().parents[1]
WAYS = {  # name -> translate's workers and parallel
    "processes": (None, "processes"),
    "threads": (None, "threads"),
    "one batch on every thread": (1, "auto"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "demo"))
    p.add_argument("--maps", default=str(ROOT / "models" / "demo-maps"), help="maps with shortlist tables")
    p.add_argument("--corpus", default=str(ROOT / "data" / "corpus"))
    p.add_argument("--direction", default="en-it")
    p.add_argument("--n", type=int, default=200, help="test lines")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    src_lang, tgt_lang = a.direction.split("-")
    _, lines, _ = read_direction(a.corpus, src_lang, tgt_lang, "test", limit=a.n)
    adapter = Seq2SeqAdapter.load(a.model)
    maps = Path(a.maps)
    methods = {
        "full": make_projection(adapter, "full"),
        "clustered": make_projection(
            adapter,
            "clustered",
            cluster_map=maps / a.direction,
            shortlist=maps / "shortlist" / a.direction,
            inactive_mass="none",
        ),
    }

    def run(way: str, method: str) -> tuple[float, list[str]]:
        workers, parallel = WAYS[way]
        r = translate(
            adapter, methods[method], lines, src_lang, tgt_lang, batch_size=a.batch_size, progress=False,
            workers=workers, parallel=parallel,
        )  # fmt: skip
        return r.seconds, r.hypotheses

    for method in methods:  # warm-up: lazy inits, allocator
        translate(adapter, methods[method], lines[:8], src_lang, tgt_lang, batch_size=a.batch_size,
                  progress=False, workers=1)  # fmt: skip
    pairs = [(w, m) for w in WAYS for m in methods]
    seconds: dict[tuple[str, str], list[float]] = {pair: [] for pair in pairs}
    outputs: dict[tuple[str, str], list[str]] = {}
    for r in range(a.repeats):
        for pair in round_order(pairs, r):
            t, outputs[pair] = run(*pair)
            seconds[pair].append(t)
        print(f"round {r + 1}: " + ", ".join(f"{w}/{m} {seconds[w, m][-1]:.2f}s" for w, m in pairs))
    result = {
        **result_header("translate's workers: processes, threads, one batch on every thread"),
        "model": a.model,
        "maps": a.maps,
        "direction": a.direction,
        "lines": f"{a.corpus} {a.direction} test split (first {len(lines)} rows)",
        "batch_size": a.batch_size,
        "threads": a.threads,
        "repeats": a.repeats,
        "ways": {},
    }
    for way in WAYS:
        full, clustered = seconds[way, "full"], seconds[way, "clustered"]
        result["ways"][way] = {
            "full_seconds": [round(t, 3) for t in full],
            "clustered_seconds": [round(t, 3) for t in clustered],
            "clustered_vs_full": round(
                statistics.median(f / c for f, c in zip(full, clustered, strict=True)), 3
            ),
            "outputs_same_as_processes": all(outputs[way, m] == outputs["processes", m] for m in methods),
        }
        print(way, result["ways"][way])
    date = dt.date.today().isoformat()
    write_result(a.out or ROOT / "benchmarks" / "results" / f"workers-cpu-{date}.json", result)


if __name__ == "__main__":
    main()
