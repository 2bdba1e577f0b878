"""The pipeline driver: corpus -> dump -> kmeans -> maps -> translate -> evaluate for the configured
directions.

Every stage is idempotent: it checks its outputs first and skips what exists and validates (shard by shard for
dump and streaming), writes atomically, and returns one :class:`StageRecord` per direction or map, which the
driver logs to MLflow as a child run of the run's parent. Work fans out on Ray (an actor pool for decoding,
one task per map for k-means and maps); Ray starts only when there is work, so a fully resumed run does not
pay for ``ray.init``.

Work-dir layout::

    states/direction=<src>-<tgt>/part-NNNNN.parquet     hidden states + top-K (dump)
    kmeans/<map>/{centroids.safetensors,kmeans.json}    centroids per map
    stream/<map>/direction=<src>-<tgt>/part-NNNNN.safetensors   streamed partial counts
    maps/<map>/{map.safetensors,manifest.json}          cluster maps (<map>: en-it, or to-it in target mode)
    translations/<src>-<tgt>/<method>.parquet, eval/<src>-<tgt>.json
    mlflow.db, mlartifacts/                             the MLflow store (default)
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fastvocab.pipeline.config import RunConfig
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.tracking import NullTracker, StageRecord, Tracker

log = logging.getLogger(__name__)

STAGES = ("corpus", "dump", "kmeans", "maps", "translate", "evaluate")


@dataclass
class ModelInfo:
    path: Path
    fingerprint: str
    d: int
    n_vocab: int
    languages: list[str]


class RaySession:
    """Starts Ray on first use: locally limited to ``num_cpus``, or attached to a cluster by address.

    An already initialised Ray (a test's session, ``ray job submit``'s driver) is reused and left running.
    """

    def __init__(self, address: str | None, num_cpus: int | None, log_to_driver: bool = True) -> None:
        self.address = address
        self.num_cpus = num_cpus or os.cpu_count() or 1
        self.log_to_driver = log_to_driver
        self._started = False

    def ensure(self):
        import ray

        if not ray.is_initialized():
            if self.address or os.environ.get("RAY_ADDRESS"):
                # attaching to a cluster: its resources are its own (num_cpus may not be passed)
                ray.init(address=self.address, log_to_driver=self.log_to_driver)
            else:
                ray.init(num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=self.log_to_driver)
            self._started = True
        return ray

    def cpus(self) -> int:
        """CPUs Ray can schedule on (the local limit before Ray is started)."""
        import ray

        if ray.is_initialized():
            return int(ray.cluster_resources().get("CPU", 1))
        return self.num_cpus

    def has_gpu(self) -> bool:
        import ray

        return float(ray.cluster_resources().get("GPU", 0)) > 0

    def require_gpus(self, amount: float, what: str) -> None:
        """A task asking for GPUs that the cluster does not have would wait forever: fail instead."""
        if amount <= 0:
            return
        import ray

        have = float(ray.cluster_resources().get("GPU", 0))
        if have < amount:
            raise UserError(f"{what} asks for {amount:g} GPU(s) per task, the Ray cluster has {have:g}")

    def shutdown(self) -> None:
        if self._started:
            import ray

            ray.shutdown()
            self._started = False


@dataclass
class Context:
    """What every stage needs: config, paths, the model's identity, the Ray session, samples per direction."""

    cfg: RunConfig
    ray: RaySession
    progress: bool = True
    _model: ModelInfo | None = None
    _samples: dict[str, tuple[list[int], list[str]]] = field(default_factory=dict)

    @property
    def work_dir(self) -> Path:
        return self.cfg.work_dir.resolve()

    @property
    def states_root(self) -> Path:
        return self.work_dir / "states"

    @property
    def kmeans_root(self) -> Path:
        return self.work_dir / "kmeans"

    @property
    def stream_root(self) -> Path:
        return self.work_dir / "stream"

    @property
    def maps_root(self) -> Path:
        return self.work_dir / "maps"

    @property
    def corpus_dir(self) -> Path:
        return self.cfg.corpus.out_dir.resolve()

    def model(self) -> ModelInfo:
        """Load the model once on the driver for its fingerprint (resume checks are against this model)."""
        if self._model is None:
            from transformers.utils import logging as hf_logging

            from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

            hf_logging.disable_progress_bar()
            path = self.cfg.model.resolve()
            if not path.is_dir():
                raise UserError(f"model folder not found: {self.cfg.model} (config key 'model')")
            adapter = Seq2SeqAdapter.load(path)
            for direction in self.cfg.directions:
                src, _, tgt = direction.partition("-")
                try:
                    adapter.check_language(src)
                    adapter.check_language(tgt)
                except ValueError as exc:
                    raise UserError(f"direction {direction}: {exc}") from exc
            self._model = ModelInfo(
                path, adapter.fingerprint, int(adapter.d_model), int(adapter.n_vocab), list(adapter.languages)
            )
            del adapter
        return self._model

    def sample(self, direction: str) -> tuple[list[int], list[str]]:
        """Source sentences of a direction: the stored sample then the streamed ones, in corpus order."""
        if direction not in self._samples:
            from fastvocab.artifacts_schema import corpus

            src, _, tgt = direction.partition("-")
            want = self.cfg.dump.sentences + self.cfg.dump.stream_sentences
            if self.cfg.dump.split == "mono":
                ids, texts = corpus.read_mono(self.corpus_dir, src, limit=want)
            else:
                ids, texts, _ = corpus.read_direction(
                    self.corpus_dir, src, tgt, self.cfg.dump.split, limit=want
                )
            if len(texts) < want:
                log.warning(
                    "%s: the corpus has %d source sentences, %d asked for", direction, len(texts), want
                )
            self._samples[direction] = (list(ids), list(texts))
        return self._samples[direction]

    def groups(self) -> dict[str, list[str]]:
        from fastvocab.tasks.maps import group_directions

        return group_directions(self.cfg.directions, self.cfg.maps.mode)

    def bar(self, total: int, desc: str):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit="shard", disable=not self.progress or total == 0)


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


