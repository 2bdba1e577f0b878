"""The cluster map on the projection's device, and each row's cluster: the first step of the clustered
projection (Eq. 2 of Amer et al.), and the union of the rows' sets.

:func:`prepare_map` turns a :class:`ClusterMap` into device tensors once, at construction; the rest are plain
functions over tensors, the torch twins of the CuPy ``assign`` and ``mark_active``/``compact`` kernels
(``cupy_ops``). Nothing is cached between calls.

Shapes: ``h`` (rows, d); ``weight`` (N, d), one vocabulary entry contiguous; ``bias`` (N,) or None.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from fastvocab.artifacts_schema.cluster_map import ClusterMap
from fastvocab.kernels.id_sets import unique_ids
from fastvocab.kernels.rowwise import argmin_rows

if TYPE_CHECKING:
    from fastvocab.kernels.int8 import PackedRows


@dataclass
class PreparedMap:
    """A cluster map on the projection's device, always-active ids merged into every set.

    ``ids[c]`` are views into ``indices`` (no copies); ``blocks[c]`` / ``block_bias[c]`` are the cached
    contiguous sub-matrices ``W[ids[c]]`` (None when cluster c is not cached).
    """

    centroids_t: torch.Tensor  # (d, r) in the assignment dtype: h @ centroids_t is one GEMM
    sq_norms: torch.Tensor  # (r,) float32, +inf for clusters with an empty set (never chosen)
    indptr: torch.Tensor  # (r+1,) int64
    indices: torch.Tensor  # (nnz,) int64, sorted within each cluster
    ids: list[torch.Tensor]  # r views into indices
    sizes: list[int]  # r set sizes (always-active ids included)
    population: np.ndarray  # (r,) member predictions per cluster (sum of counts): how often it is hit
    blocks: list[torch.Tensor | None]
    block_bias: list[torch.Tensor | None]
    cached_bytes: int

    @property
    def r(self) -> int:
        return len(self.sizes)

    @property
    def max_size(self) -> int:
        return max(self.sizes)

    @functools.cached_property
    def host_csr(self) -> tuple[np.ndarray, np.ndarray]:
        """``indptr`` and ``indices`` on the host (copied once): the numpy work on a step's few clusters."""
        return self.indptr.cpu().numpy(), self.indices.cpu().numpy()

    @functools.cached_property
    def covered(self) -> int:
        """How many distinct ids the sets hold together (what no union can exceed); counted once."""
        return int(torch.unique(self.indices).numel())


