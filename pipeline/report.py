"""A self-contained HTML report of one MLflow run and its descendants (``fastvocab report RUN_ID``).

Works for a pipeline run (a parent run with one child run per stage and direction, pipeline/tracking.py) and
for an experiment run (a parent with one child per table or figure). The page needs nothing but itself: PNG
figures are embedded as ``data:`` URIs, CSV and Markdown tables become HTML tables, JSON and text artifacts
are shown in collapsed blocks, and there is no external CSS, JavaScript or font. Every string from the store
is escaped by the template (``report_template.html``, package data; Jinja2 autoescape; Jinja2 comes with
MLflow's server dependencies).

The store is only read: a missing SQLite file is an error, not a new empty store.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import io
import json
import logging
import math
import os
import sqlite3
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from fastvocab import __version__
from fastvocab.artifacts_schema.atomic import write_text_atomic
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.tracking import ARTIFACTS_DIR, check_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

log = logging.getLogger(__name__)

LATEST = "latest"  # RUN_ID alias: the most recently started top-level run of the store
MAX_DEPTH = 3  # descendants below the reported run (pipeline: 1; experiment grids: 2)
MAX_IMAGE_BYTES = 8 << 20  # larger images are listed, not embedded
MAX_TEXT_BYTES = 64 << 10  # JSON and text artifacts are shown up to this size
MAX_TABLE_ROWS = 30  # CSV / Markdown rows shown per artifact (the file in the store has them all)
MAX_ARTIFACTS_PER_RUN = 200
METRIC_COLUMNS = 10
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".svg": "image/svg+xml",  # inert inside <img>: scripts in an SVG image do not run
}
TEXT_SUFFIXES = {".json", ".txt", ".log", ".yaml", ".yml", ".tsv", ".py", ".cfg", ".toml"}
# Tags shown in the report's header, in this order; the rest of the non-``mlflow.`` tags follow.
HEADER_TAGS = {
    "fastvocab.version": "fastvocab version",
    "fastvocab.commit": "git commit",
    "fastvocab.stages": "stages",
    "fastvocab.work_dir": "work dir",
    "fastvocab.all_skipped": "all stages skipped",
}


# --------------------------------------------------------------------------------------------- collected data


@dataclass
class Artifact:
    """One artifact file of a run, as the report shows it."""

    path: str  # relative to the run's artifact root
    size: int
    kind: str  # "image" | "table" | "markdown" | "text" | "other"
    data_uri: str = ""  # images
    table: Table | None = None  # CSV, and Markdown pipe tables
    markdown: list[Block] = field(default_factory=list)
    text: str = ""  # JSON (pretty-printed) and text
    note: str = ""  # why something is not shown whole


@dataclass
class Cell:
    text: str
    title: str = ""  # full value on hover (numbers are rounded in the text)
    numeric: bool = False
    css: str = ""

    @property
    def td_class(self) -> str:
        kind = "num" if self.numeric else ("short" if len(self.text) <= 24 else "wrap")
        return f"{kind} {self.css}".strip()


@dataclass
class Table:
    header: list[str]
    rows: list[list[Cell]]
    note: str = ""  # e.g. "first 30 of 200 rows"


@dataclass
class Block:
    """A piece of a Markdown artifact: a table, or a paragraph of plain text."""

    table: Table | None = None
    text: str = ""
    heading: bool = False


@dataclass
class RunInfo:
    run_id: str
    name: str
    status: str
    start_ms: int | None
    end_ms: int | None
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]
    history: dict[str, list[tuple[int, float]]]  # only metrics logged at more than one step
    artifacts: list[Artifact]
    depth: int = 0  # 0: the reported run
    parent_name: str = ""

    @property
    def anchor(self) -> str:
        return f"run-{self.run_id}"

    @property
    def stage(self) -> str:
        """Group of a child run: its pipeline stage, else the part of its name before ``:``, else ``runs``."""
        if self.tags.get("fastvocab.stage"):
            return self.tags["fastvocab.stage"]
        head, sep, _ = self.name.partition(":")
        return head if sep and head else "runs"

    @property
    def unit(self) -> str:
        return self.tags.get("fastvocab.unit") or self.name


@dataclass
class ReportData:
    root: RunInfo
    descendants: list[RunInfo]
    experiment: str
    experiment_id: str
    tracking_uri: str
    generated: datetime


# -------------------------------------------------------------------------------------------------- the store


def open_client(uri: str) -> MlflowClient:
    """An ``MlflowClient`` for an existing store; a one-line ``UserError`` when it is missing or unreachable.

    A SQLite store is checked read-only first: MLflow would create a missing database (or the tables of a
    non-MLflow one), and a report must not write to the store.
    """
    from mlflow import MlflowClient

    scheme = urlsplit(uri).scheme.split("+", 1)[0].lower()
    if scheme == "sqlite":
        db = uri.split(":///", 1)[1] if ":///" in uri else ""
        if not db or db == ":memory:":
            raise UserError(f"tracking URI {uri}: names no SQLite file")
        path = Path(db)
        if not path.is_file():
            raise UserError(f"tracking URI {uri}: no MLflow store at {path} (run `fastvocab run` first?)")
        try:
            con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            finally:
                con.close()
        except sqlite3.Error as exc:
            raise UserError(f"tracking URI {uri}: {path} is not a readable SQLite database ({exc})") from exc
        if not {"runs", "experiments"} <= tables:
            raise UserError(f"tracking URI {uri}: {path} is not an MLflow store (no runs table)")
    elif scheme in ("file", ""):
        root = Path(unquote(urlsplit(uri).path) if scheme else uri)
        if not root.is_dir():
            raise UserError(f"tracking URI {uri}: no MLflow store at {root}")
    else:
        check_tracking_uri(uri, "tracking URI")
    return MlflowClient(tracking_uri=uri)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def _get_run(client: MlflowClient, run_id: str, uri: str) -> Run:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise UserError(f"run {run_id} not found in {uri}") from exc
        raise UserError(f"tracking URI {uri}: {_first_line(exc)}") from exc
    except Exception as exc:  # a database or connection error deep in MLflow
        raise UserError(f"tracking URI {uri}: {_first_line(exc)}") from exc


def resolve_run_id(client: MlflowClient, run_id: str, uri: str) -> str:
    """``latest`` -> the id of the most recently started run that has no parent; anything else unchanged."""
    if run_id != LATEST:
        return run_id
    from mlflow.entities import ViewType

    try:
        exp_ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
        page_token = None
        while exp_ids:
            page = client.search_runs(
                exp_ids, order_by=["attributes.start_time DESC"], max_results=500, page_token=page_token
            )
            for run in page:
                if "mlflow.parentRunId" not in run.data.tags:
                    return run.info.run_id
            page_token = page.token
            if not page_token:
                break
    except Exception as exc:
        raise UserError(f"tracking URI {uri}: {_first_line(exc)}") from exc
    raise UserError(f"no runs in {uri}")


def _children(client: MlflowClient, experiment_id: str, parent_id: str) -> list[Run]:
    runs: list[Run] = []
    page_token = None
    while True:
        page = client.search_runs(
            [experiment_id],
            filter_string=f"tags.mlflow.parentRunId = '{parent_id}'",
            order_by=["attributes.start_time ASC"],
            max_results=1000,
            page_token=page_token,
        )
        runs.extend(page)
        page_token = page.token
        if not page_token:
            break
    return sorted(runs, key=lambda r: (r.info.start_time or 0, r.info.run_name or ""))


def _history(client: MlflowClient, run: Run) -> dict[str, list[tuple[int, float]]]:
    """Series of the metrics logged at more than one step (the k-means objective per iteration, ...)."""
    latest = getattr(run.data, "_metric_objs", None)
    # The latest value of a series sits at its largest step: only those need their history fetched.
    keys = sorted({m.key for m in latest if m.step > 0} if latest is not None else run.data.metrics)
    out: dict[str, list[tuple[int, float]]] = {}
    for key in keys:
        points = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))
        if len(points) > 1:
            out[key] = points
    return out


def _local_artifact_root(artifact_uri: str, uri: str) -> Path | None:
    """The folder of a run's artifacts when it is on this machine.

    A work dir that was copied or moved still names the original folder in its store (tracking.py rewrites
    the locations only when a new run starts); the same ``mlartifacts/...`` path beside the SQLite file is
    tried then, without touching the store.
    """
    parts = urlsplit(artifact_uri)
    if parts.scheme not in ("file", ""):
        return None
    root = Path(unquote(parts.path))
    if root.is_dir():
        return root
    marker = f"/{ARTIFACTS_DIR}/"
    if uri.startswith("sqlite:///") and marker in root.as_posix():
        beside = Path(uri.split(":///", 1)[1]).parent / ARTIFACTS_DIR
        moved = beside / root.as_posix().rsplit(marker, 1)[1]
        if moved.is_dir():
            return moved
    return root


def _artifact_files(client: MlflowClient, run: Run, uri: str, tmp: Path) -> list[tuple[str, Path]]:
    """(relative path, local file) of every artifact file of a run, sorted by path."""
    root = _local_artifact_root(run.info.artifact_uri or "", uri)
    if root is not None:
        if not root.is_dir():
            return []
        files = sorted(p for p in root.rglob("*") if p.is_file())
        return [(p.relative_to(root).as_posix(), p) for p in files[:MAX_ARTIFACTS_PER_RUN]]
    # A remote artifact store (an MLflow server, S3, ...): download into the report's scratch folder.
    out: list[tuple[str, Path]] = []
    stack = [""]
    while stack and len(out) < MAX_ARTIFACTS_PER_RUN:
        for info in client.list_artifacts(run.info.run_id, stack.pop() or None):
            if info.is_dir:
                stack.append(info.path)
            elif (info.file_size or 0) <= MAX_IMAGE_BYTES:
                dst = tmp / run.info.run_id
                dst.mkdir(parents=True, exist_ok=True)
                out.append((info.path, Path(client.download_artifacts(run.info.run_id, info.path, str(dst)))))
    return sorted(out)


def _run_info(
    client: MlflowClient, run: Run, uri: str, tmp: Path, depth: int, parent_name: str = ""
) -> RunInfo:
    files = _artifact_files(client, run, uri, tmp)
    # A CSV beside a Markdown table or a figure of the same name is their data: shown collapsed.
    twins = {
        Path(rel).with_suffix("").as_posix(): Path(rel).suffix.lower()
        for rel, _ in sorted(files, key=lambda f: f[0].lower().endswith(".md"))
        if Path(rel).suffix.lower() in (".md", *IMAGE_TYPES)
    }
    artifacts = [
        _artifact(rel, path, twin=twins.get(Path(rel).with_suffix("").as_posix(), "")) for rel, path in files
    ]
    return RunInfo(
        run_id=run.info.run_id,
        name=run.info.run_name or run.data.tags.get("mlflow.runName", "") or run.info.run_id,
        status=run.info.status,
        start_ms=run.info.start_time,
        end_ms=run.info.end_time,
        tags=dict(run.data.tags),
        params=dict(run.data.params),
        metrics=dict(run.data.metrics),
        history=_history(client, run),
        artifacts=artifacts,
        depth=depth,
        parent_name=parent_name,
    )


def collect(client: MlflowClient, run_id: str, uri: str, tmp: Path) -> ReportData:
    """Read the run, its descendants (depth-first, children by start time) and their artifacts."""
    run_id = resolve_run_id(client, run_id, uri)
    run = _get_run(client, run_id, uri)
    try:
        experiment = client.get_experiment(run.info.experiment_id)
        root = _run_info(client, run, uri, tmp, 0)
        descendants: list[RunInfo] = []

        def walk(parent: RunInfo, depth: int) -> None:
            if depth > MAX_DEPTH:
                return
            for child in _children(client, run.info.experiment_id, parent.run_id):
                info = _run_info(client, child, uri, tmp, depth, parent.name)
                descendants.append(info)
                walk(info, depth + 1)

        walk(root, 1)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"tracking URI {uri}: reading run {run_id}: {_first_line(exc)}") from exc
    return ReportData(
        root=root,
        descendants=descendants,
        experiment=experiment.name if experiment else "",
        experiment_id=run.info.experiment_id,
        tracking_uri=uri,
        generated=datetime.now(UTC),
    )


# ------------------------------------------------------------------------------------------------- formatting


def fmt_number(value: float) -> str:
    """Readable rounding for a table cell (the exact value goes into the cell's title)."""
    if not math.isfinite(value):
        return str(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 1e5:
        return f"{value:,.0f}"
    return f"{value:.5g}"


def number_cell(value: float) -> Cell:
    return Cell(fmt_number(value), title=repr(float(value)), numeric=True)


def text_cell(text: str) -> Cell:
    """A cell from a CSV or Markdown field: numbers are rounded like metrics, anything else kept."""
    try:
        value = float(text)
    except ValueError:
        return Cell(text)
    if text.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return Cell(text, numeric=True)
    cell = number_cell(value)
    cell.title = text
    return cell


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


def fmt_size(n: int) -> str:
    for unit in ("B", "KB", "MB"):
        if n < 1024 or unit == "MB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"


def _limited_rows(rows: list[list[str]], what: str) -> tuple[list[list[str]], str]:
    if len(rows) <= MAX_TABLE_ROWS:
        return rows, ""
    return rows[
        :MAX_TABLE_ROWS
    ], f"first {MAX_TABLE_ROWS} of {len(rows):,} {what}; the whole file is in the run"


def csv_table(text: str, delimiter: str = ",") -> Table:
    rows = [r for r in csv.reader(io.StringIO(text), delimiter=delimiter) if r]
    if not rows:
        return Table([], [], "empty")
    header, body = rows[0], rows[1:]
    body, note = _limited_rows(body, "rows")
    return Table(header, [[text_cell(c) for c in row] for row in body], note)


def _split_pipe_row(line: str) -> list[str]:
    line = line.strip()
    if line.startswith("|"):
        line = line[1:]
    if line.endswith("|") and not line.endswith("\\|"):
        line = line[:-1]
    cells, cur, escaped = [], [], False
    for ch in line:
        if escaped:
            cur.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "|":
            cells.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    cells.append("".join(cur).strip())
    return cells


def _is_separator(line: str) -> bool:
    cells = _split_pipe_row(line)
    return bool(cells) and all(c and set(c) <= set(":- ") and "-" in c for c in cells)


def markdown_blocks(text: str) -> list[Block]:
    """Pipe tables become tables; other lines stay plain text (headings marked). Enough for the tables that
    experiments log; not a Markdown renderer."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    para: list[str] = []

    def flush() -> None:
        if para:
            blocks.append(Block(text=" ".join(para)))
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if stripped.startswith("|") and i + 1 < len(lines) and _is_separator(lines[i + 1]):
            flush()
            header = [c.replace("**", "").replace("`", "") for c in _split_pipe_row(stripped)]
            i += 2
            body: list[list[str]] = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                body.append(_split_pipe_row(lines[i]))
                i += 1
            body, note = _limited_rows(body, "rows")
            cells = [[text_cell(c.replace("**", "").replace("`", "")) for c in row] for row in body]
            blocks.append(Block(table=Table(header, cells, note)))
            continue
        if not stripped:
            flush()
        elif stripped.startswith("#"):
            flush()
            blocks.append(Block(text=stripped.lstrip("#").strip(), heading=True))
        else:
            para.append(stripped)
        i += 1
    flush()
    return blocks


def _read_text(path: Path, size: int) -> tuple[str, str]:
    with open(path, "rb") as f:
        raw = f.read(MAX_TEXT_BYTES + 1)
    note = f"first {fmt_size(MAX_TEXT_BYTES)} of {fmt_size(size)}" if len(raw) > MAX_TEXT_BYTES else ""
    return raw[:MAX_TEXT_BYTES].decode("utf-8", errors="replace"), note


def _artifact(rel: str, path: Path, twin: str = "") -> Artifact:
    size = path.stat().st_size
    suffix = Path(rel).suffix.lower()
    art = Artifact(rel, size, "other")
    if suffix in IMAGE_TYPES:
        if size > MAX_IMAGE_BYTES:
            art.note = f"not embedded: {fmt_size(size)} (limit {fmt_size(MAX_IMAGE_BYTES)})"
            return art
        data = path.read_bytes()
        if suffix == ".png" and not data.startswith(PNG_SIGNATURE):
            art.note = "not embedded: not a PNG file"
            return art
        art.kind = "image"
        art.data_uri = f"data:{IMAGE_TYPES[suffix]};base64," + base64.b64encode(data).decode("ascii")
        return art
    if suffix in (".csv", ".tsv") or suffix == ".md":
        text, note = _read_text(path, size)
        if note:  # a cut file would end in a partial row
            text = text.rsplit("\n", 1)[0]
        if suffix == ".md":
            art.kind = "markdown"
            art.markdown = markdown_blocks(text)
        else:
            art.kind = "table"
            art.table = csv_table(text, "\t" if suffix == ".tsv" else ",")
            if twin == ".md":
                art.note = "the same table as the Markdown artifact"
            elif twin:
                art.note = "the data of the figure"
        if note and art.table is not None:
            art.table.note = "; ".join(x for x in (art.table.note, note) if x)
        return art
    if suffix in TEXT_SUFFIXES or size == 0:
        text, note = _read_text(path, size)
        if suffix == ".json" and not note:
            with contextlib.suppress(ValueError):  # shown as it is
                text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
        art.kind, art.text, art.note = "text", text, note
        return art
    art.note = "binary file, not shown"
    return art


# ----------------------------------------------------------------------------------------------- the tables


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
    note = "start and duration are the MLflow run's; a pipeline stage's own times are among its metrics"
    return Table(header, rows, note)


def header_table(data: ReportData) -> Table:
    root = data.root
    items: list[tuple[str, object]] = [
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
    table.rows[3][1].css = f"status {root.status.lower()}"
    return table


def history_figure(runs: list[RunInfo], title: str) -> str:
    """PNG data URI: one panel per series metric, one line per run (empty when no run has a series)."""
    keys = sorted({k for r in runs for k in r.history})
    if not keys:
        return ""
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


# ------------------------------------------------------------------------------------------------ rendering

TEMPLATE = "report_template.html"  # beside this module, shipped in the wheel as package data


def template_text() -> str:
    """The page's Jinja2 template, read from the installed package."""
    return files("fastvocab.pipeline").joinpath(TEMPLATE).read_text(encoding="utf-8")


def render(data: ReportData) -> str:
    """The page of what was read: the template filled with its tables and figures."""
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
