"""Fidelity yardstick: how far clustered decoding is from full softmax, per search setting.

    .venv/bin/python benchmarks/bench_fidelity.py               # quick: 50 sentences, beam 1 and 4, batch 32
    .venv/bin/python benchmarks/bench_fidelity.py --grid full   # beam 1, 2, 4, 5 x batch 1, 32
    .venv/bin/python benchmarks/bench_fidelity.py --beams 1,4 --batches 1,32 --sentences 300

The measuring is ``fastvocab.experiments.fidelity`` (what each field means is in its docstring), shared with
``fastvocab bench fidelity``; this script adds the commit and the CPU's name to the record and writes
``benchmarks/results/fidelity-<device>-<date>[-<tag>].json``.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

from bench_meta import device_name

from fastvocab.artifacts_schema.provenance import git_commit
from fastvocab.pipeline.commands.bench import fidelity_parser, run_fidelity_command

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ap = fidelity_parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tag", default="", help="suffix of the results file name")
    ap.set_defaults(
        model=ROOT / "models/demo", maps=ROOT / "runs/demo/maps", corpus=ROOT / "data/corpus", threads=2
    )
    args = ap.parse_args(argv)
    if args.output is None:
        device = "cpu" if args.device == "cpu" else "gpu"
        tag = f"-{args.tag}" if args.tag else ""
        args.output = RESULTS / f"fidelity-{device}-{dt.date.today().isoformat()}{tag}.json"
    command = " ".join([".venv/bin/python", "benchmarks/bench_fidelity.py", *argv])
    commit = git_commit("kernels", "decoding", "tasks", cwd=ROOT)
    return run_fidelity_command(args, command, lambda: {"commit": commit, "device": device_name(args.device)})


if __name__ == "__main__":
    sys.exit(main())
