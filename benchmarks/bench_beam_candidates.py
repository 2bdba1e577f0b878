"""Beam search's per-step candidates on CPU (``decoding.search.row_candidates``): the log-softmax of every
row, one banned id at -inf, the 2 x beam best, over the whole (rows, C) matrix at once or in row blocks of
``ROW_BLOCK_BYTES``.

    .venv/bin/python benchmarks/bench_beam_candidates.py           # beam 4 x batch 8 / 32 / 64 over 32K-256K
    .venv/bin/python benchmarks/bench_beam_candidates.py --quick   # a smoke run

A whole matrix above glibc's mmap threshold (at most 32 MiB) is a fresh mapping every call, and its page
faults are part of what a decoding step pays; so each variant is timed on a new matrix of logits per call, as
the search meets them. Both variants give the same values and ids (checked). Times: the best of ``--blocks``
blocks of ``--calls`` calls, one thread. Writes JSON (``--out``) with the device, the commit and the load.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from bench_meta import best_seconds, result_header, write_result

from fastvocab.decoding import search
from fastvocab.kernels.base import ProjectionOutput

SIZES = [(32, 32_108), (128, 32_108), (32, 128_112), (128, 128_112), (256, 128_112), (128, 256_206)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small sizes, few calls (a smoke run)")
    p.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = p.parse_args(argv)
    sizes = [(16, 4_000)] if args.quick else SIZES
    if args.quick:
        args.calls, args.blocks = 2, 1
    torch.set_num_threads(1)
    banned = torch.tensor([2])
    block_bytes = search.ROW_BLOCK_BYTES
    rows_out = []
    for rows, n in sizes:
        gen = torch.Generator().manual_seed(0)
        base = torch.randn(rows, n, generator=gen) * 3

        def run(block: int, base=base, n=n) -> tuple[torch.Tensor, torch.Tensor]:
            search.ROW_BLOCK_BYTES = block
            logits = base + 0.0  # a new (rows, N) matrix each call, as a projection returns one each step
            return search.row_candidates(ProjectionOutput(logits, None, n), banned, 4)

        whole, blocked = run(1 << 40), run(block_bytes)
        same = torch.equal(whole[0], blocked[0]) and torch.equal(whole[1], blocked[1])
        t_whole = 1e3 * best_seconds(lambda run=run: run(1 << 40), args.calls, args.blocks)
        t_blocks = 1e3 * best_seconds(lambda run=run: run(block_bytes), args.calls, args.blocks)
        search.ROW_BLOCK_BYTES = block_bytes
        rows_out.append(
            {
                "rows": rows,
                "columns": n,
                "matrix_mib": round(rows * n * 4 / 2**20, 1),
                "block_rows": max(1, block_bytes // (4 * n)),
                "whole_ms": round(t_whole, 2),
                "blocks_ms": round(t_blocks, 2),
                "whole_over_blocks": round(t_whole / t_blocks, 2),
                "same_values_and_ids": same,
            }
        )
        print(f"{rows:4d} x {n:7d}: whole {t_whole:7.2f} ms, blocks {t_blocks:7.2f} ms, same {same}")
    result = {
        **result_header("bench_beam_candidates"),
        "threads": 1,
        "row_block_bytes": block_bytes,
        "timing": f"best of {args.blocks} blocks of {args.calls} calls (each on a new matrix; the matrix's "
        "own allocation is timed in both)",
        "rows": rows_out,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
