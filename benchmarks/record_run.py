"""Record a logged pipeline run's cost as a benchmark result: per stage and direction (or map), its status,
message and metrics, read from the MLflow store the run logged to.

    python benchmarks/record_run.py RUN_ID --tracking-uri sqlite:///runs/demo-maps/mlflow.db \
        --out benchmarks/results/build-cpu-<date>.json

Several RUN_IDs (a build made in several runs, e.g. the dump, then the rest) go into one record, in order.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from bench_meta import cpu_name, git_commit, write_result

from fastvocab.pipeline.report_store import collect, open_client


def _seconds(run) -> float | None:
    if run.start_ms is None or run.end_ms is None:
        return None
    return round((run.end_ms - run.start_ms) / 1000, 1)


def stage_rows(data) -> list[dict]:
    return [
        {
            "name": child.name,
            "tags": {k: v for k, v in child.tags.items() if k.startswith("fastvocab.")},
            "metrics": dict(sorted(child.metrics.items())),
            "seconds": _seconds(child),
        }
        for child in data.descendants
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_ids", nargs="+", metavar="RUN_ID")
    p.add_argument("--tracking-uri", required=True)
    p.add_argument("--note", default="", help="what the runs built, for the record")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    client = open_client(args.tracking_uri)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for run_id in args.run_ids:
            data = collect(client, run_id, args.tracking_uri, Path(tmp))
            runs.append(
                {
                    "run_id": run_id,
                    "name": data.root.name,
                    "seconds": _seconds(data.root),
                    "params": data.root.params,
                    "stages": stage_rows(data),
                }
            )
    write_result(
        args.out,
        {
            "benchmark": "pipeline-run",
            "meta": {
                "device": cpu_name(),
                "cpu_count": os.cpu_count(),
                "commit": git_commit(),
                "note": args.note,
            },
            "runs": runs,
            "seconds_total": round(sum(r["seconds"] or 0 for r in runs), 1),
        },
    )


if __name__ == "__main__":
    main()
