"""Tokenization rate of the model adapter with and without its SentencePiece piece table
(``decoding/piece_table.py``), and whether the two give the same ids.

Reads ``--lines`` lines of a direction's train split (both sides: the source through ``tokenize``, the
reference through ``tokenize_targets``), times each path ``--repeats`` times (best of them), and compares
every line's ids. Writes ``benchmarks/results/tokenize-cpu-<date>.json`` (``--out``).

    .venv/bin/python benchmarks/bench_tokenize.py --lines 40000 --threads 2
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

import torch
from bench_meta import result_header, write_result

from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

ROOT = Path(__file__).resolve().parents[1]


def timed(fn, repeats: int) -> tuple[float, list[list[int]]]:
    best, out = float("inf"), []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(ROOT / "models" / "demo"))
    p.add_argument("--corpus", default=str(ROOT / "data" / "corpus"))
    p.add_argument("--direction", default="en-it")
    p.add_argument("--lines", type=int, default=40000)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    src_lang, tgt_lang = a.direction.split("-")
    _, src, tgt = read_direction(a.corpus, src_lang, tgt_lang, "train", limit=a.lines)
    adapter = Seq2SeqAdapter.load(a.model, engine="hf")
    if adapter._pieces is None:
        raise SystemExit(f"{a.model}: its tokenizer has no piece table (not an M2M100-layout tokenizer)")
    sides = {
        "source": lambda: adapter.tokenize(src, src_lang, tgt_lang),
        "reference": lambda: adapter.tokenize_targets(tgt, tgt_lang),
    }
    result = {
        **result_header("tokenization with and without the piece table"),
        "model": a.model,
        "direction": a.direction,
        "lines": len(src),
        "threads": a.threads,
        "repeats": a.repeats,
    }
    table = adapter._pieces
    for side, fn in sides.items():
        fast_s, fast = timed(fn, a.repeats)
        adapter._pieces = None
        try:
            slow_s, slow = timed(fn, a.repeats)
        finally:
            adapter._pieces = table
        differ = sum(x != y for x, y in zip(fast, slow, strict=True))
        result[side] = {
            "piece_table_lines_per_s": round(len(src) / fast_s),
            "python_tokenizer_lines_per_s": round(len(src) / slow_s),
            "speedup": round(slow_s / fast_s, 2),
            "lines_with_other_ids": differ,
        }
        print(side, result[side])
    date = dt.date.today().isoformat()
    write_result(a.out or ROOT / "benchmarks" / "results" / f"tokenize-cpu-{date}.json", result)


if __name__ == "__main__":
    main()
