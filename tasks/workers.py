"""The dump's and the stream's worker, which holds a model: the unit the pipeline hosts in Ray actors (one
model per actor; translation's is ``tasks.translate_job.TranslateWorker``).

It is a plain class: heavy setup in ``__init__`` (the model, loaded from the driver's
:class:`~fastvocab.tasks.context.RunContext` without re-hashing it), then one method per kind of work item,
each returning a small dict of metrics for the driver to log. Tests use them directly, without Ray.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from fastvocab.tasks.context import RunContext
from fastvocab.tasks.dump import DumpDecoder, DumpSettings, ShardSpec, run_dump_shard
from fastvocab.tasks.row_shards import RowRangeSpec, as_shard_spec
from fastvocab.tasks.stream import run_stream_shard

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
