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
from fastvocab.tasks.maps import ActiveSetCounter, assign_rows, centroid_sq_norms, centroid_tensors

log = logging.getLogger(__name__)


def read_stream_counts(path: Path, expect_meta: dict[str, str] | None = None) -> ActiveSetCounter | None:
    """Partial counts of a stream shard; None when absent or made for other centroids/model/plan."""
    arrays = read_stream_arrays(path, expect_meta)
    return None if arrays is None else ActiveSetCounter.from_arrays(arrays)


def stream_counts(
    decoder: DumpDecoder, spec: ShardSpec, centroids: np.ndarray, k: int
) -> tuple[ActiveSetCounter, dict[str, float]]:
    """Decode a shard and count its states' top-``k`` ids per nearest centroid; states are not kept.

    Each batch is assigned and counted where it was decoded (on the GPU for a GPU worker): only its
    distinct (cluster, token) keys and their counts reach the host, never the states. The assignment is the
    maps stage's (float32, Eq. 2), so on the CPU streamed counts equal the counts of the same states stored.
    """
    import torch

    if k > decoder.k:
        raise ValueError(f"maps k={k} exceeds the dump k={decoder.k}")
    if spec.max_states is not None:
        raise ValueError(
            f"stream shard {spec.index} of {spec.direction} has a state cap: a stream counts every state"
        )
    counter = ActiveSetCounter(len(centroids), decoder.n_vocab)
    device = decoder.adapter.device
    centroids_t, norms = centroid_tensors(centroids, centroid_sq_norms(centroids), device)
    order = decoder.length_order(spec)
    refs = spec.references
    t0, decode_s = time.perf_counter(), 0.0
    with torch.inference_mode():
        for lo in range(0, len(order), decoder.batch_size):
            sel = order[lo : lo + decoder.batch_size]
            t1 = time.perf_counter()
            rec = decoder.records(
                [spec.texts[i] for i in sel],
                spec.src_lang,
                spec.tgt_lang,
                None if refs is None else [refs[i] for i in sel],
            )
            decode_s += time.perf_counter() - t1
            hidden = rec["hidden"]
            clusters = assign_rows(hidden, centroids_t, norms)
            keys = (clusters[:, None] * decoder.n_vocab + rec["topk_ids"][:, :k].long()).reshape(-1)
            uniq, counts = torch.unique(keys, return_counts=True)  # sorted
            counter.add_counts(uniq.cpu().numpy(), counts.cpu().numpy(), states=len(hidden))
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
