"""``fastvocab run CONFIG``: the whole pipeline for the configured directions (see pipeline/run.py)."""

from __future__ import annotations

import argparse

import yaml

from fastvocab.pipeline.commands import add_examples, add_mlflow_options
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.stages import STAGES

EXAMPLES = """\
examples:
  fastvocab run configs/demo.yaml
  fastvocab run configs/demo.yaml --no-mlflow --no-progress
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_examples(parser, EXAMPLES)
    parser.add_argument("config", metavar="CONFIG", help="run config (YAML), e.g. configs/demo.yaml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config key (dotted, e.g. kmeans.r=500; value parsed as YAML); repeatable",
    )
    parser.add_argument(
        "--stages",
        default=None,
        metavar="STAGE,...",
        help=f"comma-separated stages to run, of {','.join(STAGES)} (default: all)",
    )
    parser.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="Ray cluster to attach to ('auto', 'ray://host:10001') (default: the config's, else local Ray; "
        "under `ray job submit` the job's cluster)",
    )
    add_mlflow_options(parser, "the default store <work_dir>/mlflow.db", None)
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def parse_overrides(items: list[str]) -> dict[str, object]:
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as exc:
            raise UserError(f"--set {item!r}: value is not valid YAML ({exc})") from exc
    return out


def load_run_config(args: argparse.Namespace):
    """The config file with --set, --tracking-uri (its mlflow_tracking_uri) and --experiment-name (its
    mlflow_experiment) on top."""
    from fastvocab.pipeline.config import load_config

    overrides = parse_overrides(args.overrides)
    if args.tracking_uri:
        overrides["mlflow_tracking_uri"] = args.tracking_uri
    if args.experiment_name:
        overrides["mlflow_experiment"] = args.experiment_name
    return load_config(args.config, overrides)


def run(args: argparse.Namespace) -> int:
    from fastvocab.pipeline.run import parse_stages, run_pipeline
    from fastvocab.pipeline.tracking import NullTracker

    cfg = load_run_config(args)
    stages = parse_stages(args.stages)
    result = run_pipeline(
        cfg,
        stages=stages,
        ray_address=args.ray_address,
        tracker=NullTracker() if args.no_mlflow else None,
        progress=not args.no_progress,
    )
    print(result.summary())
    ran = sum(r.status == "ran" for r in result.records)
    skipped = sum(r.status == "skipped" for r in result.records)
    print(f"{ran} ran, {skipped} skipped in {result.seconds:.1f} s; work dir {cfg.work_dir}")
    if result.parent_run_id:
        print(f"MLflow run {result.parent_run_id} in {result.tracking_uri}")
    return 0
