"""A self-contained HTML report of one MLflow run and its descendants (``fastvocab report RUN_ID``).

Works for a pipeline run (a parent run with one child run per stage and direction, pipeline/tracking.py) and
for an experiment run (a parent with one child per table or figure). The page needs nothing but itself: PNG
figures are embedded as ``data:`` URIs, CSV and Markdown tables become HTML tables, JSON and text artifacts
are shown in collapsed blocks, and there is no external CSS, JavaScript or font. Every string from the store
is escaped by the template (``report_template.html``, package data; Jinja2 autoescape; Jinja2 comes with
MLflow's server dependencies). What it reads: ``report_store``; the artifacts as shown: ``report_artifacts``;
the tables: ``report_tables``.
"""

from __future__ import annotations

import os
import tempfile
from importlib.resources import files
from pathlib import Path

from fastvocab import __version__
from fastvocab.artifacts_schema.atomic import write_text_atomic
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.extras import needed
from fastvocab.pipeline.report_artifacts import fmt_size
from fastvocab.pipeline.report_store import ReportData, collect, open_client
from fastvocab.pipeline.report_tables import (
    groups,
    header_table,
    history_figure,
    key_value_table,
    overview_table,
)

TEMPLATE = "report_template.html"  # beside this module, shipped in the wheel as package data


def template_text() -> str:
    """The page's Jinja2 template, read from the installed package."""
    return files("fastvocab.pipeline").joinpath(TEMPLATE).read_text(encoding="utf-8")


def render(data: ReportData) -> str:
    """The page of what was read: the template filled with its tables and figures."""
    with needed():
        import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.globals["size"] = fmt_size
    template = env.from_string(template_text())
    root = data.root
    return template.render(
        version=__version__,
        root=root,
        experiment=data.experiment,
        descendants=data.descendants,
        header=header_table(data),
        root_metrics=key_value_table(sorted(root.metrics.items())),
        root_params=key_value_table(sorted(root.params.items())),
        root_history=history_figure([root], f"{root.name}: metrics by step"),
        overview=overview_table(data.descendants),
        groups=groups(data.descendants),
        generated=data.generated.strftime("%Y-%m-%d %H:%M:%S UTC"),
        tracking_uri=data.tracking_uri,
    )


def _check_out(path: Path) -> None:
    if path.is_dir():
        raise UserError(f"-o {path}: is a folder")
    folder = next((p for p in (path.parent, *path.parent.parents) if p.exists()), Path("."))
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise UserError(f"-o {path}: cannot write in {folder}")


def write_report(run_id: str, out: Path | None, uri: str) -> tuple[Path, ReportData]:
    """Render the report of ``run_id`` (or ``latest``) in the store at ``uri`` and write it atomically to
    ``out`` (default ``report-<run id>.html``). Returns the path and what was read."""
    if out is not None:
        _check_out(Path(out))  # before reading the store, which can take a while
    client = open_client(uri)
    with tempfile.TemporaryDirectory(prefix="fastvocab-report-") as tmp:
        data = collect(client, run_id, uri, Path(tmp))
    html = render(data)
    path = Path(out) if out is not None else Path(f"report-{data.root.run_id}.html")
    _check_out(path)
    write_text_atomic(path, html)
    return path, data