def merged_csr(
    indptr: np.ndarray, indices: np.ndarray, n_vocab: int, always_active: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """CSR with ``always_active`` added to every cluster's set; ids sorted and unique within each cluster."""
    r = len(indptr) - 1
    cluster_of = np.repeat(np.arange(r, dtype=np.int64), np.diff(indptr))
    keys = cluster_of * n_vocab + indices.astype(np.int64)  # sorted when the map's ids are sorted
    if always_active.size:
        extra = (np.arange(r, dtype=np.int64)[:, None] * n_vocab + always_active[None, :]).reshape(-1)
        keys = np.concatenate([keys, extra])
    keys = unique_ids(keys)  # sorts, drops the always-active ids a set already had
    sizes = np.bincount(keys // n_vocab, minlength=r)
    out_ptr = np.zeros(r + 1, dtype=np.int64)
    np.cumsum(sizes, out=out_ptr[1:])
    return out_ptr, keys % n_vocab


def assignment_dtype(device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """Centroid GEMM dtype: float32 on CPU and for bf16 (3 significant digits would flip near-ties); the
    weight dtype for fp16/fp32 on CUDA (halves the centroid bytes read per step)."""
    if device.type == "cpu" or dtype == torch.bfloat16:
        return torch.float32
    return dtype


def prepare_map(
    cmap: ClusterMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    always_active: Sequence[int],
    *,
    cache_bytes: int = 0,
) -> PreparedMap:
    """Move a (pruned) map to ``weight``'s device; cache per-cluster sub-matrices up to ``cache_bytes``.

    Clusters are cached most-populated first (the sum of their counts: how many member predictions fell in
    them), so the clusters decoding hits most often skip the gather.
    """
    device, n_vocab = weight.device, weight.shape[0]
    aa = np.asarray(sorted({int(i) for i in always_active}), dtype=np.int64)
    indptr, indices = merged_csr(cmap.indptr, cmap.indices, n_vocab, aa)
    sizes = np.diff(indptr)
    if not sizes.any():
        raise ValueError("every cluster of the map has an empty active set (after min_count pruning)")
    cum = np.concatenate([[0], np.cumsum(np.asarray(cmap.counts, dtype=np.int64))])
    population = np.diff(cum[cmap.indptr])

    sq = np.asarray(cmap.centroid_sq_norms, dtype=np.float32).copy()
    sq[sizes == 0] = np.inf  # a cluster with nothing to compute is never chosen
    adt = assignment_dtype(device, weight.dtype)
    centroids_t = torch.from_numpy(np.ascontiguousarray(cmap.centroids.T)).to(device=device, dtype=adt)
    indices_t = torch.from_numpy(indices).to(device)
    ids = [indices_t[indptr[c] : indptr[c + 1]] for c in range(len(sizes))]

    blocks: list[torch.Tensor | None] = [None] * len(sizes)
    block_bias: list[torch.Tensor | None] = [None] * len(sizes)
    row_bytes = weight.shape[1] * weight.element_size()
    chosen, used = [], 0
    for c in np.argsort(-population, kind="stable"):
        need = int(sizes[c]) * row_bytes
        if sizes[c] and used + need <= cache_bytes:
            chosen.append(int(c))
            used += need
    if chosen:
        flat = torch.cat([ids[c] for c in chosen])
        store = weight.index_select(0, flat)  # (sum of cached sizes, d): one allocation, views per cluster
        store_b = None if bias is None else bias.index_select(0, flat)
        pos = 0
        for c in chosen:
            n = int(sizes[c])
            blocks[c] = store[pos : pos + n]
            block_bias[c] = None if store_b is None else store_b[pos : pos + n]
            pos += n
    return PreparedMap(
        centroids_t=centroids_t,
        sq_norms=torch.from_numpy(sq).to(device),
        indptr=torch.from_numpy(indptr).to(device),
        indices=indices_t,
        ids=ids,
        sizes=[int(s) for s in sizes],
        population=population,
        blocks=blocks,
        block_bias=block_bias,
        cached_bytes=used,
    )


def centroid_distances(h: torch.Tensor, centroids_t: torch.Tensor, sq_norms: torch.Tensor) -> torch.Tensor:
    """``||C_j||^2 - 2 h·C_j`` for every row and centroid, (rows, r) float32: the squared distance less
    ``||h||^2``, which is the same for every j.

    The GEMM runs in ``centroids_t``'s dtype, the subtraction in float32 (the CuPy ``assign`` kernel does
    exactly this on the same GEMM output). With float32 centroids one ``addmm`` does both (half the op
    overhead of a 1-row CPU step).
    """
    if centroids_t.dtype == torch.float32:
        return torch.addmm(sq_norms, h.float(), centroids_t, alpha=-2.0)
    dots = h.to(centroids_t.dtype) @ centroids_t  # (rows, r)
    return sq_norms - 2.0 * dots.float()


def assign_clusters(h: torch.Tensor, centroids_t: torch.Tensor, sq_norms: torch.Tensor) -> torch.Tensor:
    """Eq. 2 of Amer et al.: the nearest centroid of each row, (rows,) int64 (ties: lowest j)."""
    return argmin_rows(centroid_distances(h, centroids_t, sq_norms))


def nearest_clusters(
    h: torch.Tensor, centroids_t: torch.Tensor, sq_norms: torch.Tensor, probes: int
) -> torch.Tensor:
    """The ``probes`` nearest clusters of each row, nearest first, (rows, probes) int64 (the first column is
    :func:`assign_clusters`' choice up to exact ties)."""
    dist = centroid_distances(h, centroids_t, sq_norms)  # (rows, r)
    return dist.topk(min(probes, dist.shape[1]), dim=1, largest=False).indices


def centroid_scores_int8(pm: PreparedMap) -> PackedRows:
    """``h -> h·C_j - ||C_j||^2 / 2`` for every centroid, (rows, r), as a dynamic int8 layer's packed
    weights (CPU; ``kernels.int8.linear_packed`` computes the scores): the
    nearest centroid is the highest score. For the int8 projection, whose step it makes cheaper: with the
    demo model's en-it map (r 2,000, d 256) on one thread the float32 assignment GEMM was a quarter of a
    union step at 32 rows, the int8 one about 2.5x cheaper (docs/cpu-engine.md, 0010).
    Rounding can pick a near-tie's other cluster, an int8 projection's own kind of change. A cluster never
    chosen (empty set) scores lowest."""
    from fastvocab.kernels.int8 import int8_linear, packed_of

    low = torch.finfo(torch.float32).min
    bias = torch.where(torch.isinf(pm.sq_norms), torch.full_like(pm.sq_norms, low), -0.5 * pm.sq_norms)
    return packed_of(int8_linear(pm.centroids_t.t().float(), bias), many_rows=True)


def union_mask(clusters: Sequence[int], ids: Sequence[torch.Tensor], n_vocab: int) -> torch.Tensor:
    """(N,) bool: the union of the rows' active sets, before compaction."""
    uniq = sorted(set(clusters))
    mask = torch.zeros(n_vocab, dtype=torch.bool, device=ids[uniq[0]].device)
    mask[torch.cat([ids[c] for c in uniq])] = True
    return mask


def union_columns(clusters: Sequence[int], ids: Sequence[torch.Tensor], n_vocab: int) -> torch.Tensor:
    """Sorted union of the rows' active sets, (C,) int64: boolean mask over N, then compaction."""
    if len(set(clusters)) == 1:
        return ids[clusters[0]]  # already sorted and unique
    return union_mask(clusters, ids, n_vocab).nonzero().squeeze(1)
