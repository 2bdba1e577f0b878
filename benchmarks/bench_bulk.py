"""Bulk translation: the cost of distributing (1 Ray worker against the in-process run), 2 workers against 1,
the driver's memory while planning, and the workers-and-hours table for 20M lines from the measured rates.

    .venv/bin/python benchmarks/bench_bulk.py --lines 10000 --rss 100000,1000000

The runs and what it writes: ``benchmarks/harnesses.md#bench_bulkpy``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_meta import RESULTS, ROOT, bulk_phases, cpu_name, git_commit, write_result

FASTVOCAB = Path(sys.executable).parent / "fastvocab"
_WORD_TEXT = (
    "the a library package tool for data file system server client network graphics sound module support "
    "development documentation utility program interface command line editor web font driver kernel image "
    "video audio game player manager plugin extension python perl java database backup shared files "
    "static headers debug symbols transitional dummy metapackage common runtime binary"
)
WORDS = _WORD_TEXT.split()
TARGET_WORKERS = (1, 2, 4, 8, 16, 32, 64, 128)
TARGET_LINES = 20_000_000


def generate_text(path: Path, lines: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = np.array(WORDS)
    block = 100_000
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, lines, block):
            n = min(block, lines - start)
            lengths = rng.integers(3, 12, size=n)
            ids = rng.integers(0, len(words), size=int(lengths.sum()))
            sents = [" ".join(s) for s in np.split(words[ids], np.cumsum(lengths)[:-1])]
            f.write("\n".join(sents) + "\n")


def generate_parquet(text: Path, path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    with pq.ParquetWriter(path, schema) as writer, text.open(encoding="utf-8") as f:
        n = 0  # blocks of 100,000 lines: the text is read as it is written, never held whole
        while block := [line.rstrip("\n") for line in itertools.islice(f, 100_000)]:
            writer.write_table(pa.table({"id": [f"s{n + i}" for i in range(len(block))], "text": block}))
            n += len(block)


def translate(inp: Path, out: Path, args: argparse.Namespace, extra: list[str]) -> dict:
    argv = [str(FASTVOCAB), "-v", "translate", "--model", str(args.model), "--src-lang", "en",
            "--tgt-lang", "it", "-i", str(inp), "-o", str(out), "--max-len", str(args.max_len),
            "--batch-size", "64", "--chunk-lines", str(args.chunk_lines), "--no-progress",
            *extra]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "MLFLOW_TRACKING_URI"}
    env |= {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr[-3000:]}")
    summary = next(line for line in proc.stderr.splitlines() if line.startswith("translated "))
    row: dict = {
        "command": " ".join(["fastvocab", *argv[2:]]).replace(str(inp.parent), "$TMP"),
        "wall_seconds": round(wall, 2), "summary": summary.replace(str(inp.parent), "$TMP"),
        "target_tokens": int(re.search(r"(\d+) target tokens", summary).group(1)),
        "tokens_per_s_reported": float(re.search(r"([\d.]+) tokens/s", summary).group(1)),
    }  # fmt: skip
    if busy := re.search(r"\(([\d.]+) a worker while busy", summary):
        row["tokens_per_s_a_worker_busy"] = float(busy.group(1))
    if phases := bulk_phases(proc.stderr):
        row["phases_s"] = phases
    row["tokens_per_wall_s"] = round(row["target_tokens"] / wall, 1)
    row["lines_per_wall_s"] = round(args.lines / wall, 1)
    return row


# The peak is the child's own VmHWM (bench_meta.peak_rss_mb).
PLAN_CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[3])
from bench_meta import peak_rss_mb as hwm
from fastvocab.tasks.bulk import describe_input, plan_input
before = hwm()
t = time.perf_counter()
inp, ranges = plan_input(describe_input(sys.argv[1]), int(sys.argv[2]))
print(json.dumps({"rows": inp.rows, "parts": len(ranges), "seconds": round(time.perf_counter() - t, 2),
                  "peak_rss_mb_after_imports": before, "peak_rss_mb": hwm()}))
"""


