"""What the report reads from an MLflow store: one run, its descendants (children by start time, to
``MAX_DEPTH``) and their params, metrics, metric series and artifact files. The store is only read: a missing
SQLite file is an error, not a new empty store."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.extras import needed
from fastvocab.pipeline.report_artifacts import IMAGE_TYPES, MAX_IMAGE_BYTES, Artifact, read_artifact
from fastvocab.pipeline.tracking import ARTIFACTS_DIR, PIPELINE_KIND, check_tracking_uri

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

LATEST = "latest"  # RUN_ID alias: the most recently started pipeline run of the store (resolve_latest)
MAX_DEPTH = 3  # descendants below the reported run (pipeline: 1; experiment grids: 2)
MAX_ARTIFACTS_PER_RUN = 200


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
    chosen: str = ""  # for RUN_ID latest: which run it took, and why


def open_client(uri: str) -> MlflowClient:
    """An ``MlflowClient`` for an existing store; a one-line ``UserError`` when it is missing or unreachable.

    A SQLite store is checked read-only first: MLflow would create a missing database (or the tables of a
    non-MLflow one), and a report must not write to the store.
    """
    with needed():
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
    with needed():
        from mlflow.exceptions import MlflowException

    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if getattr(exc, "error_code", "") in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            raise UserError(f"run {run_id} not found in {uri}") from exc
        raise UserError(f"tracking URI {uri}: {_first_line(exc)}") from exc
    except Exception as exc:  # a database or connection error deep in MLflow
        raise UserError(f"tracking URI {uri}: {_first_line(exc)}") from exc


def run_kind(tags: dict[str, str]) -> str:
    """What logged a top-level run: its ``fastvocab.kind`` tag (``pipeline``, ``bulk``), else what its other
    tags say (a pipeline run logged before runs carried their kind has ``fastvocab.stages``; ``tune``,
    ``bench ...``, ``experiment ...``), else ``other``."""
    if tags.get("fastvocab.kind"):
        return tags["fastvocab.kind"]
    if "fastvocab.stages" in tags or "fastvocab.stages_selected" in tags:
        return PIPELINE_KIND
    if "fastvocab.tune" in tags:
        return "tune"
    for key, word in (("fastvocab.benchmark", "bench"), ("fastvocab.experiment", "experiment")):
        if key in tags:
            return f"{word} {tags[key]}"
    return "other"


def _describe(run: Run) -> str:
    started = datetime.fromtimestamp((run.info.start_time or 0) / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return f"{run.info.run_id} ({run.info.run_name or 'unnamed'}, started {started})"


def resolve_latest(client: MlflowClient, uri: str) -> tuple[str, str]:
    """(run id, why) of ``latest``: the most recently started pipeline run (a top-level run of ``fastvocab
    run``); when the store holds none, the most recently started top-level run of any kind. ``why`` names
    the run taken and, when a run of another kind (``tune``, ``translate``, ...) started later, that one and
    how to report it."""
    with needed():
        from mlflow.entities import ViewType

    newer: Run | None = None  # the newest top-level run, when it is not a pipeline run
    try:
        exp_ids = [e.experiment_id for e in client.search_experiments(view_type=ViewType.ACTIVE_ONLY)]
        page_token = None
        while exp_ids:
            page = client.search_runs(
                exp_ids, order_by=["attributes.start_time DESC"], max_results=500, page_token=page_token
            )
            for run in page:
                if "mlflow.parentRunId" in run.data.tags:
                    continue
                if run_kind(run.data.tags) == PIPELINE_KIND:
                    why = f"latest: pipeline run {_describe(run)}"
                    if newer is None:
                        return run.info.run_id, why + ", the store's newest run"
                    kind = run_kind(newer.data.tags)
                    return run.info.run_id, (
                        f"{why}, the newest pipeline run; a {kind} run started since: {_describe(newer)} "
                        f"(`fastvocab report {newer.info.run_id}`)"
                    )
                newer = newer or run
            page_token = page.token
            if not page_token:
                break
    except Exception as exc:
        raise UserError(f"tracking URI {uri}: {_first_line(exc)}") from exc
    if newer is None:
        raise UserError(f"no runs in {uri}")
    kind = run_kind(newer.data.tags)
    why = f"latest: no pipeline run in the store; the newest run, a {kind} run: {_describe(newer)}"
    return newer.info.run_id, why


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
        read_artifact(rel, path, twin=twins.get(Path(rel).with_suffix("").as_posix(), ""))
        for rel, path in files
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
    """Read the run (``latest``: :func:`resolve_latest`'s), its descendants (depth-first, children by
    start time) and their artifacts."""
    chosen = ""
    if run_id == LATEST:
        run_id, chosen = resolve_latest(client, uri)
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
        chosen=chosen,
    )
