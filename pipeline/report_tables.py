"""The report's tables and figures, built from the runs read (``report_store``): the header, the child
runs' overview, and per stage their metrics, parameters and metric series."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from fastvocab.pipeline.extras import needed
from fastvocab.pipeline.report_artifacts import Cell, Table, number_cell
from fastvocab.pipeline.report_store import ReportData, RunInfo

METRIC_COLUMNS = 10
# Tags shown in the report's header, in this order; the rest of the non-``mlflow.`` tags follow.
HEADER_TAGS = {
    "fastvocab.kind": "kind",
    "fastvocab.version": "fastvocab version",
    "fastvocab.commit": "git commit",
    "fastvocab.stages": "stages run",
    "fastvocab.stages_skipped": "stages skipped (nothing to do)",
    "fastvocab.stage_failed": "stage failed",
    "fastvocab.stages_selected": "stages selected",
    "fastvocab.work_dir": "work dir",
    "fastvocab.all_skipped": "all stages skipped",
}


def fmt_time(ms: int | None) -> str:
    if not ms:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_duration(start_ms: int | None, end_ms: int | None) -> str:
    if not start_ms or not end_ms:
        return ""
    s = max(0.0, (end_ms - start_ms) / 1000)
    if s < 60:
        return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"
    m, s = divmod(round(s), 60)
    if m < 60:
        return f"{m} min {s} s"
    h, m = divmod(m, 60)
    return f"{h} h {m} min"


def key_value_table(items: Iterable[tuple[str, object]]) -> Table:
    rows = []
    for key, value in items:
        cell = number_cell(value) if isinstance(value, float) else Cell(str(value))
        rows.append([Cell(key), cell])
    return Table(["name", "value"], rows)


def metrics_by_run(runs: list[RunInfo]) -> list[Table]:
    """One row per run, one column per metric (latest value); many metrics are split over several tables of
    at most ``METRIC_COLUMNS`` columns, so that a page fits the screen's width."""
    keys = sorted({k for r in runs for k in r.metrics})
    tables = []
    for i in range(0, len(keys), METRIC_COLUMNS):
        part = keys[i : i + METRIC_COLUMNS]
        rows = []
        for r in runs:
            row = [Cell(r.unit, title=r.name)]
            row += [number_cell(r.metrics[k]) if k in r.metrics else Cell("") for k in part]
            rows.append(row)
        tables.append(Table(["run", *part], rows))
    return tables


def params_by_run(runs: list[RunInfo]) -> Table:
    """One row per parameter, one column per run (parameters are many and long; runs few)."""
    keys = sorted({k for r in runs for k in r.params})
    rows = []
    for k in keys:
        values = [r.params.get(k) for r in runs]
        differ = len({v for v in values if v is not None}) > 1
        rows.append(
            [Cell(k, css="differ" if differ else "")] + [Cell(v if v is not None else "") for v in values]
        )
    return Table(["param", *[r.unit for r in runs]], rows)


def overview_table(runs: list[RunInfo]) -> Table:
    rows = []
    for r in runs:
        rows.append(
            [
                Cell(("\u2003" * (r.depth - 1)) + r.name, title=r.run_id, css=f"link:{r.anchor}"),
                Cell(r.stage),
                Cell(r.tags.get("fastvocab.unit", "")),
                Cell(r.status, css=f"status {r.status.lower()}"),
                Cell(r.tags.get("fastvocab.status", ""), css=f"status {r.tags.get('fastvocab.status', '')}"),
                Cell(fmt_time(r.start_ms), css="nowrap"),
                Cell(fmt_duration(r.start_ms, r.end_ms), numeric=True),
                Cell(str(len(r.params)), numeric=True),
                Cell(str(len(r.metrics)), numeric=True),
                Cell(str(len(r.artifacts)), numeric=True),
                Cell(r.tags.get("fastvocab.message", "")),
            ]
        )
    header = [
        "run",
        "stage",
        "unit",
        "status",
        "fastvocab",
        "start",
        "run duration",
        "params",
        "metrics",
        "artifacts",
        "message",
    ]
    note = "start and duration: the work's (a pipeline stage's units share the stage's)"
    return Table(header, rows, note)


def header_table(data: ReportData) -> Table:
    root = data.root
    items: list[tuple[str, object]] = [("chosen as", data.chosen)] if data.chosen else []
    items += [
        ("run id", root.run_id),
        ("run name", root.name),
        ("experiment", f"{data.experiment} (id {data.experiment_id})"),
        ("status", root.status),
        ("start", fmt_time(root.start_ms)),
        ("end", fmt_time(root.end_ms) or "(not ended)"),
        ("duration", fmt_duration(root.start_ms, root.end_ms)),
    ]
    items += [(label, root.tags[key]) for key, label in HEADER_TAGS.items() if key in root.tags]
    items += [
        (key, value)
        for key, value in sorted(root.tags.items())
        if key not in HEADER_TAGS and not key.startswith("mlflow.")
    ]
    if "mlflow.parentRunId" in root.tags:
        items.append(("parent run", root.tags["mlflow.parentRunId"]))
    items += [("child runs", str(len(data.descendants))), ("tracking URI", data.tracking_uri)]
    table = key_value_table(items)
    table.rows[[k for k, _ in items].index("status")][1].css = f"status {root.status.lower()}"
    return table


def history_figure(runs: list[RunInfo], title: str) -> str:
    """PNG data URI: one panel per series metric, one line per run (empty when no run has a series)."""
    keys = sorted({k for r in runs for k in r.history})
    if not keys:
        return ""
    with needed():
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    cols = min(3, len(keys))
    nrows = math.ceil(len(keys) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 2.9 * nrows), squeeze=False)
    for ax, key in zip(axes.flat, keys, strict=False):
        for r in runs:
            if key in r.history:
                steps, values = zip(*r.history[key], strict=True)
                ax.plot(steps, values, lw=1.2, marker="." if len(steps) < 40 else None, label=r.unit)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(keys) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


@dataclass
class Group:
    """The child runs of one stage (or of one kind, for experiment runs)."""

    name: str
    anchor: str
    runs: list[RunInfo]
    metrics: list[Table]
    params: Table
    history: str


def groups(runs: list[RunInfo]) -> list[Group]:
    by_stage: dict[str, list[RunInfo]] = {}
    for r in runs:
        by_stage.setdefault(r.stage, []).append(r)
    out = []
    for i, (name, members) in enumerate(by_stage.items()):
        out.append(
            Group(
                name=name,
                anchor=f"stage-{i}",
                runs=members,
                metrics=metrics_by_run(members),
                params=params_by_run(members),
                history=history_figure(members, f"{name}: metrics by step"),
            )
        )
    return out
