"""What every stage of one ``fastvocab run`` shares: config, work-dir layout, Ray, and the run context.

The model is described once, on the driver (:func:`fastvocab.tasks.context.describe_model`: its fingerprint
is the only hash over the weights in a run); stages hand the resulting
:class:`~fastvocab.tasks.context.RunContext` to their workers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from fastvocab.artifacts_schema.fingerprint import ModelRef
from fastvocab.pipeline.config import RunConfig
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.ray_session import RaySession
from fastvocab.tasks.context import RunContext

log = logging.getLogger(__name__)


@dataclass
class StageContext:
    """Config, paths, the Ray session and the model's identity (dump shards are planned as row ranges of the
    corpus file: :mod:`fastvocab.pipeline.stages.dump`)."""

    cfg: RunConfig
    ray: RaySession
    progress: bool = True
    _model: ModelRef | None = None
    _shards: dict[tuple[str, int], list[Path]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.work_dir = self.cfg.work_dir.resolve()
        self.corpus_dir = self.cfg.corpus.out_dir.resolve()
        self.sources_root = self.work_dir / "sources"  # dump: each direction's source lines, one file
        self.states_root = self.work_dir / "states"  # dump: hidden-state shards (beam b > 1: states/beam=<b>)
        self.kmeans_root = self.work_dir / "kmeans"  # k-means results, one folder per map
        self.stream_root = self.work_dir / "stream"  # streamed partial counts
        self.maps_root = self.work_dir / "maps"  # cluster maps
        self.translations_root = self.work_dir / "translations"
        self.eval_root = self.work_dir / "eval"

    def model(self) -> ModelRef:
        """The model's identity, computed once per run (the directions' languages are checked with it)."""
        if self._model is None:
            from fastvocab.tasks.context import describe_model

            path = self.cfg.model.resolve()
            if not path.is_dir():
                raise UserError(f"model folder not found: {self.cfg.model} (config key 'model')")
            langs = tuple(dict.fromkeys(x for d in self.cfg.directions for x in d.split("-", 1)))
            try:
                self._model = describe_model(path, langs)
            except ValueError as exc:
                raise UserError(f"directions {', '.join(self.cfg.directions)}: {exc}") from exc
        return self._model

    def run_context(
        self, device: str = "cpu", torch_threads: int | None = None, engine: str = "auto"
    ) -> RunContext:
        return RunContext(self.model(), device=device, torch_threads=torch_threads, engine=engine)

    def dump_beams(self) -> list[int]:
        """The paths the dump decodes, in order: the reference path (``dump.reference``), then every beam of
        ``maps.beams``."""
        from fastvocab.artifacts_schema.hidden_states import REFERENCE_BEAM

        return ([REFERENCE_BEAM] if self.cfg.dump.reference else []) + list(self.cfg.maps.beams)

    def beam_states_root(self, beam: int) -> Path:
        """Where the states dumped along ``beam`` live: ``states/`` (greedy), ``states/beam=<b>/``,
        ``states/reference/``."""
        from fastvocab.artifacts_schema.hidden_states import beam_root

        return beam_root(self.states_root, beam)

    def shard_files(self, direction: str, beam: int = 1) -> list[Path]:
        """The direction's hidden-state shards dumped along ``beam``, validated against the model once per
        run (then cached)."""
        if (direction, beam) not in self._shards:
            from fastvocab.artifacts_schema.hidden_states import validate_direction

            self._shards[direction, beam] = validate_direction(
                self.beam_states_root(beam), direction, fingerprint=self.model().fingerprint
            )
        return self._shards[direction, beam]

    def forget_shards(self, direction: str, beam: int = 1) -> None:
        """Drop the cached validation after the direction's shards were rewritten."""
        self._shards.pop((direction, beam), None)

    def groups(self) -> dict[str, list[str]]:
        """Map folder name -> the directions feeding it (one each in direction scope)."""
        from fastvocab.tasks.maps import group_directions

        return group_directions(self.cfg.directions, self.cfg.maps.scope)

    def decoder_workers(self) -> tuple[int, float, float]:
        """(actors, CPUs each = torch threads, GPUs each) for the workers that decode (dump, stream)."""
        cfg = self.cfg.dump
        threads = cfg.torch_threads or max(1, self.ray.cpus() // cfg.num_workers)
        return cfg.num_workers, float(threads), float(cfg.num_gpus_per_worker)

    def bar(self, total: int, desc: str, unit: str = "shard"):
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, disable=not self.progress or total == 0)
