"""Workers that hold a model: the units the pipeline hosts in Ray actors (one model per actor).

Each is a plain class: heavy setup in ``__init__`` (the model, loaded from the driver's
:class:`~fastvocab.tasks.context.RunContext` without re-hashing it), then one method per kind of work item,
each returning a small dict of metrics for the driver to log. Tests use them directly, without Ray.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.jsonfile import write_json
from fastvocab.artifacts_schema.translations import sidecar_path, write_translations
from fastvocab.tasks.context import RunContext
from fastvocab.tasks.dump import DumpDecoder, DumpSettings, ShardSpec, run_dump_shard
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.row_shards import RowRangeSpec, as_shard_spec
from fastvocab.tasks.stream import run_stream_shard
from fastvocab.tasks.translate import SearchSettings, translate

log = logging.getLogger(__name__)


class DecoderWorker:
    """Full-softmax decoding (greedy, or beam search along any of ``maps.beams``) for the dump and stream
    stages (a :class:`DumpDecoder` per worker: one model, every beam)."""

    def __init__(self, ctx: RunContext, settings: DumpSettings) -> None:
        self.decoder = DumpDecoder(ctx, settings)

    def dump(
        self, spec: ShardSpec | RowRangeSpec, states_root: str, row_group_size: int, beam: int = 1
    ) -> dict[str, object]:
        """Decode one shard along ``beam`` and write its states to ``states_root`` (that beam's root; unless
        current); a row-range shard's rows are read here."""
        decoder = self.decoder.along(beam)
        return {
            **run_dump_shard(decoder, as_shard_spec(spec), Path(states_root), row_group_size),
            "beam": beam,
        }

    def stream(
        self, spec: ShardSpec | RowRangeSpec, centroids: np.ndarray, k: int, path: str, beam: int = 1
    ) -> dict[str, object]:
        """Decode one shard along ``beam`` and write its partial (cluster, token) counts (unless current)."""
        decoder = self.decoder.along(beam)
        return {**run_stream_shard(decoder, as_shard_spec(spec), centroids, k, Path(path)), "beam": beam}


@dataclass(frozen=True)
class MethodJob:
    """One output-layer method to run over a direction's sample, and where its outputs go."""

    method: str
    out: str  # translations Parquet file; its JSON record goes beside it
    options: dict[str, object] = field(default_factory=dict)  # create_projection options
    provenance: dict[str, object] = field(default_factory=dict)  # what the outputs were made from
    label: str | None = None  # how outputs and records name it, when not by the method (another map)

    @property
    def name(self) -> str:
        return self.label or self.method


@dataclass(frozen=True)
class TranslateJob:
    """A direction's sample, translated with every method in one process so speed ratios compare alike."""

    direction: str
    sources: tuple[str, ...]
    ids: tuple[int, ...]
    methods: tuple[MethodJob, ...]
    settings: SearchSettings


class TranslateWorker:
    """Translates pipeline samples with any output-layer method; writes outputs and their records."""

    warmup_sentences = 8  # first calls pay for allocations and lazy init: keep them out of the timing

    def __init__(self, ctx: RunContext) -> None:
        self.adapter = ctx.load_adapter()

    def run(self, job: TranslateJob) -> list[dict[str, object]]:
        """Translate ``job.sources`` with each method; returns one record per method (also written)."""
        src, _, tgt = job.direction.partition("-")
        sources = list(job.sources)
        results = []
        warm = False
        for mj in job.methods:
            projection = make_projection(self.adapter, mj.method, **mj.options)
            if not warm:
                warmup = sources[: self.warmup_sentences]
                translate(self.adapter, projection, warmup, src, tgt, job.settings, progress=False)
                warm = True
            res = translate(self.adapter, projection, sources, src, tgt, job.settings, progress=False)
            out = Path(mj.out)
            write_translations(
                out,
                res.hypotheses,
                sources=sources,
                ids=list(job.ids),
                direction=job.direction,
                method=mj.name,
            )
            record = {
                **mj.provenance,
                "signature": projection.signature(),
                "seconds": res.seconds,
                "target_tokens": res.target_tokens,
                "sentences": res.sentences,
                "tokens_per_s": res.tokens_per_second,
                "sentences_per_s": res.sentences_per_second,
                **projection.stats(),  # active columns per row, certified share (clustered)
            }
            write_json(sidecar_path(out), record)
            results.append(record)
        return results
