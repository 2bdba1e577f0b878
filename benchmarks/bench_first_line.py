"""A newcomer's first line: ``echo LINE | fastvocab translate --src-lang en --tgt-lang it`` as a fresh
process, N times, wall time and its parts (how each is read: ``benchmarks/harnesses.md#bench_first_linepy``).

    python benchmarks/bench_first_line.py                       # 3 runs, the demo model
    python benchmarks/bench_first_line.py --runs 5 --out benchmarks/results/first-line-cpu-DATE.json
    python benchmarks/bench_first_line.py --engine onnx --dtype int8 --cold-cache
    python benchmarks/bench_first_line.py --dtype int8 --clusters models/demo-maps   # the clustered set-up
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_meta import ROOT, bulk_phases, result_header, write_result

JOB = re.compile(r"parts translated in ([0-9.]+) s")
RAN_ON = re.compile(r", engine (\w+), ")  # the summary line names the engine "auto" picked
EXPORT = re.compile(r"engine onnx: exported the \w+ graph to \S+/(\S+) in ([0-9.]+) s")


def one_run(
    line: str, model: Path, engine: str = "auto", dtype: str = "float32", env: dict[str, str] | None = None,
    clusters: Path | None = None,
) -> dict[str, object]:  # fmt: skip
    """One fresh process translating ``line``: its wall time, the job's phases and the rest."""
    argv = [sys.executable, "-m", "fastvocab.pipeline.cli", "-v", "translate"]
    argv += ["--model", str(model), "--src-lang", "en", "--tgt-lang", "it", "--no-progress"]
    argv += ["--engine", engine, "--dtype", dtype]
    if clusters is not None:  # the fast path: the map and its shortlist tables load too
        argv += ["--clusters", str(clusters)]
    load = os.getloadavg()
    t0 = time.perf_counter()
    done = subprocess.run(
        argv, input=line + "\n", capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}
    )
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"fastvocab translate failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    phases = bulk_phases(done.stderr)
    job = JOB.search(done.stderr)
    job_seconds = float(job.group(1)) if job else sum(phases.values())
    return {
        "wall_s": round(wall, 3),
        "startup_and_exit_s": round(wall - job_seconds, 3),  # interpreter, imports, parsing, exit
        "load_s": round(phases.get("setup", 0.0) + phases.get("plan", 0.0), 3),
        "translate_s": round(phases.get("translate", 0.0), 3),
        "assemble_s": round(phases.get("assemble", 0.0), 3), "job_s": round(job_seconds, 3),
        "engine": found.group(1) if (found := RAN_ON.search(done.stderr)) else None,
        "exports_s": {name: float(sec) for name, sec in EXPORT.findall(done.stderr)},  # by file; a cold cache
        "load_avg_before": [round(x, 2) for x in load], "output": done.stdout.strip(),
    }  # fmt: skip


def import_seconds() -> float:
    """Wall time of a process that imports what the local translate path imports, and nothing else."""
    code = "import fastvocab.pipeline.commands.translate, fastvocab.pipeline.bulk_driver, torch"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, metavar="N", help="runs measured (default: %(default)s)")
    p.add_argument("--line", default="Free software for everyone.", help="the line (default: %(default)s)")
    p.add_argument(
        "--model", type=Path, default=ROOT / "models" / "demo", help="model folder (default: the demo model)"
    )
    p.add_argument("--engine", default="auto", help="translate's --engine (default: %(default)s)")
    p.add_argument("--dtype", default="float32", help="translate's --dtype (default: %(default)s)")
    p.add_argument(
        "--clusters", type=Path,
        help="translate's --clusters: time the clustered set-up (model, map and the tables beside it)",
    )  # fmt: skip
    p.add_argument(
        "--cold-cache", action="store_true",
        help="the first (uncounted) run starts from an empty cache folder: the engine's exports, the "
        "model's fingerprint",
    )  # fmt: skip
    p.add_argument(
        "--out", type=Path, help="result JSON (default: benchmarks/results/first-line-cpu-DATE.json)"
    )
    args = p.parse_args()
    out = args.out or ROOT / "benchmarks" / "results" / f"first-line-cpu-{dt.date.today().isoformat()}.json"
    with tempfile.TemporaryDirectory(prefix="fastvocab-cache-") as cache:
        env = {"FASTVOCAB_CACHE_DIR": cache} if args.cold_cache else None
        run = functools.partial(one_run, args.line, args.model, args.engine, args.dtype, env, args.clusters)
        warmup, runs = run(), [run() for _ in range(args.runs)]
    imports = [round(import_seconds(), 3) for _ in range(args.runs)]
    keys = ("wall_s", "startup_and_exit_s", "load_s", "translate_s", "job_s")
    m = {k: round(statistics.median(float(r[k]) for r in runs), 3) for k in keys}  # type: ignore[arg-type]
    result = {
        **result_header("first-line"), "cores": os.cpu_count(),
        "model": str(args.model.relative_to(ROOT) if args.model.is_relative_to(ROOT) else args.model),
        "line": args.line, "engine": args.engine,
        "engine_run": runs[0]["engine"],  # what --engine auto picked
        "dtype": args.dtype, "clusters": None if args.clusters is None else str(args.clusters),
        "cold_cache": args.cold_cache, "runs": args.runs, "median": m,
        "import_only_s": {"median": round(statistics.median(imports), 3), "runs": imports}, "warmup": warmup,
        "each": runs,
    }  # fmt: skip
    if args.cold_cache:  # what the first run paid beyond a later one
        result["first_run_extra_s"] = round(float(warmup["wall_s"]) - m["wall_s"], 3)
    print(
        f"first line: wall {m['wall_s']:.2f} s median of {args.runs} "
        f"(startup and exit {m['startup_and_exit_s']:.2f}, "
        f"load {m['load_s']:.2f}, translating {m['translate_s']:.2f}); load average {os.getloadavg()[0]:.2f}"
    )
    write_result(out, result)


if __name__ == "__main__":
    main()
