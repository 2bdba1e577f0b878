"""MLflow logging for a pipeline run, from the driver only (Ray workers return metrics; MLflow's advice).

One parent run per ``fastvocab run``; one child run (``mlflow.parentRunId``) per stage and direction (or map).
Runs span the work, not the logging calls: a child run starts and ends with its stage (the driver stamps each
record, :attr:`StageRecord.started` and :attr:`StageRecord.ended`), a parent with the command's work;
``tune``, ``bench methods`` and ``experiment paper`` set the same two fields from the rows their work stamped.
An experiment fastvocab creates in a SQLite store keeps its artifacts beside the database file
(``<folder of the .db>/mlartifacts``, :func:`artifact_root_for`), wherever the command runs from.
Every command finds its store with :func:`resolve_store`: ``--tracking-uri`` (``fastvocab run``: or the
config's ``mlflow_tracking_uri``), else ``$MLFLOW_TRACKING_URI``, else the default store
``sqlite:///<work_dir>/mlflow.db`` with artifacts under ``<work_dir>/mlartifacts`` (``runs/demo`` for a
command given no work dir).

The store is the run's log, not one of its outputs: a rerun that skips every stage still records a parent run
(tagged ``fastvocab.all_skipped``) with its skipped child runs, and changes nothing else in ``work_dir``.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import sqlite3
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastvocab import __version__
from fastvocab.artifacts_schema.provenance import git_commit
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.extras import needed

log = logging.getLogger(__name__)

DB_FILE = "mlflow.db"
ARTIFACTS_DIR = "mlartifacts"
TRACKING_FILES = (DB_FILE, ARTIFACTS_DIR)  # what a rerun may change in work_dir
# Schemes of the stores MLflow can log to (``postgresql+psycopg2`` counts as postgresql).
URI_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "file", "http", "https", "databricks")
CONNECT_TIMEOUT_S = 5.0  # reachability check of a tracking server, before any work
# MLflow retries an unreachable server 7 times with backoff (about 4 minutes) per call; a run fails sooner.
HTTP_RETRY_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}


@dataclass
class StageRecord:
    """What one stage did for one unit (a direction, or a map); the driver logs it as a child run."""

    stage: str
    unit: str
    status: str  # "ran" | "skipped" | "unavailable"
    message: str = ""
    params: dict[str, object] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[float]] = field(default_factory=dict)  # metric per step (k-means objective)
    artifacts: list[Path] = field(default_factory=list)  # files to copy into the run (manifests, ...)
    fractions: dict[int, np.ndarray] = field(default_factory=dict)  # per-cluster active fraction by K
    # tables logged as MLflow tables (JSON in ``MlflowClient.log_table``'s split orientation), by artifact
    # file: column name -> values, all of one length (a sample of translations: source, reference, hypotheses)
    tables: dict[str, dict[str, list[object]]] = field(default_factory=dict)
    # when the unit's work started and ended (seconds since the epoch); None: the driver sets its stage's,
    # and a record logged without it spans only the logging call
    started: float | None = None
    ended: float | None = None


PIPELINE_KIND = "pipeline"  # a `fastvocab run` parent run's fastvocab.kind tag (`fastvocab report latest`)
SAMPLE_ROWS = 50  # rows of the translation sample a translate run logs as a table
SAMPLE_TABLE = "translations_sample.json"  # its artifact file


DEFAULT_WORK_DIR = Path("runs/demo")  # RunConfig.work_dir's default (configs/demo.yaml's, make demo's)
ENV_VAR = "MLFLOW_TRACKING_URI"
DEFAULT_SOURCE = "the default store"


@dataclass(frozen=True)
class Store:
    """An MLflow store, what named it (for messages) and, for the default store, its work dir."""

    uri: str
    source: str  # the option that named it, MLFLOW_TRACKING_URI, or DEFAULT_SOURCE
    work_dir: Path | None = None  # the default store's: its artifacts go to <work_dir>/mlartifacts

    @property
    def is_default(self) -> bool:
        return self.work_dir is not None


def resolve_store(
    given: str | None = None, work_dir: Path | None = None, option: str = "--tracking-uri"
) -> Store:
    """The MLflow store of every command, by one precedence: ``given`` (``--tracking-uri``; for
    ``fastvocab run`` also the config's ``mlflow_tracking_uri``, named by ``option``), else
    ``$MLFLOW_TRACKING_URI``, else the default store, ``sqlite:///<work_dir>/mlflow.db`` (``work_dir``: the
    command's work dir, :data:`DEFAULT_WORK_DIR` when it has none). Nothing is opened or imported here."""
    if given:
        return Store(given, option)
    env = os.environ.get(ENV_VAR)
    if env:
        return Store(env, ENV_VAR)
    work = Path(work_dir) if work_dir is not None else DEFAULT_WORK_DIR
    return Store(f"sqlite:///{(work / DB_FILE).resolve()}", DEFAULT_SOURCE, work)


def check_tracking_uri(uri: str, source: str = "MLflow tracking URI") -> None:
    """Refuse, in a second and with one line, a tracking URI MLflow cannot use: an unknown scheme, a SQLite
    file in a missing folder, or an http(s) server that does not accept a connection within a few seconds
    (MLflow itself would retry for minutes and then print tracebacks)."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme == "" or (len(scheme) == 1 and os.name == "nt"):
        return  # a plain path: a file store MLflow creates
    if scheme not in URI_SCHEMES:
        raise UserError(
            f"{source}={uri}: unknown scheme {parts.scheme!r} (use sqlite:///FILE, http(s)://HOST:PORT, "
            "postgresql://..., file:DIR)"
        )
    if scheme == "sqlite":
        db = uri.split(":///", 1)[1] if ":///" in uri else ""
        if db and db != ":memory:" and not Path(db).parent.is_dir():
            raise UserError(f"{source}={uri}: folder {Path(db).parent} does not exist")
    elif scheme in ("http", "https"):
        if not parts.hostname:
            raise UserError(f"{source}={uri}: no host name")
        port = parts.port or (443 if scheme == "https" else 80)
        try:
            with socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
            raise UserError(
                f"{source}={uri}: MLflow tracking server not reachable ({reason}); start it, fix the URI, "
                "or run with --no-mlflow"
            ) from exc
        for key, value in HTTP_RETRY_DEFAULTS.items():
            os.environ.setdefault(key, value)


def artifact_root_for(uri: str) -> Path | None:
    """Where an experiment created in the store ``uri`` keeps its artifacts: ``mlartifacts`` beside the
    database file of a SQLite store (the default store's ``<work_dir>/mlartifacts``), None for any other
    store (a server or a file store chooses its own). MLflow's own default for a SQLite store is ``./mlruns``
    of whatever folder the command ran in."""
    if _scheme(uri) != "sqlite" or ":///" not in uri:
        return None
    db = uri.split(":///", 1)[1].split("?", 1)[0]
    if not db or db == ":memory:":
        return None
    return Path(db).resolve().parent / ARTIFACTS_DIR


def _scheme(uri: str) -> str:
    """The scheme of a store URI, lower case, without its driver (``postgresql+psycopg2`` -> postgresql)."""
    from urllib.parse import urlsplit

    return urlsplit(uri).scheme.split("+", 1)[0].lower()


def epoch_ms(seconds: float | None) -> int | None:
    """Seconds since the epoch as MLflow's milliseconds (None stays None: MLflow takes the current time)."""
    return None if seconds is None else int(seconds * 1000)


def relocate_artifacts(db: Path, artifact_root: Path) -> str | None:
    """Point the work dir's own MLflow store at its own ``mlartifacts``.

    MLflow stores absolute artifact locations; in a copied (or moved) work dir they still name the original,
    so new runs would write their artifacts there. Locations under another ``.../mlartifacts`` are rewritten
    to this work dir's (runs, experiments, logged models). Returns the old root when something changed.
    """
    if not db.exists():
        return None
    want = artifact_root.resolve().as_uri()
    suffix = "/" + ARTIFACTS_DIR
    con = sqlite3.connect(db)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if "experiments" not in tables:
            return None
        old_roots = {
            loc
            for (loc,) in con.execute("SELECT artifact_location FROM experiments")
            if loc and loc.endswith(suffix) and loc != want
        }
        for old in old_roots:
            n = len(old) + 1
            with con:
                con.execute(
                    "UPDATE experiments SET artifact_location=? WHERE artifact_location=?", (want, old)
                )
                for table, column in (("runs", "artifact_uri"), ("logged_models", "artifact_location")):
                    if table in tables:
                        con.execute(
                            f"UPDATE {table} SET {column} = ? || substr({column}, ?) "
                            f"WHERE substr({column}, 1, ?) = ? AND substr({column}, ?, 1) IN ('/', '')",
                            (want, n, n - 1, old, n),
                        )
        return sorted(old_roots)[0] if old_roots else None
    finally:
        con.close()


def flatten(d: dict[str, object], prefix: str = "") -> dict[str, str]:
    """Nested config dict -> ``{"kmeans.r": "200", ...}`` (MLflow params are strings)."""
    out: dict[str, str] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = str(value)[:500]  # MLflow's param value limit
    return out


def plot_active_fractions(fractions: dict[int, np.ndarray], title: str, path: Path) -> Path:
    """Per-cluster percentage of active vocabulary columns, one series per K (Amer et al. Fig. 4), and
    the distribution over clusters."""
    with needed():
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    for k in sorted(fractions, reverse=True):  # largest K behind, as in the paper's figure
        pct = 100.0 * np.asarray(fractions[k])
        ax1.plot(
            np.arange(len(pct)), pct, lw=0.8, label=f"K={k} (mean {pct.mean():.2f}%, max {pct.max():.2f}%)"
        )
        ax2.hist(pct, bins=40, alpha=0.6, label=f"K={k}")
    ax1.set_xlabel("centroid index")
    ax1.set_ylabel("active columns (% of vocabulary)")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("active columns (% of vocabulary)")
    ax2.set_ylabel("clusters")
    ax2.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class Tracker:
    """Parent run + child runs in one MLflow experiment, through ``MlflowClient`` (no global active run)."""

    def __init__(self, uri: str, experiment: str, artifact_root: Path | None = None) -> None:
        """A tracker on the store ``uri``, in ``experiment`` (created when missing, its artifacts in
        ``artifact_root``, default :func:`artifact_root_for`). The parent run starts, unless
        :meth:`start` is told otherwise, when the tracker was made: the commands make it before their work."""
        with needed():
            from mlflow import MlflowClient
            from mlflow.exceptions import MlflowException

        self.uri = uri
        self.opened_at = time.time()
        if artifact_root is None:
            artifact_root = artifact_root_for(uri)
        try:
            self.client = MlflowClient(tracking_uri=uri)
            exp = self.client.get_experiment_by_name(experiment)
            if exp is not None:
                self.experiment_id = exp.experiment_id
            else:
                location = artifact_root.resolve().as_uri() if artifact_root is not None else None
                self.experiment_id = self.client.create_experiment(experiment, artifact_location=location)
        except (MlflowException, OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"MLflow tracking URI {uri}: {first[:300]}") from exc
        self.parent_id: str | None = None
        self.children: list[str] = []
        self._statuses: list[str] = []

    @classmethod
    def open(cls, store: Store, experiment: str) -> Tracker:
        """A tracker on ``store`` (:func:`resolve_store`): a named store is checked first (scheme, folder,
        server reachable); the default store's work dir is made, and its copied store relocated."""
        work_dir = store.work_dir
        if work_dir is not None:
            work_dir.mkdir(parents=True, exist_ok=True)
            old = relocate_artifacts(work_dir / DB_FILE, work_dir / ARTIFACTS_DIR)
            if old:
                log.info(
                    "MLflow: this work dir was copied or moved from %s; artifacts now go to %s",
                    old,
                    (work_dir / ARTIFACTS_DIR).resolve(),
                )
        else:
            check_tracking_uri(store.uri, store.source)
        # the default store's artifacts, <work_dir>/mlartifacts, are beside its database as any SQLite store's
        return cls(store.uri, experiment)

    def close_stale(self, run_id: str) -> bool:
        """Close a parent run left RUNNING by a killed process (its lock was taken over) as KILLED."""
        try:
            run = self.client.get_run(run_id)
        except Exception:  # another store, or a deleted run: nothing to close
            return False
        if run.info.status != "RUNNING":
            return False
        self.client.set_terminated(run_id, "KILLED")
        return True

    def start(
        self, run_name: str, config: dict[str, object], tags: dict[str, str], started: float | None = None
    ) -> str:
        """The parent run, from ``started`` (seconds since the epoch; default: when the tracker was made)."""
        with needed():
            from mlflow.entities import Param

        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name,
            start_time=epoch_ms(self.opened_at if started is None else started),
            tags={
                "fastvocab.version": __version__,
                "fastvocab.commit": git_commit(digits=12, mark_dirty=False),
                **tags,
            },
        )
        self.parent_id = run.info.run_id
        params = [Param(k, v) for k, v in sorted(flatten(config).items())]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.parent_id, params=params[i : i + 100])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "config.json"
            path.write_text(json.dumps(config, indent=2, sort_keys=True, default=str) + "\n")
            self.client.log_artifact(self.parent_id, str(path))
        log.info("MLflow: run %s in %s", self.parent_id, self.uri)
        return self.parent_id

    def log_stage(self, rec: StageRecord) -> str:
        """One child run for a stage record (skipped stages too, tagged ``fastvocab.status=skipped``),
        spanning ``rec.started`` to ``rec.ended`` (the time of this call where they are None)."""
        with needed():
            from mlflow.entities import Metric, Param, RunTag

        if self.parent_id is None:
            raise RuntimeError("Tracker.start() must come first")
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"{rec.stage}:{rec.unit}",
            start_time=epoch_ms(rec.started),
            tags={
                "mlflow.parentRunId": self.parent_id,
                "fastvocab.stage": rec.stage,
                "fastvocab.unit": rec.unit,
                "fastvocab.status": rec.status,
            },
        )
        run_id = run.info.run_id
        now = epoch_ms(rec.ended) or int(time.time() * 1000)
        metrics = [Metric(k, float(v), now, 0) for k, v in sorted(rec.metrics.items()) if _finite(v)]
        for name, values in rec.series.items():
            metrics += [Metric(name, float(v), now, i) for i, v in enumerate(values) if _finite(v)]
        params = [Param(k, str(v)[:500]) for k, v in sorted(rec.params.items())]
        tags = [RunTag("fastvocab.message", rec.message[:5000])] if rec.message else []
        for i in range(0, max(len(metrics), len(params), 1), 100):
            self.client.log_batch(run_id, metrics=metrics[i : i + 100], params=params[i : i + 100], tags=tags)
            tags = []
        for path in rec.artifacts:
            self.client.log_artifact(run_id, str(path))
        if rec.fractions:
            with tempfile.TemporaryDirectory() as tmp:
                png = plot_active_fractions(
                    rec.fractions,
                    f"{rec.unit}: active vocabulary per cluster",
                    Path(tmp) / "active_fraction.png",
                )
                csv = Path(tmp) / "active_fraction.csv"
                ks = sorted(rec.fractions)
                rows = np.column_stack(
                    [np.arange(len(rec.fractions[ks[0]]))] + [rec.fractions[k] for k in ks]
                )
                np.savetxt(
                    csv, rows, delimiter=",", header="cluster," + ",".join(f"k{k}" for k in ks), comments=""
                )
                self.client.log_artifact(run_id, str(png))
                self.client.log_artifact(run_id, str(csv))
        if rec.tables:
            self._log_tables(run_id, rec.tables)
        self.client.set_terminated(run_id, "FINISHED", end_time=epoch_ms(rec.ended))
        self.children.append(run_id)
        self._statuses.append(rec.status)
        return run_id

    def _log_tables(self, run_id: str, tables: dict[str, dict[str, list[object]]]) -> None:
        """Each table as ``MlflowClient.log_table`` writes one (JSON ``{"columns", "data"}``, pandas' split
        orientation, which ``load_table`` and the UI read) and lists it in the ``mlflow.loggedArtifacts`` tag;
        written here, UTF-8 and without pandas."""
        logged = []
        with tempfile.TemporaryDirectory() as tmp:
            for name, columns in tables.items():
                header = list(columns)
                rows = [list(row) for row in zip(*columns.values(), strict=True)]
                path = Path(tmp) / name
                path.parent.mkdir(parents=True, exist_ok=True)
                text = json.dumps({"columns": header, "data": rows}, ensure_ascii=False, default=str)
                path.write_text(text, encoding="utf-8")
                folder = Path(name).parent.as_posix()
                self.client.log_artifact(run_id, str(path), None if folder == "." else folder)
                logged.append({"path": name, "type": "table"})
        self.client.set_tag(run_id, "mlflow.loggedArtifacts", json.dumps(logged))

    def end(
        self,
        status: str = "FINISHED",
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        with needed():
            from mlflow.entities import Metric, RunTag

        if self.parent_id is None:
            return
        now = int(time.time() * 1000)
        metrics = dict(metrics or {})
        metrics["stages_ran"] = sum(s == "ran" for s in self._statuses)
        metrics["stages_skipped"] = sum(s == "skipped" for s in self._statuses)
        all_skipped = bool(self._statuses) and all(s != "ran" for s in self._statuses)
        tags = {**(tags or {}), "fastvocab.all_skipped": str(all_skipped).lower()}
        self.client.log_batch(
            self.parent_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in sorted(metrics.items()) if _finite(v)],
            tags=[RunTag(k, v[:5000]) for k, v in sorted(tags.items())],
        )
        self.client.set_terminated(self.parent_id, status)


class NullTracker:
    """Same interface, logs nothing (``--no-mlflow``)."""

    parent_id = None
    uri = "none"

    def start(
        self, run_name: str, config: dict[str, object], tags: dict[str, str], started: float | None = None
    ) -> None:
        return None

    def log_stage(self, rec: StageRecord) -> None:
        return None

    def end(
        self,
        status: str = "FINISHED",
        metrics: dict[str, float] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        return None


def _finite(v: object) -> bool:
    try:
        return math.isfinite(float(v))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
