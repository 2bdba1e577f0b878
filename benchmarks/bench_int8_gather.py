"""Kernels for "logits of the active columns only" with an int8 output layer, on CPU.

    .venv/bin/python benchmarks/bench_int8_gather.py                     # d 1024, N 128,112, 2 threads
    .venv/bin/python benchmarks/bench_int8_gather.py --quick             # a smoke run, small sizes
    .venv/bin/python benchmarks/bench_int8_gather.py --threads 1 --cost-table costs.json   # this machine's

The candidates it times, how each is checked, what it writes, and what a cost table is for and when to trust
one: ``benchmarks/harnesses.md#bench_int8_gatherpy``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from bench_meta import RESULTS, comma_list, load_avg, provenance, write_result

from fastvocab.kernels import create_projection, int8_union
from fastvocab.kernels.int8 import linear_packed, packed_rows

OUT = RESULTS / "int8-gather-cpu-2026-11-25.json"

Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (h, cols) -> (rows, C) logits


def kernels_of(w: torch.Tensor, w8: int8_union.Int8Weights) -> dict[str, Kernel]:
    """The candidates over every union: the float32 gather, the int8 gather, the int8 layer's dense logits
    cut to the union, and the int8 clustered projection's choice between the two."""
    from fastvocab.kernels.gather import gathered_logits

    return {
        "fp32-gather": lambda h, cols: gathered_logits(h, w, None, cols),
        "int8-gather": lambda h, cols: int8_union.int8_gather_gemm(h, w8, cols),
        "int8-dense": lambda h, cols: int8_union.int8_full_logits(h, w8).index_select(1, cols),
        "int8-clustered": lambda h, cols: int8_union.int8_gathered_logits(h, w8, cols),
    }


def cached_kernels(w, q, scale, cols: torch.Tensor) -> dict[str, Kernel]:
    """Batch 1 on a cached cluster: the block is contiguous, built once (outside the timing)."""
    block = w.index_select(0, cols).contiguous()
    qb, sb = q.index_select(0, cols).contiguous(), scale.index_select(0, cols)
    packed = packed_rows(qb, sb, None)
    return {
        "cached-fp32": lambda h, _cols: F.linear(h, block),
        "cached-int8-wpack": lambda h, _cols: torch._weight_int8pack_mm(h, qb, sb),
        "cached-int8-packed": lambda h, _cols: linear_packed(h, packed),
    }


