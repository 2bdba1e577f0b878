"""Streaming extension (DESIGN.md, "stream the rest"): decode further sentences without storing their states.

Each state is assigned on the fly to the trained centroids (Eq. 2) and only its top-K ids are counted. A
stream shard leaves one small file of partial (cluster, token) counts, written atomically, so an interrupted
run resumes shard by shard; the driver merges the partial counts into the map's counts (exact: integer sums).

File: ``<work_dir>/stream/<map name>/direction=<src>-<tgt>/part-<i:05d>.safetensors`` with tensors ``keys``,
``counts``, ``shape`` (see :meth:`ActiveSetCounter.to_arrays`) and string metadata (model fingerprint,
centroids digest, k, the shard's plan).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.tasks.dump import DumpActor, ShardSpec, cached_actor
from fastvocab.tasks.maps import ActiveSetCounter, array_digest, assign, centroid_sq_norms

log = logging.getLogger(__name__)


def stream_path(stream_root: Path, map_name: str, direction: str, index: int) -> Path:
    return Path(stream_root) / map_name / f"direction={direction}" / f"part-{index:05d}.safetensors"


def stream_meta(fingerprint: str, centroids: np.ndarray, k: int, plan: dict[str, object]) -> dict[str, str]:
    return {
        "model_fingerprint": fingerprint,
        "centroids_digest": array_digest(np.ascontiguousarray(centroids, dtype=np.float32)),
        "k": str(k),
        "plan": json.dumps(plan, sort_keys=True),
    }


def read_stream_counts(path: Path, expect_meta: dict[str, str] | None = None) -> ActiveSetCounter | None:
    """Partial counts of a stream shard; None when absent or made for other centroids/model/plan.

    A file that exists but cannot be read raises ArtifactError naming it.
    """
    from safetensors import SafetensorError, safe_open

    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in ("keys", "counts", "shape")}
    except (OSError, SafetensorError, KeyError) as exc:
        raise ArtifactError(f"corrupt stream counts {path}: {exc}") from exc
    if expect_meta is not None and meta != expect_meta:
        return None
    return ActiveSetCounter.from_arrays(arrays)


def write_stream_counts(counter: ActiveSetCounter, meta: dict[str, str], path: Path) -> Path:
    from safetensors.numpy import save_file

    with atomic_path(path) as tmp:
        save_file(
            {k: np.ascontiguousarray(v) for k, v in counter.to_arrays().items()}, str(tmp), metadata=meta
        )
    return path


def stream_counts(
    actor: DumpActor, spec: ShardSpec, centroids: np.ndarray, k: int
) -> tuple[ActiveSetCounter, dict[str, float]]:
    """Decode a shard and count its states' top-``k`` ids per nearest centroid; states are not kept."""
    if k > actor.k:
        raise ValueError(f"maps k={k} exceeds the dump k={actor.k}")
    counter = ActiveSetCounter(len(centroids), actor.n_vocab)
    norms = centroid_sq_norms(centroids)
    t0 = time.perf_counter()
    cols = actor.decode_shard(spec)
    decode_s = time.perf_counter() - t0
    # the (rows, d) block of one shard is small; it is dropped as soon as it is assigned
    counter.add(assign(cols["hidden"], centroids, norms), cols["topk_ids"][:, :k])
    return counter, {
        "states": float(counter.states),
        "seconds": time.perf_counter() - t0,
        "decode_s": decode_s,
    }


def run_stream_shard(
    actor: DumpActor, spec: ShardSpec, centroids: np.ndarray, k: int, path: Path
) -> dict[str, object]:
    """Stream one shard into a partial-counts file (unless current); returns metrics for the driver."""
    meta = stream_meta(actor.fingerprint, centroids, k, spec.plan(actor.k, actor.max_len, actor.batch_size))
    if read_stream_counts(path, meta) is not None:
        return {"direction": spec.direction, "index": spec.index, "skipped": True, "path": str(path)}
    counter, metrics = stream_counts(actor, spec, centroids, k)
    write_stream_counts(counter, meta, path)
    log.info("streamed %s shard %d: %d states", spec.direction, spec.index, counter.states)
    return {"direction": spec.direction, "index": spec.index, "skipped": False, "path": str(path), **metrics}


def stream_shard_task(
    model_path: str, options: dict[str, object], spec: ShardSpec, centroids: np.ndarray, k: int, path: str
) -> dict[str, object]:
    """Ray task body: stream one shard with the worker's cached model."""
    return run_stream_shard(cached_actor(model_path, **options), spec, centroids, k, Path(path))
