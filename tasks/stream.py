"""Streaming extension (docs/DESIGN-NOTES.md): decode further sentences without storing their states.

Each state is assigned on the fly to the trained centroids (Eq. 2) and only its top-K ids are counted. A
stream shard leaves one small file of partial (cluster, token) counts (``artifacts_schema.stream_counts``),
written atomically, so an interrupted run resumes shard by shard; the maps stage merges the partial counts
into the map's counts (exact: integer sums).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.stream_counts import read_stream_arrays, stream_meta, write_stream_arrays
from fastvocab.tasks.dump import DumpDecoder, ShardSpec
from fastvocab.tasks.maps import ActiveSetCounter, assign, centroid_sq_norms

log = logging.getLogger(__name__)


def read_stream_counts(path: Path, expect_meta: dict[str, str] | None = None) -> ActiveSetCounter | None:
    """Partial counts of a stream shard; None when absent or made for other centroids/model/plan."""
    arrays = read_stream_arrays(path, expect_meta)
    return None if arrays is None else ActiveSetCounter.from_arrays(arrays)


def stream_counts(
    decoder: DumpDecoder, spec: ShardSpec, centroids: np.ndarray, k: int
) -> tuple[ActiveSetCounter, dict[str, float]]:
    """Decode a shard and count its states' top-``k`` ids per nearest centroid; states are not kept."""
    if k > decoder.k:
        raise ValueError(f"maps k={k} exceeds the dump k={decoder.k}")
    counter = ActiveSetCounter(len(centroids), decoder.n_vocab)
    norms = centroid_sq_norms(centroids)
    t0 = time.perf_counter()
    cols = decoder.decode_shard(spec)
    decode_s = time.perf_counter() - t0
    # the (rows, d) block of one shard is small; it is dropped as soon as it is assigned
    counter.add(assign(cols["hidden"], centroids, norms), cols["topk_ids"][:, :k])
    return counter, {
        "states": float(counter.states),
        "seconds": time.perf_counter() - t0,
        "decode_s": decode_s,
    }


def run_stream_shard(
    decoder: DumpDecoder, spec: ShardSpec, centroids: np.ndarray, k: int, path: Path
) -> dict[str, object]:
    """Stream one shard into a partial-counts file (unless current); returns metrics for the driver."""
    meta = stream_meta(decoder.fingerprint, centroids, k, spec.plan(decoder.settings))
    if read_stream_arrays(path, meta) is not None:
        return {"direction": spec.direction, "index": spec.index, "skipped": True, "path": str(path)}
    counter, metrics = stream_counts(decoder, spec, centroids, k)
    write_stream_arrays(counter.to_arrays(), meta, path)
    log.info("streamed %s shard %d: %d states", spec.direction, spec.index, counter.states)
    return {"direction": spec.direction, "index": spec.index, "skipped": False, "path": str(path), **metrics}
