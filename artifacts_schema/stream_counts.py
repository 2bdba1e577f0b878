"""Streamed partial counts (docs/DESIGN-NOTES.md, "Storing states versus streaming"): one small file per
stream shard.

``<work_dir>/stream/<map name>/direction=<src>-<tgt>/part-<i:05d>.safetensors`` (the greedy path's; a shard
decoded along beam ``b`` > 1 lives under ``<map name>/beam=<b>/`` instead) with tensors ``keys``
(sorted ``cluster * n_vocab + token``, int64), ``counts`` (int64) and ``shape`` (``[r, n_vocab, states]``),
and metadata naming what the counts were made from (model fingerprint, centroids digest, k, the shard's
plan) as one JSON string. A file whose metadata differs from the expected one is stale and recomputed,
never merged.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.digest import array_digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import beam_root, direction_dir, part_name

TENSORS = ("keys", "counts", "shape")
META_KEY = "fastvocab.stream_counts"


def stream_path(stream_root: Path, map_name: str, direction: str, index: int, beam: int = 1) -> Path:
    root = beam_root(Path(stream_root) / map_name, beam)
    return direction_dir(root, direction) / part_name(index, ".safetensors")


def stream_beam(path: Path) -> int:
    """The beam a stream shard was decoded along, from its metadata's plan (which names beams > 1 only)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
        return int(json.loads(meta[META_KEY])["plan"].get("beam", 1))
    except (OSError, SafetensorError, KeyError, ValueError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"corrupt stream counts {path}: {exc}") from exc


def stream_meta(fingerprint: str, centroids: np.ndarray, k: int, plan: dict[str, object]) -> dict[str, str]:
    """The file's metadata: one key holding sorted JSON.

    safetensors serialises metadata from a hash map, so several keys come out in a different order in every
    process and identical runs would write different bytes; a single key keeps the file deterministic.
    """
    meta = {
        "model_fingerprint": fingerprint,
        "centroids_digest": array_digest(np.ascontiguousarray(centroids, dtype=np.float32)),
        "k": k,
        "plan": plan,
    }
    return {META_KEY: json.dumps(meta, sort_keys=True)}


def read_stream_arrays(path: Path, expect_meta: dict[str, str] | None = None) -> dict[str, np.ndarray] | None:
    """The count arrays of a stream shard; None when absent or made for other centroids/model/plan.

    A file that exists but cannot be read raises ArtifactError naming it.
    """
    from safetensors import SafetensorError, safe_open

    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata() or {}
            arrays = {name: f.get_tensor(name) for name in TENSORS}
    except (OSError, SafetensorError, KeyError) as exc:
        raise ArtifactError(f"corrupt stream counts {path}: {exc}") from exc
    if expect_meta is not None and meta != expect_meta:
        return None
    return arrays


def write_stream_arrays(arrays: dict[str, np.ndarray], meta: dict[str, str], path: Path) -> Path:
    from safetensors.numpy import save_file

    with atomic_path(path) as tmp:
        save_file({k: np.ascontiguousarray(arrays[k]) for k in TENSORS}, str(tmp), metadata=meta)
    return path
