"""What calling fbgemm's int8 GEMM from TorchScript saves, against calling the op from Python, on one thread.

    .venv/bin/python benchmarks/bench_int8_calls.py --out benchmarks/results/int8-calls-cpu-DATE.json
    .venv/bin/python benchmarks/bench_int8_calls.py --quick      # a smoke run: small sizes, 8 lines

``calls``: ``quantized.linear_dynamic`` on rows packed as the projections pack them, at a step's row counts,
called from Python (the op overload, as ``kernels.int8.linear_packed`` did until 2026-11-29) and from
TorchScript (``linear_packed`` now); ``blocks``: a step's few packed blocks, one Python call each against
one TorchScript call for all (``linear_packed_many``). Median microseconds a call over ``--repeats`` rounds.

``first_call_ms``: a fresh process's first call, each way (what each worker pays once).

``translate``: the demo model's en-it test lines, clustered int8 with the shipped map and shortlist, one
process on one thread, both ways alternating round by round: the seconds (median) and whether the outputs
are the same.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_meta import ROOT, result_header, round_order, write_result

from fastvocab.kernels import int8

PYTHON = "python"
SCRIPT = "torchscript"


def _python_calls():
    """The op called from Python, as before: the overload itself, one call a packed set."""
    op = torch.ops.quantized.linear_dynamic.default
    return (lambda x, p: op(x, p, True)), (lambda x, ps: [op(x, p, True) for p in ps])


def _use(way: str) -> None:
    calls = _python_calls() if way == PYTHON else _COMPILED
    int8._fbgemm_calls = lambda: calls


_COMPILED = int8._fbgemm_calls()


def _per_call(fn, calls: int, repeats: int) -> float:
    for _ in range(calls // 4):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - t0) / calls * 1e6)
    return round(statistics.median(times), 2)


def bench_calls(dims: list[int], columns: list[int], rows: list[int], calls: int, repeats: int) -> list[dict]:
    out = []
    gen = torch.Generator().manual_seed(0)
    for d in dims:
        for n in columns:
            lin = int8.int8_linear(torch.randn(n, d, generator=gen) * d**-0.5, torch.randn(n, generator=gen))
            packed = int8.packed_of(lin)
            blocks = [packed, int8.packed_of(lin), int8.packed_of(lin)]
            for r in rows:
                x = torch.randn(r, d, generator=gen)
                row = {"d": d, "columns": n, "rows": r}
                for way in (PYTHON, SCRIPT):
                    _use(way)
                    one = functools.partial(int8.linear_packed, x, packed)
                    row[f"one_{way}_us"] = _per_call(one, calls, repeats)
                    three = functools.partial(int8.linear_packed_many, x, blocks)
                    row[f"three_blocks_{way}_us"] = _per_call(three, calls, repeats)
                row["one_ratio"] = round(row[f"one_{PYTHON}_us"] / row[f"one_{SCRIPT}_us"], 2)
                row["three_blocks_ratio"] = round(
                    row[f"three_blocks_{PYTHON}_us"] / row[f"three_blocks_{SCRIPT}_us"], 2
                )
                print(row, flush=True)
                out.append(row)
    return out


_FIRST_CALL = """
import time, torch
from fastvocab.kernels import int8
packed = int8.packed_of(int8.int8_linear(torch.randn(300, 256), None))
x = torch.randn(4, 256)
op = torch.ops.quantized.linear_dynamic.default
t0 = time.perf_counter()
op(x, packed.fbgemm, True) if WAY == "python" else int8.linear_packed(x, packed)
print((time.perf_counter() - t0) * 1e3)
"""


def bench_first_call(repeats: int) -> dict[str, list[float]]:
    """Milliseconds of a fresh process's first int8 call (4 x 256 x 300), each way: what a worker pays once
    (for TorchScript: compiling the function and its first run)."""
    out: dict[str, list[float]] = {PYTHON: [], SCRIPT: []}
    for _ in range(repeats):
        for way in out:
            code = _FIRST_CALL.replace("WAY", repr(way))
            text = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
            out[way].append(round(float(text.stdout.split()[-1]), 2))
    print({"first_call_ms": out}, flush=True)
    return out


def bench_translate(args) -> list[dict]:
    from fastvocab.artifacts_schema.corpus import read_direction
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.experiments.bench_methods import shortlist_folder
    from fastvocab.tasks.projections import clustered_options, make_projection
    from fastvocab.tasks.translate import SearchSettings, translate

    lines = read_direction(args.corpus, "en", "it", "test")[1][: args.n]
    exact = Seq2SeqAdapter.load(args.model)
    rows = []
    for system in args.systems.split(","):
        engine, beam, batch = system.split(":")
        adapter = Seq2SeqAdapter.load(args.model, engine=engine)
        adapter.quantize_int8()
        proj = make_projection(
            exact, "clustered", int8=True, cluster_map=args.maps / "en-it",
            shortlist=shortlist_folder(args.maps, "en-it"),
            **clustered_options("union", "auto", False, int(beam), None, True),
        )  # fmt: skip
        settings = SearchSettings(beam=int(beam), batch_size=int(batch))
        seconds: dict[str, list[float]] = {PYTHON: [], SCRIPT: []}
        outputs: dict[str, list[str]] = {}
        for i in range(args.rounds + 1):  # the first round warms both up, untimed
            for way in round_order([PYTHON, SCRIPT], i):
                _use(way)
                r = translate(adapter, proj, lines, "en", "it", settings, workers=1, progress=False)
                if i:
                    seconds[way].append(round(r.seconds, 3))
                outputs[way] = r.hypotheses
        med = {way: statistics.median(s) for way, s in seconds.items()}
        row = {
            "engine": engine,
            "beam": int(beam),
            "batch": int(batch),
            "lines": len(lines),
            "seconds": seconds,
            f"{PYTHON}_median_s": med[PYTHON],
            f"{SCRIPT}_median_s": med[SCRIPT],
            "speedup": round(med[PYTHON] / med[SCRIPT], 3),
            "same_outputs": outputs[PYTHON] == outputs[SCRIPT],
        }
        print(row, flush=True)
        rows.append(row)
    _use(SCRIPT)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for flag, default in [("model", "models/demo"), ("corpus", "data/corpus"), ("maps", "models/demo-maps")]:
        p.add_argument(f"--{flag}", type=Path, default=ROOT / default)
    systems = "onnx:1:1,onnx:4:1,static:4:1,onnx:4:32"
    p.add_argument("--systems", default=systems, help="engine:beam:batch,... (default: %(default)s)")
    p.add_argument("--n", type=int, default=100, help="test lines to translate (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="timed rounds of each way (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="small sizes and 8 lines: a smoke run")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.n, args.rounds, args.systems = 8, 1, "onnx:4:1"
        sizes = dict(dims=[256], columns=[300], rows=[4], calls=50, repeats=2)
    else:
        sizes = dict(dims=[256, 1024], columns=[300, 2000], rows=[1, 4, 32], calls=500, repeats=5)
    calls = bench_calls(**sizes)
    first = bench_first_call(1 if args.quick else 3)
    result = {**result_header("int8-calls"), "threads": 1, **{k: v for k, v in sizes.items()}}
    result.update(calls=calls, first_call_ms=first, translate=bench_translate(args), model=str(args.model))
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