def timed(fn: Callable[[], torch.Tensor], repeats: int) -> dict[str, float]:
    """Median and fastest of ``repeats`` calls in ms, after two warm-up calls. On shared cores the fastest is
    the closer to the kernel's own cost (another job's time slices only ever add to a call)."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return {"ms": round(1e3 * statistics.median(times), 3), "ms_min": round(1e3 * min(times), 3)}


def check(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    err = (out.double() - ref).abs().max() / ref.abs().max()
    agree = (out.argmax(dim=1) == ref.argmax(dim=1)).float().mean()
    return {"max_rel_err": float(err), "argmax_agree": float(agree)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=128_112, help="N")
    # None: [1, 8, 32] and [0.1, 0.3, 0.6]; with --cost-table, the packaged table's
    p.add_argument("--rows", type=comma_list(int))
    p.add_argument("--union", type=comma_list(float))
    p.add_argument("--threads", type=comma_list(int), default=[2], help="e.g. 2,1")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--only", help="comma-separated candidate names (default: all)")
    p.add_argument("--quick", action="store_true", help="d 256, N 8,000, 2 repeats")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--cost-table", help="measure this machine's int8 cost table into this JSON file instead")
    args = p.parse_args(argv)
    if args.quick:
        args.d, args.vocab, args.repeats = 256, 8000, 2
    if args.cost_table:
        return write_cost_table(args, argv)
    args.rows, args.union = args.rows or [1, 8, 32], args.union or [0.1, 0.3, 0.6]
    torch.manual_seed(0)
    n, d = args.vocab, args.d
    w = torch.randn(n, d) * d**-0.5  # no bias: M2M100's tied head has none
    full32 = create_projection("full", w, None)
    full8 = create_projection("full", w, None, int8=True)
    # every int8 candidate reads the full int8 projection's own rows (int8 per output row, symmetric)
    no_map = SimpleNamespace(r=0, population=np.zeros(0), sizes=[], ids=[])
    w8 = int8_union.int8_weights(w, None, no_map)
    q, scale = w8.q, w8.scale
    wq = q.double() * scale.double()[:, None]  # what the int8 candidates compute with
    kernels = kernels_of(w, w8)
    if args.only:
        keep = set(args.only.split(","))
        kernels = {k: v for k, v in kernels.items() if k in keep}
    result: dict = {
        "benchmark": "bench_int8_gather", **provenance("bench_int8_gather.py", argv, "kernels"),
        "torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": args.threads, "sizes": {"d": d, "N": n, "rows": args.rows, "union": args.union},
        "bias": False, "repeats": args.repeats, "load_avg": {"start": load_avg()}, "rows": [],
    }  # fmt: skip
    for threads in args.threads:
        torch.set_num_threads(threads)
        measure(args, result, kernels, full32, full8, w, q, scale, wq, threads)
    result["load_avg"]["end"] = load_avg()
    write_result(Path(args.out), result)
    return 0


def write_cost_table(args, argv: list[str] | None) -> int:
    """``--cost-table``: ``int8_union.measure_costs`` on the first of ``--threads``, with the machine, the
    commit and the command recorded beside the numbers."""
    torch.set_num_threads(args.threads[0])
    sizes = {k: v for k, v in (("rows", args.rows), ("unions", args.union)) if v}
    table = int8_union.measure_costs(args.d, args.vocab, repeats=args.repeats, **sizes)
    measured_on = {**provenance("bench_int8_gather.py", argv, "kernels"), **table.measured_on}
    write_result(Path(args.cost_table), dataclasses.replace(table, measured_on=measured_on).to_json())
    return 0


def measure(args, result: dict, kernels: dict[str, Kernel], full32, full8, w, q, scale, wq, threads: int):
    """Every candidate at every (rows, union) point on ``threads`` threads; rows appended to ``result``."""
    n, d = args.vocab, args.d
    gen = torch.Generator().manual_seed(1)
    for rows in args.rows:
        h = torch.randn(rows, d, generator=gen)
        ref32, ref8 = h.double() @ w.double().T, h.double() @ wq.T
        for name, proj, ref in (("full-fp32", full32, ref32), ("full-int8", full8, ref8)):
            row = {"kernel": name, "threads": threads, "rows": rows, "union": 1.0}
            row.update(timed(lambda proj=proj, h=h: proj(h).logits, args.repeats))
            row.update(check(proj(h).logits, ref))
            row["load_1min"] = round(os.getloadavg()[0], 2)
            result["rows"].append(row)
            print(row, flush=True)
        full8_logits = full8(h).logits
        for u in args.union:
            cols = torch.randperm(n, generator=gen)[: round(u * n)].sort().values
            cands = dict(kernels)
            if rows == 1 and (not args.only or "cached" in args.only):
                cands.update(cached_kernels(w, q, scale, cols))
            for name, fn in cands.items():
                ref = (ref32 if "fp32" in name else ref8)[:, cols]
                row = {"kernel": name, "threads": threads, "rows": rows, "union": u}
                row.update(timed(lambda fn=fn, h=h, cols=cols: fn(h, cols), args.repeats))
                got = fn(h, cols)
                row.update(check(got, ref))
                if "int8" in name:  # the full int8 projection's logits on the same columns
                    row["max_rel_diff_full_int8"] = float(
                        (got - full8_logits[:, cols]).abs().max() / full8_logits.abs().max()
                    )
                row["load_1min"] = round(os.getloadavg()[0], 2)
                result["rows"].append(row)
                print(row, flush=True)


if __name__ == "__main__":
    sys.exit(main())