StageFn = Callable[[Context], list[StageRecord]]


def stage_functions() -> dict[str, StageFn]:
    from fastvocab.pipeline import stages, stages_eval

    return {
        "corpus": stages_eval.stage_corpus,
        "dump": stages.stage_dump,
        "kmeans": stages.stage_kmeans,
        "maps": stages.stage_maps,
        "translate": stages_eval.stage_translate,
        "evaluate": stages_eval.stage_evaluate,
    }


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
    """Run the selected stages (default: all) in order; log a parent MLflow run and a child per record."""
    selected = parse_stages(stages)
    t0 = time.perf_counter()
    ctx = Context(
        cfg, RaySession(ray_address or cfg.ray_address, cfg.ray_num_cpus, log_to_driver), progress=progress
    )
    if tracker is None:
        tracker = Tracker.for_work_dir(ctx.work_dir, cfg.mlflow_tracking_uri, cfg.mlflow_experiment)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    tracker.start(
        run_name or f"run {time.strftime('%Y-%m-%d %H:%M:%S')}",
        cfg.model_dump(mode="json"),
        {"fastvocab.stages": ",".join(selected), "fastvocab.work_dir": str(ctx.work_dir)},
    )
    records: list[StageRecord] = []
    status = "FAILED"
    fns = stage_functions()
    try:
        for name in selected:
            t_stage = time.perf_counter()
            for rec in fns[name](ctx):
                verb = {"ran": "done", "skipped": "skip"}.get(rec.status, rec.status)
                level = logging.INFO if rec.status in ("ran", "skipped") else logging.WARNING
                log.log(level, "%s %s %s: %s", verb, rec.stage, rec.unit, rec.message)
                records.append(rec)
                tracker.log_stage(rec)
            log.debug("stage %s took %.1f s", name, time.perf_counter() - t_stage)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        seconds = time.perf_counter() - t0
        tracker.end(status, {"seconds": seconds})
        ctx.ray.shutdown()
    return PipelineResult(records, tracker.parent_id, tracker.uri, seconds)
