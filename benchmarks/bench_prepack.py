"""Float32 linear layers on CPU: MKL's GEMM on ``W`` as stored (``F.linear``) against oneDNN's on a pre-packed
``W`` (``kernels.prepack``), by matrix size, rows and threads.

    .venv/bin/python benchmarks/bench_prepack.py          # M2M100-418M's decoder matrices, 1 and 2 threads
    .venv/bin/python benchmarks/bench_prepack.py --quick  # a smoke run

The static decoder multiplies its layers' linears on the packed copy for the row counts of
``prepack.packed_rows()`` (which depend on the thread count), where this benchmark found the packed GEMM
faster. Each call is checked against ``F.linear`` (largest relative difference). Times: the best of
``--blocks`` blocks of ``--calls`` calls, after warm-up (the best, not the median: the machine is shared and
noise only adds). Writes JSON (``--out``) with the device, torch's version, the commit and the load average.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

import torch
from bench_meta import best_seconds, result_header, write_result

from fastvocab.kernels import prepack

# (out, in): M2M100-418M's decoder step (d 1024, FFN 4096): fused QKV, an attention output, fc1, fc2; and the
# demo model's fc1 (d 256, FFN 1024), below the packing floor.
SHAPES = [(3072, 1024), (1024, 1024), (4096, 1024), (1024, 4096), (1024, 256)]
ROWS = [1, 4, 8, 16, 32, 48, 64, 96, 128, 256]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--calls", type=int, default=30)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="small sizes, few calls (a smoke run)")
    p.add_argument("--out", type=Path, default=None, help="JSON results file")
    args = p.parse_args(argv)
    shapes, rows_list = SHAPES, ROWS
    if args.quick:
        shapes, rows_list, args.calls, args.blocks = [(96, 64)], [1, 8], 3, 1
    time_us = partial(best_seconds, calls=args.calls, blocks=args.blocks, warmup=3)
    rows_out = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for out_f, in_f in shapes:
            gen = torch.Generator().manual_seed(0)
            w, b = torch.randn(out_f, in_f, generator=gen), torch.randn(out_f, generator=gen)
            packed = prepack.pack_weight(w)
            for rows in rows_list:
                x = torch.randn(rows, in_f, generator=gen)
                want = torch.nn.functional.linear(x, w, b)
                got = prepack.packed_linear(x, packed, b)
                rel = float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))
                plain = 1e6 * time_us(partial(torch.nn.functional.linear, x, w, b))
                pk = 1e6 * time_us(partial(prepack.packed_linear, x, packed, b))
                rows_out.append(
                    {
                        "threads": threads,
                        "out": out_f,
                        "in": in_f,
                        "weight_mib": round(out_f * in_f * 4 / 2**20, 2),
                        "rows": rows,
                        "plain_us": round(plain, 1),
                        "packed_us": round(pk, 1),
                        "plain_over_packed": round(plain / pk, 3),
                        "max_rel_diff": rel,
                    }
                )
                print(
                    f"{threads}t {out_f}x{in_f} {rows:4d} rows: F.linear {plain:8.1f} us, "
                    f"packed {pk:8.1f} us, ratio {plain / pk:5.2f}",
                    flush=True,
                )
    result = {
        **result_header("bench_prepack"),
        "timing": f"best of {args.blocks} blocks of {args.calls} calls, float32",
        "rows": rows_out,
    }
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
