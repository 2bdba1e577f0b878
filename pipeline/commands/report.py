"""``fastvocab report RUN_ID``: a self-contained HTML page of a pipeline or experiment run logged to MLflow
(tables, embedded figures), readable without the MLflow UI (see pipeline/report.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastvocab.pipeline.commands import add_output

HELP = "write a self-contained HTML report (tables, embedded figures) of an MLflow run"
DEFAULT_WORK_DIR = Path("runs/demo")  # RunConfig.work_dir's default: where `fastvocab run` logs by default


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = (
        "Write a self-contained HTML report of an MLflow run and its child runs: status, times, git commit "
        "and fastvocab version, a table of every child run, metrics and parameters per stage and direction, "
        "PNG figures embedded, CSV and Markdown tables as tables, JSON artifacts. The store is only read. "
        "Store: --tracking-uri, else --work-dir's mlflow.db, else $MLFLOW_TRACKING_URI, else the default "
        f"store of `fastvocab run` with the default config, sqlite:///{DEFAULT_WORK_DIR}/mlflow.db."
    )
    p.add_argument(
        "run_id",
        metavar="RUN_ID",
        help="MLflow run id (printed by `fastvocab run`; a parent run's report holds all its child runs), "
        "or 'latest': the most recently started top-level run of the store",
    )
    add_output(p, "HTML file to write (atomically) (default: report-<RUN_ID>.html in the current folder)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        metavar="URI",
        help="MLflow store: sqlite:///FILE, http(s)://HOST:PORT, file:DIR (default: above)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the run's work dir (the config's work_dir): read the store `fastvocab run` logged there, "
        "DIR/mlflow.db",
    )


def run(args: argparse.Namespace) -> int:
    from fastvocab.pipeline.report import write_report
    from fastvocab.pipeline.tracking import DB_FILE, tracking_uri

    if args.tracking_uri:
        uri = args.tracking_uri
    elif args.work_dir is not None:  # named explicitly: its own store, whatever $MLFLOW_TRACKING_URI says
        uri = f"sqlite:///{(args.work_dir / DB_FILE).resolve()}"
    else:
        uri = tracking_uri(DEFAULT_WORK_DIR)
    path, data = write_report(args.run_id, args.output, uri)
    n_images = sum(a.kind == "image" for r in [data.root, *data.descendants] for a in r.artifacts)
    print(
        f"report of run {data.root.run_id} ({data.root.name}, {len(data.descendants)} child runs, "
        f"{n_images} figures): {path} ({path.stat().st_size / 1024:.0f} KB)"
    )
    return 0
