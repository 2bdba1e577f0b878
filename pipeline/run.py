"""The pipeline driver: corpus -> dump -> kmeans -> maps -> methods -> translate -> evaluate for the
configured directions (``methods`` builds the other methods' artifacts when ``methods.build`` names any).

Every stage (``pipeline/stages/<name>.py``) is idempotent: it checks its outputs first and skips what exists
and validates (shard by shard for dump and streaming), writes atomically, and returns one
:class:`StageRecord` per direction or map, which the driver logs to MLflow as a child run of the run's
parent. Work fans out on Ray (actor pools for decoding and translation, one task per map for k-means and
maps; ``pipeline/ray_session.py``); Ray starts only when there is work, so a fully resumed run does not pay
for ``ray.init``.

Work-dir layout::

    states/direction=<src>-<tgt>/part-NNNNN.parquet     hidden states + top-K (dump)
    kmeans/<map>/{centroids.safetensors,kmeans.json}    centroids per map
    stream/<map>/direction=<src>-<tgt>/part-NNNNN.safetensors   streamed partial counts
    maps/<map>/{map.safetensors,manifest.json}          cluster maps (<map>: en-it, or to-it in target scope)
    methods/<method>/{all,<src>-<tgt>}/                 LSH codes and graphs (all), shortlists (per direction)
    translations/<src>-<tgt>/<method>.parquet, eval/<src>-<tgt>.json
    mlflow.db, mlartifacts/                             the MLflow store (default)
    .fastvocab.lock                                     held while a run uses the work dir
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from fastvocab.artifacts_schema.lock import WorkDirLock
from fastvocab.pipeline.config import RunConfig
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import Interrupted, UserError
from fastvocab.pipeline.extras import require
from fastvocab.pipeline.ray_session import RaySession
from fastvocab.pipeline.signals import stop_on_signals
from fastvocab.pipeline.stages import STAGES, stage_function
from fastvocab.pipeline.tracking import (
    PIPELINE_KIND,
    NullTracker,
    StageRecord,
    Store,
    Tracker,
    check_tracking_uri,
    resolve_store,
)

log = logging.getLogger(__name__)

# What the stages need of the pipeline extra (pipeline/extras.py), checked before anything is written: Ray
# hosts the workers of every stage but corpus and evaluate, k-means runs in Faiss; the run's MLflow log needs
# MLflow and matplotlib (the maps' figures).
STAGE_MODULES = {stage: ("ray",) for stage in STAGES if stage not in ("corpus", "evaluate")} | {
    "kmeans": ("ray", "faiss")
}
TRACKER_MODULES = ("mlflow", "matplotlib")


@dataclass
class PipelineResult:
    records: list[StageRecord]
    parent_run_id: str | None
    tracking_uri: str
    seconds: float

    def summary(self) -> str:
        width = max((len(r.unit) for r in self.records), default=5)
        lines = [f"{r.stage:<9} {r.unit:<{width}} {r.status:<11} {r.message}" for r in self.records]
        return "\n".join(lines)


def parse_stages(spec: str | Sequence[str] | None) -> list[str]:
    if spec is None:
        return list(STAGES)
    names = [s.strip() for s in (spec.split(",") if isinstance(spec, str) else spec) if s.strip()]
    unknown = [s for s in names if s not in STAGES]
    if unknown or not names:
        raise UserError(f"unknown stage(s) {unknown or names!r}; valid: {', '.join(STAGES)}")
    return [s for s in STAGES if s in names]  # always in pipeline order


def run_pipeline(
    cfg: RunConfig,
    *,
    stages: Sequence[str] | None = None,
    ray_address: str | None = None,
    tracker: Tracker | NullTracker | None = None,
    progress: bool = True,
    log_to_driver: bool = True,
    run_name: str | None = None,
) -> PipelineResult:
    """Run the selected stages (default: all) in order; log a parent MLflow run and a child per record.

    Everything that can be refused is checked before anything is written: the stages, the tracking URI
    (scheme, reachability), the model and the directions' languages. Then the work dir is locked (one run
    at a time; ``artifacts_schema/lock.py``) and SIGTERM/SIGINT stop it cleanly (``pipeline/signals.py``):
    workers stopped, the MLflow run closed as KILLED, the lock released, :class:`Interrupted` raised.
    """
    selected = parse_stages(stages)
    needs = [m for stage in selected for m in STAGE_MODULES.get(stage, ())]
    require("the pipeline", *needs, *(TRACKER_MODULES if tracker is None else ()))
    t0 = time.perf_counter()
    started = time.time()  # the parent MLflow run spans the whole run, from here
    ctx = StageContext(
        cfg, RaySession(ray_address or cfg.ray_address, cfg.ray_num_cpus, log_to_driver), progress=progress
    )
    store = pipeline_store(cfg)
    if tracker is None and not store.is_default:
        check_tracking_uri(store.uri, store.source)
    ctx.model()  # the model exists and knows every direction's languages: refused before any stage runs

    lock = WorkDirLock(ctx.work_dir)
    stale = lock.acquire()
    if stale is not None:
        log.warning(
            "work dir %s: taking over the lock of fastvocab %s, which is gone; its unfinished work is redone",
            ctx.work_dir,
            stale.describe(),
        )
    try:
        with stop_on_signals():
            if tracker is None:
                tracker = Tracker.open(store, cfg.mlflow_experiment)
            if stale is not None and isinstance(tracker, Tracker):
                _close_stale_run(tracker, stale.extra)
            return _run_stages(ctx, selected, tracker, lock, run_name, t0, started)
    finally:
        lock.release()


def pipeline_store(cfg: RunConfig) -> Store:
    """The run's MLflow store, by every command's precedence: the config's ``mlflow_tracking_uri`` (which
    ``fastvocab run --tracking-uri`` sets), else ``$MLFLOW_TRACKING_URI``, else ``<work_dir>/mlflow.db``."""
    return resolve_store(
        cfg.mlflow_tracking_uri, cfg.work_dir, "mlflow_tracking_uri (--tracking-uri or config)"
    )


def _close_stale_run(tracker: Tracker, extra: dict[str, str]) -> None:
    """A killed (SIGKILL) run cannot close its MLflow run: the run that takes over its lock does."""
    run_id = extra.get("mlflow_run_id")
    if run_id and extra.get("mlflow_uri") == tracker.uri and tracker.close_stale(run_id):
        log.warning("MLflow: run %s of the killed run closed as KILLED", run_id)


def _run_stages(
    ctx: StageContext,
    selected: list[str],
    tracker: Tracker | NullTracker,
    lock: WorkDirLock,
    run_name: str | None,
    t0: float,
    started: float | None = None,
) -> PipelineResult:
    """Each selected stage in order, each of its records logged as a child run that spans the stage's work
    (a stage does all its units at once: they share its start and end); the parent run is tagged with the
    stages that ran and those that had nothing to do (:func:`stage_tags`)."""
    tracker.start(
        run_name or f"run {time.strftime('%Y-%m-%d %H:%M:%S')}",
        ctx.cfg.model_dump(mode="json"),
        {
            "fastvocab.kind": PIPELINE_KIND,
            "fastvocab.stages_selected": ",".join(selected),
            "fastvocab.work_dir": str(ctx.work_dir),
        },
        started=started,
    )
    if tracker.parent_id:
        lock.update(mlflow_run_id=tracker.parent_id, mlflow_uri=tracker.uri)
    records: list[StageRecord] = []
    done: dict[str, list[StageRecord]] = {}  # the stages that returned, in order, and their records
    status = "FAILED"
    try:
        for name in selected:
            t_stage, stage_start = time.perf_counter(), time.time()
            stage_records = stage_function(name)(ctx)
            stage_end = time.time()
            done[name] = stage_records
            for rec in stage_records:
                rec.started = stage_start if rec.started is None else rec.started
                rec.ended = stage_end if rec.ended is None else rec.ended
                verb = {"ran": "done", "skipped": "skip"}.get(rec.status, rec.status)
                level = logging.INFO if rec.status in ("ran", "skipped") else logging.WARNING
                log.log(level, "%s %s %s: %s", verb, rec.stage, rec.unit, rec.message)
                records.append(rec)
                tracker.log_stage(rec)
            log.debug("stage %s took %.1f s", name, time.perf_counter() - t_stage)
        status = "FINISHED"
    except (KeyboardInterrupt, Interrupted):
        status = "KILLED"
        raise
    finally:
        seconds = time.perf_counter() - t0
        try:
            tracker.end(status, {"seconds": seconds}, stage_tags(selected, done))
        finally:
            ctx.ray.shutdown()  # stops the workers (actors, tasks) of a local session
    return PipelineResult(records, tracker.parent_id, tracker.uri, seconds)


def stage_tags(selected: Sequence[str], done: dict[str, list[StageRecord]]) -> dict[str, str]:
    """The parent run's account of its stages: ``fastvocab.stages``, those that ran (did work for at least one
    unit); ``fastvocab.stages_skipped``, those that returned with nothing to do (every output current, or
    nothing configured for them); and ``fastvocab.stage_failed``, the stage a failed or stopped run was in.
    ``fastvocab.stages_selected`` (tagged at the start) lists what was asked for."""
    ran = [s for s, recs in done.items() if any(r.status == "ran" for r in recs)]
    tags = {
        "fastvocab.stages": ",".join(ran),
        "fastvocab.stages_skipped": ",".join(s for s in done if s not in ran),
    }
    failed = next((s for s in selected if s not in done), None)
    if failed is not None:
        tags["fastvocab.stage_failed"] = failed
    return tags
