"""Scale (issue 11, item 6): corpus ingestion of generated files of millions of lines in bounded memory.

    .venv/bin/python benchmarks/bench_scale.py --lines 2000000,20000000
    .venv/bin/python benchmarks/bench_scale.py --lines 0 --translate 2000,8000 --tag translate

With ``--translate``, ``fastvocab translate`` (demo model, full softmax, greedy, ``--max-len 32``,
``--chunk-lines 1000``, 1 thread) runs on text files of that many lines (the en-it test split of
``data/corpus`` repeated), recording peak RSS and lines/s: memory is flat in the line count when the input
streams in chunks.

For each size it generates a monolingual text file and a parallel TSV file of that many lines (synthetic
sentences over a 5,000-word vocabulary, ~2% repeated lines, 1% empty lines in the monolingual file), then
runs, each in a fresh process, ``fastvocab corpus --mono`` and ``fastvocab corpus --from-tsv`` and records
the wall time, lines/s and peak RSS (``ru_maxrss`` of the child). Bounded memory means the peak grows with
the line count only by the de-duplication index (about 9 bytes a line for --mono, 17 for --from-tsv, plus
``np.unique``'s sort), never by the text. Writes ``benchmarks/results/scale-<date>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_meta import cpu_name, git_commit

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
FASTVOCAB = Path(sys.executable).parent / "fastvocab"


def generate(path: Path, lines: int, *, parallel: bool, seed: int = 0) -> None:
    """Synthetic sentences written in blocks (the generator's own memory stays small)."""
    rng = np.random.default_rng(seed)
    words = np.array([f"w{i}" for i in range(5000)])
    block = 200_000
    with path.open("w", encoding="utf-8") as f:
        for start in range(0, lines, block):
            n = min(block, lines - start)
            lengths = rng.integers(4, 16, size=n)
            ids = rng.integers(0, len(words), size=int(lengths.sum()))
            cuts = np.cumsum(lengths)[:-1]
            sents = [" ".join(s) for s in np.split(words[ids], cuts)]
            repeat = rng.random(n) < 0.02  # a repeated line: the previous one again
            for i in np.flatnonzero(repeat[1:]) + 1:
                sents[i] = sents[i - 1]
            if parallel:
                out = [f"{s}\tT {s}" for s in sents]
            else:
                empty = rng.random(n) < 0.01
                out = ["" if e else s for s, e in zip(sents, empty, strict=True)]
            f.write("\n".join(out) + "\n")


def run_child(argv: list[str]) -> dict[str, float]:
    """Run a command to completion: its wall time and its own peak RSS (``wait4`` reports that child's)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv)} failed:\n{proc.stderr.read().decode() if proc.stderr else ''}")
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1)}


def translate_rows(sizes: list[int], workdir: str | None) -> list[dict]:
    from fastvocab.artifacts_schema.corpus import read_direction

    _, sources, _ = read_direction(ROOT / "data" / "corpus", "en", "it", "test")
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for n in sizes:
            src = Path(tmp) / f"in-{n}.txt"
            src.write_text("".join(sources[i % len(sources)] + "\n" for i in range(n)), encoding="utf-8")
            out = Path(tmp) / f"out-{n}.txt"
            argv = [str(FASTVOCAB), "translate", "--model", str(ROOT / "models" / "demo"), "--src-lang", "en",
                    "--tgt-lang", "it", "-i", str(src), "-o", str(out), "--max-len", "32",
                    "--chunk-lines", "1000", "--threads", "1", "--no-progress"]  # fmt: skip
            res = run_child(argv)
            row = {
                "command": " ".join(["fastvocab", *argv[1:]])
                .replace(tmp, "$TMP")
                .replace(str(ROOT) + "/", ""),
                "kind": "translate",
                "lines": n,
                **res,
                "lines_per_second": round(n / res["seconds"], 1),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", default="2000000,20000000", help="comma-separated line counts")
    parser.add_argument("--workdir", default=None, help="where the generated files go (default: a temp dir)")
    parser.add_argument("--tag", default="", help="suffix of the result file name")
    parser.add_argument("--translate", default="", help="comma-separated line counts for fastvocab translate")
    args = parser.parse_args()
    sizes = [int(x) for x in args.lines.split(",") if int(x) > 0]
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        tmp = Path(tmp)
        for n in sizes:
            for kind in ("mono", "tsv"):
                src = tmp / f"{kind}-{n}.txt"
                t0 = time.perf_counter()
                generate(src, n, parallel=kind == "tsv")
                gen = time.perf_counter() - t0
                out = tmp / f"corpus-{kind}-{n}"
                if kind == "mono":
                    argv = [str(FASTVOCAB), "corpus", "--out", str(out), "--mono", str(src), "--lang", "it"]
                else:
                    argv = [str(FASTVOCAB), "corpus", "--out", str(out), "--from-tsv", str(src)]
                    argv += ["--src-lang", "de", "--tgt-lang", "fr"]
                res = run_child(argv)
                manifest = json.loads((out / "corpus.json").read_text())
                record = manifest["mono"]["it"] if kind == "mono" else manifest["pairs"]["de-fr"]
                row = {
                    "command": f"fastvocab corpus {' '.join(argv[2:])}".replace(str(tmp), "$TMP"),
                    "kind": kind,
                    "lines": n,
                    "file_mb": round(src.stat().st_size / 2**20, 1),
                    "generate_seconds": round(gen, 1),
                    **res,
                    "lines_per_second": round(n / res["seconds"]),
                    "written": record["count"] if kind == "mono" else record["counts"],
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
                src.unlink()
    if args.translate:
        rows += translate_rows([int(x) for x in args.translate.split(",")], args.workdir)
    meta = {
        "commit": git_commit("tasks", "artifacts_schema", "pipeline"),
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "date": dt.date.today().isoformat(),
        "load_average": os.getloadavg(),
        "command": " ".join([".venv/bin/python", "benchmarks/bench_scale.py", *sys.argv[1:]]),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"scale-{meta['date']}{'-' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