def plan_rss(path: Path, chunk_lines: int) -> dict[str, object]:
    here = str(Path(__file__).resolve().parent)
    argv = [sys.executable, "-c", PLAN_CHILD, str(path), str(chunk_lines), here]
    return json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def translate_runs(tmp: Path, args: argparse.Namespace, rows: list[dict]) -> dict[str, object]:
    """The same generated text in process, on 1 Ray actor and on 2: a row each into ``rows``; what they
    read out (distribution's cost, 2 workers against 1, a worker's rate, hours for 20M lines)."""
    inp = tmp / "in.txt"
    generate_text(inp, args.lines)
    outputs = {}
    for name, extra in (
        ("in-process", ["--threads", "1"]),
        ("ray-1-worker", ["--workers", "1", "--ray-address", "local", "--num-cpus-per-worker", "1"]),
        ("ray-2-workers", ["--workers", "2", "--ray-address", "local", "--num-cpus-per-worker", "1"]),
    ):
        out = tmp / f"out-{name}.txt"
        row = {"kind": name, "lines": args.lines, **translate(inp, out, args, extra)}
        outputs[name] = out.read_bytes()
        rows.append(row)
        print(json.dumps(row), flush=True)
    base, one, two = rows[0], rows[1], rows[2]
    # a worker's steady rate: its lines over its busy seconds (tokens/s busy -> lines/s)
    worker_rate = one["tokens_per_s_a_worker_busy"] * args.lines / one["target_tokens"]
    tokens_per_wall_s = two["tokens_per_wall_s"] / one["tokens_per_wall_s"]
    translate_phase = one["phases_s"]["translate"] / two["phases_s"]["translate"]
    hours = {str(n): round(TARGET_LINES / (n * worker_rate) / 3600, 2) for n in TARGET_WORKERS}
    return {
        "outputs_identical": len(set(outputs.values())) == 1,
        "ray_1_worker_over_in_process_wall": round(one["wall_seconds"] / base["wall_seconds"], 3),
        "ray_2_workers_over_1_tokens_per_wall_s": round(tokens_per_wall_s, 3),
        "ray_2_workers_over_1_translate_phase": round(translate_phase, 3),
        "lines_per_s_a_worker_busy": round(worker_rate, 1),
        "lines_per_s_in_process_decoding": float(re.search(r"([\d.]+) sentences/s", base["summary"])[1]),
        "hours_for_20m_lines": hours,
    }


def plan_rows(tmp: Path, n: int) -> list[dict[str, object]]:
    """The driver's planning of ``n`` generated lines, as text and as Parquet, each in a fresh process."""
    text, pq_path = tmp / f"rss-{n}.txt", tmp / f"rss-{n}.parquet"
    generate_text(text, n, seed=1)
    generate_parquet(text, pq_path)
    rows = []
    for kind, path in (("plan-text", text), ("plan-parquet", pq_path)):
        rows.append({"kind": kind, "lines": n, "chunk_lines": 10_000, **plan_rss(path, 10_000)})
        print(json.dumps(rows[-1]), flush=True)
    text.unlink()
    pq_path.unlink()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lines", type=int, default=10_000, help="lines translated (default: 10000)")
    ap.add_argument("--max-len", type=int, default=8, help="max target tokens (default: 8)")
    ap.add_argument("--chunk-lines", type=int, default=1000, help="lines a part (default: 1000)")
    ap.add_argument("--model", type=Path, default=ROOT / "models" / "demo")
    ap.add_argument("--rss", default="", help="input sizes for the planning RSS, e.g. 100000,1000000")
    ap.add_argument("--skip-translate", action="store_true")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    meta: dict[str, object] = {
        "commit": git_commit(cwd=ROOT), "cpu": cpu_name(), "cores": os.cpu_count(),
        "date": dt.date.today().isoformat(), "load_average_start": list(os.getloadavg()),
        "command": " ".join(["benchmarks/bench_bulk.py", *sys.argv[1:]]),
    }  # fmt: skip
    record: dict[str, object] = {"meta": meta, "rows": rows}
    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.skip_translate:
            record["read_out"] = translate_runs(tmp, args, rows)
            print(json.dumps(record["read_out"]), flush=True)
        for n in [int(x) for x in args.rss.split(",") if x.strip()]:
            rows += plan_rows(tmp, n)
    meta["load_average_end"] = list(os.getloadavg())
    tag = f"-{args.tag}" if args.tag else ""
    write_result(RESULTS / f"bulk-cpu-{dt.date.today().isoformat()}{tag}.json", record)


if __name__ == "__main__":
    main()
