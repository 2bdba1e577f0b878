"""Beam search's per-step candidates on CPU (``decoding.search.row_candidates``): the log-softmax of every
row, one banned id at -inf, the 2 x beam best, over the whole (rows, C) matrix at once or in row blocks of
``ROW_BLOCK_BYTES``.

    .venv/bin/python benchmarks/bench_beam_candidates.py           # beam 4 x batch 8 / 32 / 64 over 32K-256K
    .venv/bin/python benchmarks/bench_beam_candidates.py --quick   # a smoke run
    .venv/bin/python benchmarks/bench_beam_candidates.py --decode models/demo \
        --lines data/corpus/en-it/test.parquet                     # whole beam searches, with and without

``--decode MODEL``: whole beam searches instead (full softmax, ``tasks.translate``, one thread, one batch at a
time), with the blocks and without (``ROW_BLOCK_BYTES`` raised past any matrix), alternating round by round
(``--rounds``), on ``--n`` lines of ``--lines`` (a corpus split's ``text1`` column or a text file; random
words when not given) in ``--src``/``--tgt``; the outputs of both must be equal.

A whole matrix above glibc's mmap threshold (at most 32 MiB) is a fresh mapping every call, and its page
faults are part of what a decoding step pays; so each variant is timed on a new matrix of logits per call, as
the search meets them. Both variants give the same values and ids (checked). Times: the best of ``--blocks``
blocks of ``--calls`` calls, one thread. Writes JSON (``--out``) with the device, the commit and the load.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from bench_meta import best_seconds, result_header, round_order, write_result

from fastvocab.decoding import search
from fastvocab.kernels.base import ProjectionOutput

SIZES = [(32, 32_108), (128, 32_108), (32, 128_112), (128, 128_112), (256, 128_112), (128, 256_206)]


def read_lines(path: Path | None, n: int) -> list[str]:
    if path is None:
        from bench_model_scale import random_lines

        return random_lines(n, 16)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=["text1"]).column("text1").to_pylist()[:n]
    return path.read_text(encoding="utf-8").splitlines()[:n]


def decode_rounds(args) -> dict:
    """Whole beam searches with and without the row blocks, alternating; seconds per round and equality."""
    from fastvocab.decoding import Seq2SeqAdapter
    from fastvocab.kernels import create_projection
    from fastvocab.tasks.translate import translate

    adapter = Seq2SeqAdapter.load(args.decode)
    full = create_projection("full", adapter.output_weight, adapter.output_bias)
    lines = read_lines(args.lines, args.n)
    block_bytes = search.ROW_BLOCK_BYTES
    variants = {"whole": 1 << 40, "blocks": block_bytes}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    outputs: dict[str, list[str]] = {}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name in round_order(list(variants), r):
            search.ROW_BLOCK_BYTES = variants[name]
            res = translate(
                adapter, full, lines, args.src, args.tgt, beam=args.beam, batch_size=args.batch,
                max_len=args.max_len, progress=False, workers=1,
            )  # fmt: skip
            outputs[name] = res.hypotheses
            if r:
                seconds[name].append(round(res.seconds, 3))
            print(f"round {r} {name}: {res.seconds:.2f} s", flush=True)
    search.ROW_BLOCK_BYTES = block_bytes
    med = {name: sorted(v)[len(v) // 2] for name, v in seconds.items()}
    return {
        "model": str(args.decode),
        "lines": len(lines),
        "beam": args.beam,
        "batch": args.batch,
        "rows_per_step": args.beam * args.batch,
        "columns": adapter.n_vocab,
        "seconds": seconds,
        "median_s": med,
        "whole_over_blocks": round(med["whole"] / med["blocks"], 3),
        "outputs_equal": outputs["whole"] == outputs["blocks"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--decode", type=Path, default=None, help="a model folder: time whole beam searches")
    p.add_argument("--lines", type=Path, default=None, help="source lines (--decode)")
    p.add_argument("--n", type=int, default=96, help="lines (--decode)")
    p.add_argument("--src", default="en")
    p.add_argument("--tgt", default="it")
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small sizes, few calls (a smoke run)")
    p.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.decode is not None:
        result = {**result_header("bench_beam_candidates --decode"), "threads": 1, **decode_rounds(args)}
        print(json.dumps({k: result[k] for k in ("median_s", "whole_over_blocks", "outputs_equal")}))
        write_result(args.out, result)
        return 0
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
