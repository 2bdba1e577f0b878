"""Whether ``fastvocab translate`` writes the same bytes at two commits, run by run.

    python benchmarks/check_identical.py --out /tmp/base.json                  # at the first commit
    python benchmarks/check_identical.py --out /tmp/now.json --against /tmp/base.json \\
        --record benchmarks/results/identical-outputs-DATE.json                # at the second

What it runs and compares: ``benchmarks/harnesses.md#check_identicalpy``.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import itertools
import json
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
from bench_meta import ROOT, cpu_name, git_commit, write_result

from fastvocab.pipeline.cli import main

DIRECTIONS = {"en-it": ("en-it", "text1"), "it-en": ("en-it", "text2"), "en-fr": ("en-fr", "text1")}
MAX_CHARS = 400  # longer test lines may pass --max-input-tokens: an error, not a translation
METHODS, DTYPES, BEAMS = ("full", "clustered"), ("float32", "int8"), (1, 4)


def run_all(lines: int, tmp: Path) -> dict[str, str]:
    """``direction/method/dtype/beam`` -> sha256 of the output text file."""
    digests = {}
    for direction, (pair, column) in DIRECTIONS.items():
        texts = pq.read_table(ROOT / f"data/corpus/{pair}/test.parquet", columns=[column])[column]
        source = tmp / f"{direction}.txt"
        short = [t for t in texts.to_pylist() if len(t) <= MAX_CHARS][:lines]
        source.write_text("".join(f"{t}\n" for t in short))
        src, _, tgt = direction.partition("-")
        for method, dtype, beam in itertools.product(METHODS, DTYPES, BEAMS):
            key = f"{direction}/{method}/{dtype}/beam{beam}"
            out = tmp / (key.replace("/", "_") + ".txt")
            argv = ["translate", "--model", str(ROOT / "models/demo"), "--src-lang", src, "--tgt-lang", tgt]
            argv += ["-i", str(source), "-o", str(out), "--dtype", dtype, "--beam", str(beam)]
            argv += ["--no-progress"]
            if method == "clustered":
                argv += ["--clusters", str(ROOT / "models/demo-maps")]
            with contextlib.redirect_stderr(io.StringIO()) as err:
                code = main(argv)
            if code != 0:
                raise SystemExit(f"{key}: exit {code}: {err.getvalue().strip()}")
            digests[key] = hashlib.sha256(out.read_bytes()).hexdigest()
            print(key, digests[key][:16], flush=True)
    return digests


def main_(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lines", type=int, default=40, help="test lines a direction (default: %(default)s)")
    p.add_argument("--out", type=Path, required=True, help="this commit's digests (JSON)")
    p.add_argument("--against", type=Path, help="another commit's digests (--out of an earlier run)")
    p.add_argument("--record", type=Path, help="with --against: both commits' digests, compared")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        digests = run_all(args.lines, Path(tmp))
    now = {"commit": git_commit(), "cpu": cpu_name(), "lines": args.lines, "digests": digests}
    write_result(args.out, now)
    if args.against is None:
        return
    base = json.loads(args.against.read_text())
    runs = [
        {"run": k, "base": base["digests"].get(k), "now": v, "identical": base["digests"].get(k) == v}
        for k, v in digests.items()
    ]
    record = {
        "benchmark": "fastvocab translate outputs at two commits, byte for byte (sha256 of each output)",
        "base_commit": base["commit"], "commit": now["commit"],
        "cpu": {"base": base["cpu"], "now": now["cpu"]},
        "lines": args.lines, "identical": all(r["identical"] for r in runs), "runs": runs,
    }  # fmt: skip
    write_result(args.record, record)
    differ = [r["run"] for r in runs if not r["identical"]]
    print("identical" if record["identical"] else f"different: {', '.join(differ)}")


if __name__ == "__main__":
    main_()
