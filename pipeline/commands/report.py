"""``fastvocab report RUN_ID``: a self-contained HTML page of a pipeline or experiment run logged to MLflow
(tables, embedded figures), readable without the MLflow UI (see pipeline/report.py)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fastvocab.pipeline.commands import STORE_DEFAULT, add_examples, add_output

HELP = "write a self-contained HTML report (tables, embedded figures) of an MLflow run"

EXAMPLES = """\
examples:
  fastvocab report latest -o report.html
  fastvocab report latest --work-dir runs/demo -o report.html
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_examples(p, EXAMPLES)
    p.description = (
        "Write a self-contained HTML report of an MLflow run and its child runs: status, times, git commit "
        "and fastvocab version, a table of every child run, metrics and parameters per stage and direction, "
        "PNG figures embedded, CSV and Markdown tables as tables, JSON artifacts. The store is only read. "
        "Store: the one every command logs to, --tracking-uri, else $MLFLOW_TRACKING_URI, else the default "
        "store <--work-dir>/mlflow.db (runs/demo/mlflow.db, where `fastvocab run configs/demo.yaml` logs)."
    )
    p.add_argument(
        "run_id",
        metavar="RUN_ID",
        help="MLflow run id (printed by `fastvocab run`; a parent run's report holds all its child runs), "
        "or 'latest': the most recently started pipeline run (`fastvocab run`) of the store, else, when it "
        "has none, its most recently started run; which run it took and why is printed, with a newer run of "
        "another kind (tune, translate, ...) and its id",
    )
    add_output(p, "HTML file to write (atomically) (default: report-<RUN_ID>.html in the current folder)")
    p.add_argument(
        "--tracking-uri",
        default=None,
        metavar="URI",
        help="MLflow store: sqlite:///FILE, http(s)://HOST:PORT, file:DIR "
        f"(default: {STORE_DEFAULT} the default store <--work-dir>/mlflow.db)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the run's work dir (the config's work_dir): its default store, DIR/mlflow.db "
        "(default: runs/demo)",
    )


def run(args: argparse.Namespace) -> int:
    from fastvocab.pipeline.extras import require

    # the store is read through MLflow, the page rendered with Jinja2, a metric's series plotted
    require("the report", "mlflow", "jinja2", "matplotlib")
    from fastvocab.pipeline.report import write_report
    from fastvocab.pipeline.tracking import resolve_store

    path, data = write_report(args.run_id, args.output, resolve_store(args.tracking_uri, args.work_dir).uri)
    if data.chosen:
        print(data.chosen, file=sys.stderr)
    n_images = sum(a.kind == "image" for r in [data.root, *data.descendants] for a in r.artifacts)
    print(
        f"report of run {data.root.run_id} ({data.root.name}, {len(data.descendants)} child runs, "
        f"{n_images} figures): {path} ({path.stat().st_size / 1024:.0f} KB)"
    )
    return 0
