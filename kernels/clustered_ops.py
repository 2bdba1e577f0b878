"""Torch building blocks of the clustered projection: the CPU (and torch-CUDA) path, and the oracle that the
CuPy kernels in ``cupy_ops`` are tested against (every GPU kernel has a torch twin).

Everything here is a plain function over tensors, plus :func:`prepare_map`, which turns a :class:`ClusterMap`
into device tensors once, at construction. Nothing is cached between calls.

Shapes: ``h`` (rows, d); ``weight`` (N, d), one vocabulary entry contiguous; ``bias`` (N,) or None.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from fastvocab.artifacts_schema.cluster_map import ClusterMap
from fastvocab.kernels import int8

# ------------------------------------------------------------------------------------------- map on device


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
    keys = np.unique(keys)  # sorts, drops the always-active ids a set already had
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


# ------------------------------------------------------------------------------------------- the steps


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
    return centroid_distances(h, centroids_t, sq_norms).argmin(dim=1)


def nearest_clusters(
    h: torch.Tensor, centroids_t: torch.Tensor, sq_norms: torch.Tensor, probes: int
) -> torch.Tensor:
    """The ``probes`` nearest clusters of each row, nearest first, (rows, probes) int64 (the first column is
    :func:`assign_clusters`' choice up to exact ties)."""
    dist = centroid_distances(h, centroids_t, sq_norms)  # (rows, r)
    return dist.topk(min(probes, dist.shape[1]), dim=1, largest=False).indices


def union_columns(clusters: Sequence[int], ids: Sequence[torch.Tensor], n_vocab: int) -> torch.Tensor:
    """Sorted union of the rows' active sets, (C,) int64: boolean mask over N, then compaction."""
    uniq = sorted(set(clusters))
    if len(uniq) == 1:
        return ids[uniq[0]]  # already sorted and unique
    first = ids[uniq[0]]
    mask = torch.zeros(n_vocab, dtype=torch.bool, device=first.device)
    mask[torch.cat([ids[c] for c in uniq])] = True
    return mask.nonzero().squeeze(1)


# CPU gathers go through a reused 4 MB block: one big index_select would allocate a fresh C x d buffer per
# call (beyond glibc's mmap threshold, so every page faults in again: 3-5x slower at C = 12.5K, d = 1024,
# benchmarks/README.md) and stream it out of cache before the GEMM reads it back.
GATHER_CHUNK_BYTES = 4 << 20


def gathered_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cols: torch.Tensor
) -> torch.Tensor:
    """Logits of columns ``cols`` only, (rows, C): copy the active rows of W, then GEMM.

    On CPU, sets above ``GATHER_CHUNK_BYTES`` are gathered and multiplied a cache-sized block at a time.
    """
    c, d = cols.numel(), weight.shape[1]
    row_bytes = d * weight.element_size()
    if weight.device.type != "cpu" or c * row_bytes <= GATHER_CHUNK_BYTES:
        w = weight.index_select(0, cols)  # (C, d)
        b = None if bias is None else bias.index_select(0, cols)
        return F.linear(h, w, b)
    step = max(1, GATHER_CHUNK_BYTES // row_bytes)
    out_t = h.new_empty((c, h.shape[0]))  # (C, rows): each block fills contiguous rows
    buf = weight.new_empty((step, d))
    h_t = h.t()  # (d, rows)
    for lo in range(0, c, step):
        sel = cols[lo : lo + step]
        n = sel.numel()
        torch.index_select(weight, 0, sel, out=buf[:n])  # (n, d)
        if bias is None:
            torch.mm(buf[:n], h_t, out=out_t[lo : lo + n])
        else:
            torch.addmm(bias.index_select(0, sel).unsqueeze(1), buf[:n], h_t, out=out_t[lo : lo + n])
    return out_t.t().contiguous()


def cluster_logits(
    h: torch.Tensor,
    pm: PreparedMap,
    c: int,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    w8: Int8Weights | None = None,
) -> torch.Tensor:
    """Logits of rows ``h`` (all in cluster ``c``) over the cluster's own set, (rows, size_c); from the
    int8 rows ``w8`` when given (:func:`int8_cluster_logits`)."""
    if w8 is not None:
        return int8_cluster_logits(h, w8, pm, c)
    block = pm.blocks[c]
    if block is not None:
        return F.linear(h, block, pm.block_bias[c])  # contiguous cached block: no gather
    return gathered_logits(h, weight, bias, pm.ids[c])


def group_rows(clusters: Sequence[int]) -> dict[int, list[int]]:
    """Rows by cluster, clusters ascending, rows ascending within a cluster."""
    groups: dict[int, list[int]] = {}
    for row, c in enumerate(clusters):
        groups.setdefault(int(c), []).append(row)
    return dict(sorted(groups.items()))


def per_row_logits(
    h: torch.Tensor,
    clusters: Sequence[int],
    pm: PreparedMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    w8: Int8Weights | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row against its own cluster's set: rows grouped by cluster, one GEMM per group (from the int8
    rows ``w8`` when given).

    Returns ``(logits, ids)``: (rows, C) and shared ids (C,) when every row is in one cluster; otherwise
    (rows, W) and per-row ids (rows, W) with W the largest set among the rows' clusters, padding positions
    holding ``-inf`` and repeating the row's first id.
    """
    groups = group_rows(clusters)
    if len(groups) == 1:
        c = next(iter(groups))
        return cluster_logits(h, pm, c, weight, bias, w8), pm.ids[c]
    rows = h.shape[0]
    width = max(pm.sizes[c] for c in groups)
    logits = h.new_full((rows, width), -math.inf)  # (rows, W)
    ids = torch.empty((rows, width), dtype=torch.int64, device=h.device)  # (rows, W)
    for c, members in groups.items():
        n = pm.sizes[c]
        if len(members) == members[-1] - members[0] + 1:  # consecutive rows (beams of one sentence)
            sel: slice | torch.Tensor = slice(members[0], members[-1] + 1)
        else:
            sel = torch.tensor(members, dtype=torch.int64, device=h.device)
        logits[sel, :n] = cluster_logits(h[sel], pm, c, weight, bias, w8)
        ids[sel, :n] = pm.ids[c]
        if n < width:
            ids[sel, n:] = pm.ids[c][:1]
    return logits, ids


# ------------------------------------------------------------------------------------------- int8

# An int8 union step gathers its rows a block at a time and widens them to float32 in a buffer of this size,
# like the float32 gather's block, so the GEMM reads it from cache (256 KiB to 16 MiB tried: 4 MiB fastest).
INT8_GATHER_CHUNK_BYTES = 4 << 20
# Which of the two int8 union kernels is cheaper, from their per-column costs in microseconds at d 1024, one
# thread, by the rows of the step (benchmarks/bench_int8_gather.py on the 2-core AVX2 development VM, the
# median over unions of 5-40% of N: benchmarks/results/int8-gather-cpu-2026-11-26-cost-table.json): the gather
# per gathered column (random 1 KiB rows read, widened, multiplied in float32) against the packed fbgemm GEMM
# per vocabulary column (W read in order, int8 arithmetic). Neither is linear in rows: the float32 GEMM behind
# the gather runs 8, 12 and 24 rows at nearly the cost per column of 32, so the gather wins below a union of
# 18% of N at 1 row, 10-13% at 2-12 rows, 26-35% at 16-32 rows. Between the rows measured the costs are
# interpolated; beyond 32 rows both grow with the rows alike, so 32 rows' ratio decides. Both kernels give the
# same logits: the choice changes only the time.
INT8_COST_ROWS = (1, 2, 4, 6, 8, 12, 16, 24, 32)
INT8_GATHER_US = (0.344, 0.552, 0.582, 0.849, 1.372, 1.304, 0.893, 1.34, 1.357)
INT8_DENSE_US = (0.0605, 0.0681, 0.0656, 0.0867, 0.1385, 0.1647, 0.2485, 0.3432, 0.4688)


@dataclass
class Int8Weights:
    """W and b as the full projection's ``int8`` option holds them, for the clustered projection's int8 path.

    ``linear``: the dynamic int8 layer over all N columns (``kernels.int8.int8_linear``: one scale per
    output row, symmetric, packed for fbgemm): large unions and rows that get full logits. ``q`` and
    ``scale``: the same int8 rows unpacked, (N, d) and (N,) float32, for gathers. ``blocks[c]``: cluster
    ``c``'s rows packed alone (a cached cluster, the int8 counterpart of ``PreparedMap.blocks``; None when it
    is not cached). Every path computes the layer's own logits on its columns, to float rounding: the
    activations are quantised as the layer quantises them (``kernels.int8.quantize_input``).
    """

    linear: torch.nn.Module
    q: torch.Tensor  # (N, d) int8
    scale: torch.Tensor  # (N,) float32
    bias: torch.Tensor | None  # (N,) float32
    blocks: list[torch.ScriptObject | None]
    cached_bytes: int
    max_norm: float  # max_i ||w_i||: the certificate's bound on what input rounding moves a logit
    max_residual: float  # max_i ||w_i - scale_i q_i||: the same for the weights' rounding
    popular: PopularBlocks | None = None


# A union step's columns, ordered by how likely a row's set holds them, fall in blocks of this many: the
# popular ids' blocks are nearly full in every union of many rows and cost less run dense than gathered.
INT8_BLOCK_COLUMNS = 4096


@dataclass
class PopularBlocks:
    """The int8 rows of W in decreasing order of their ids' hit probability (:func:`hit_probability`),
    packed for fbgemm ``INT8_BLOCK_COLUMNS`` rows at a time: a union step runs the packed GEMM on the blocks
    its union fills densely enough and gathers the columns of the rest (:func:`int8_union_logits`).
    Costs ``2 N d`` bytes (fbgemm keeps each block's unpacked copy besides the packed one)."""

    rank: torch.Tensor  # (N,) int64: each id's position in the order
    block_columns: int
    packed: list[torch.ScriptObject]  # block j: the ids at positions [j * block_columns, (j + 1) * ...)


def int8_weights(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pm: PreparedMap,
    *,
    cache_bytes: int = 0,
    hit: np.ndarray | None = None,
) -> Int8Weights:
    """Quantise W once (as ``FullProjection(int8=True)`` does) and pack the most-populated clusters' rows
    alone, up to ``cache_bytes`` (each packed block holds its rows twice: fbgemm keeps the unpacked copy).
    With ``hit`` (the ids' hit probabilities) also pack W's rows in popularity order (:class:`PopularBlocks`),
    for union steps."""
    linear = int8.int8_linear(weight, bias)
    q, scale = int8.int8_rows(linear)
    b = None if bias is None else bias.detach().float().contiguous()
    blocks: list[torch.ScriptObject | None] = [None] * pm.r
    row_bytes, used = 2 * q.shape[1], 0
    for c in np.argsort(-pm.population, kind="stable"):
        need = pm.sizes[c] * row_bytes
        if pm.sizes[c] and used + need <= cache_bytes:
            ids = pm.ids[c]
            bias_c = None if b is None else b.index_select(0, ids)
            blocks[c] = int8.packed_rows(q.index_select(0, ids), scale.index_select(0, ids), bias_c)
            used += need
    max_norm, max_residual = _int8_residuals(weight, q, scale)
    return Int8Weights(
        linear=linear,
        q=q,
        scale=scale,
        bias=b,
        blocks=blocks,
        cached_bytes=used,
        max_norm=max_norm,
        max_residual=max_residual,
        popular=None if hit is None else popular_blocks(q, scale, b, hit),
    )


def popular_blocks(
    q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, hit: np.ndarray
) -> PopularBlocks:
    """Pack the int8 rows ``q`` in decreasing ``hit`` order, ``INT8_BLOCK_COLUMNS`` at a time."""
    order = torch.from_numpy(np.argsort(-hit, kind="stable"))
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    width = INT8_BLOCK_COLUMNS
    packed = []
    for lo in range(0, len(order), width):
        ids = order[lo : lo + width]
        packed.append(
            int8.packed_rows(
                q.index_select(0, ids), scale.index_select(0, ids), None if bias is None else bias[ids]
            )
        )
    return PopularBlocks(rank=rank, block_columns=width, packed=packed)


def _int8_residuals(
    weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, rows_per_chunk: int = 1 << 14
) -> tuple[float, float]:
    """``max_i ||w_i||`` and ``max_i ||w_i - scale_i q_i||`` in float32, a chunk of rows at a time."""
    norm = resid = 0.0
    for lo in range(0, weight.shape[0], rows_per_chunk):
        w = weight[lo : lo + rows_per_chunk].float()
        deq = q[lo : lo + rows_per_chunk].float() * scale[lo : lo + rows_per_chunk, None]
        norm = max(norm, float(w.norm(dim=1).max()))
        resid = max(resid, float((w - deq).norm(dim=1).max()))
    return norm, resid


def int8_logit_error(h: torch.Tensor, w8: Int8Weights) -> torch.Tensor:
    """Per row, a bound on ``|z_i - z8_i|`` over every column i, (rows,) float32: how far an int8 logit
    ``z8_i`` (the int8 layer's, of the batch ``h``) can be from the float32 logit ``z_i`` the certificate's
    tables bound. With the input quantised as ``s a`` (``kernels.int8.quantize_input``) and ``w_i`` as
    ``scale_i q_i``: ``z_i - z8_i = (h - s a)·w_i + s a·(w_i - scale_i q_i)``, at most
    ``||h - s a|| max||w_i|| + ||s a|| max||w_i - scale_i q_i||`` (Cauchy-Schwarz). The input's rounding is
    known per call, so the bound is a few percent of the certificate's own slope, not the worst case."""
    ints, h_scale = int8.quantize_input(h)
    deq = ints * h_scale  # (rows, d)
    return (h.float() - deq).norm(dim=1) * w8.max_norm + deq.norm(dim=1) * w8.max_residual


def int8_full_logits(h: torch.Tensor, w8: Int8Weights) -> torch.Tensor:
    """All N columns through the int8 layer, (rows, N) float32."""
    return w8.linear(h.float().contiguous())


def int8_gathered_logits(h: torch.Tensor, w8: Int8Weights, cols: torch.Tensor) -> torch.Tensor:
    """Logits of columns ``cols`` only from the int8 rows, (rows, C) float32: the layer's logits on them.

    :func:`int8_gather_gemm` for small unions; otherwise the layer over all N, keeping ``cols``
    (:func:`int8_dense_cheaper`).
    """
    if int8_dense_cheaper(cols.numel(), h.shape[0], w8.q.shape[0]):
        return int8_full_logits(h, w8).index_select(1, cols)
    return int8_gather_gemm(h, w8, cols)


def int8_union_logits(h: torch.Tensor, w8: Int8Weights, cols: torch.Tensor) -> torch.Tensor:
    """Logits of the union ``cols`` (sorted ids), (rows, C) float32, the layer's own on each column.

    Without :class:`PopularBlocks`: :func:`int8_gathered_logits`. With them, each block of the popularity
    order runs the packed GEMM over all its columns when the union holds enough of them that this costs less
    than gathering those (:func:`int8_dense_cheaper` on the block), keeping the union's; the union's other
    columns are gathered in one :func:`int8_gather_gemm`. Many rows' unions are dense in the popular blocks
    and sparse in the rest, so this is cheaper than either kernel over the whole union.
    """
    pb = w8.popular
    if pb is None:
        return int8_gathered_logits(h, w8, cols)
    rows, width = h.shape[0], pb.block_columns
    n_vocab = w8.q.shape[0]
    pos = pb.rank.index_select(0, cols)  # (C,) positions in the popularity order
    block = pos // width
    counts = torch.bincount(block, minlength=len(pb.packed)).numpy()
    dense = np.flatnonzero(int8_dense_cheaper(counts, rows, block_sizes(n_vocab, width))).tolist()
    if not dense:
        return int8_gather_gemm(h, w8, cols)
    if len(dense) == len(counts):
        return int8_full_logits(h, w8).index_select(1, cols)  # every block dense: one GEMM over all N
    # Every dense block's logits and the gathered columns' side by side in one (rows, S) buffer, then one
    # gather of the union's columns from it: cheaper than a scatter per block.
    slot = torch.full((len(counts),), -1, dtype=torch.int64)
    slot[dense] = torch.arange(len(dense))
    where = slot.index_select(0, block)  # (C,) the dense slot of each union column's block, -1: gathered
    rest = (where < 0).nonzero().squeeze(1)
    base = len(dense) * width
    src = torch.empty((rows, base + rest.numel()), dtype=torch.float32)
    x = h.float().contiguous()
    for i, j in enumerate(dense):
        part = int8.linear_packed(x, pb.packed[j])  # (rows, size_j)
        src[:, i * width : i * width + part.shape[1]] = part
    where = where * width + pos % width  # a dense column's place in src
    if rest.numel():
        src[:, base:] = int8_gather_gemm(h, w8, cols.index_select(0, rest))
        where[rest] = base + torch.arange(rest.numel())
    return src.index_select(1, where)


def int8_dense_cheaper(columns: int | np.ndarray, rows: int, n_vocab: int | np.ndarray) -> bool | np.ndarray:
    """Whether ``rows`` rows cost less over all ``n_vocab`` columns (packed int8 GEMM) than over ``columns``
    gathered ones (the measured costs :data:`INT8_GATHER_US`, :data:`INT8_DENSE_US` at ``rows``). ``columns``
    and ``n_vocab`` may be arrays (one decision per block of :class:`PopularBlocks`)."""
    gather = columns * float(np.interp(rows, INT8_COST_ROWS, INT8_GATHER_US))
    return gather > n_vocab * float(np.interp(rows, INT8_COST_ROWS, INT8_DENSE_US))


def block_sizes(n_vocab: int, width: int) -> np.ndarray:
    """Ids per block when ``n_vocab`` ids are cut into blocks of ``width`` (the last one shorter)."""
    return np.minimum(width, n_vocab - width * np.arange(-(-n_vocab // width)))


# The int8 union step skips the map at a row count where even 1 / DENSE_UNION_MARGIN of the union expected
# there (:func:`expected_union`; per block of :class:`PopularBlocks`, :func:`expected_block_unions`) would
# cost more gathered than the packed int8 GEMM over all N (over every block): the assignment and the union
# then cost time and save none. The expectation draws rows independently; a beam's rows share clusters and
# have smaller unions, hence the margin.
DENSE_UNION_MARGIN = 2.0


def hit_probability(pm: PreparedMap, n_vocab: int) -> np.ndarray:
    """Per id, the chance that a row in a cluster drawn by the clusters' populations has it in its set, (N,)
    float64 (always-active ids: 1)."""
    sizes = np.asarray(pm.sizes)
    pop = pm.population.astype(np.float64) * (sizes > 0)
    if pop.sum() == 0:  # no prediction counts: every non-empty cluster equally likely
        pop = (sizes > 0).astype(np.float64)
    p = pop / pop.sum()
    indptr, indices = pm.indptr.cpu().numpy(), pm.indices.cpu().numpy()
    hit = np.zeros(n_vocab)
    step = 256  # clusters at a time: a map of 2,000 sets of 20% of 256K ids holds 100M (cluster, id) pairs
    for lo in range(0, pm.r, step):
        hi = min(pm.r, lo + step)
        weights = np.repeat(p[lo:hi], sizes[lo:hi])
        hit += np.bincount(indices[indptr[lo] : indptr[hi]], weights=weights, minlength=n_vocab)
    return np.minimum(hit, 1.0)


def union_probability(hit: np.ndarray, rows: int) -> np.ndarray:
    """Each id's chance to be in the union of ``rows`` sets drawn independently, each holding it with
    probability ``hit``: ``1 - (1 - hit_i) ** rows``."""
    with np.errstate(divide="ignore"):  # hit 1: log1p(-1) = -inf, and the id is in every union
        return -np.expm1(rows * np.log1p(-hit))


def expected_union(hit: np.ndarray, rows: int) -> float:
    """Expected size of the union of ``rows`` sets drawn independently (:func:`union_probability`, summed)."""
    return float(union_probability(hit, rows).sum())


def int8_map_skipped(hit: np.ndarray, draws: int, rows: int, n_vocab: int, width: int | None) -> bool:
    """Whether an int8 union step of ``rows`` rows (``draws`` sets) skips the map: whether the packed GEMM
    beats the gather over all N (``width`` None) or over every block of ``width`` ids of
    :class:`PopularBlocks`, with ``1 / DENSE_UNION_MARGIN`` of the union expected there."""
    if width is None:
        return bool(int8_dense_cheaper(int(expected_union(hit, draws) / DENSE_UNION_MARGIN), rows, n_vocab))
    per_block = (expected_block_unions(hit, draws, width) / DENSE_UNION_MARGIN).astype(np.int64)
    return bool(np.all(int8_dense_cheaper(per_block, rows, block_sizes(n_vocab, width))))


def expected_block_unions(hit: np.ndarray, rows: int, width: int) -> np.ndarray:
    """:func:`expected_union` per block of ``width`` ids in decreasing ``hit`` order (the blocks of
    :class:`PopularBlocks`), (blocks,) float64."""
    inc = union_probability(np.sort(hit)[::-1], rows)
    return np.add.reduceat(inc, np.arange(0, len(inc), width))


def int8_gather_gemm(h: torch.Tensor, w8: Int8Weights, cols: torch.Tensor) -> torch.Tensor:
    """The input quantised as the layer does, the int8 rows ``cols`` gathered a block at a time and widened
    to float32 in a cache-sized buffer, one float32 GEMM per block: the layer's int32 sums exactly (integers
    below 2^24: ``127 * 127 * d`` for d up to 1040; beyond, within float32 rounding of them), scaled back as
    the layer scales them. (rows, C) float32."""
    c, rows, d = cols.numel(), h.shape[0], w8.q.shape[1]
    ints, h_scale = int8.quantize_input(h)  # (rows, d) float32 integers, 0-d scale
    step = max(1, INT8_GATHER_CHUNK_BYTES // (4 * d))
    buf8 = torch.empty((min(step, c), d), dtype=torch.int8)
    buf = torch.empty((min(step, c), d), dtype=torch.float32)
    acc_t = torch.empty((c, rows), dtype=torch.float32)  # (C, rows): each block fills contiguous rows
    ints_t = ints.t()
    for lo in range(0, c, step):
        sel = cols[lo : lo + step]
        n = sel.numel()
        torch.index_select(w8.q, 0, sel, out=buf8[:n])
        buf[:n].copy_(buf8[:n])
        torch.mm(buf[:n], ints_t, out=acc_t[lo : lo + n])
    logits = acc_t.t() * (h_scale * w8.scale.index_select(0, cols))
    if w8.bias is not None:
        logits += w8.bias.index_select(0, cols)
    return logits


def int8_cluster_logits(h: torch.Tensor, w8: Int8Weights, pm: PreparedMap, c: int) -> torch.Tensor:
    """Logits of rows ``h`` (all in cluster ``c``) over the cluster's own set from the int8 rows."""
    block = w8.blocks[c]
    if block is not None:
        return int8.linear_packed(h.float().contiguous(), block)  # packed once: no gather, int8 GEMM
    return int8_gathered_logits(h, w8, pm.ids[c])


# ------------------------------------------------------------------------------------------- inactive mass


@dataclass
class MassTables:
    """Per-cluster statistics of the columns outside each set, from the centroid's full logits ``z(C_c)``,
    and the model-wide sums that give a row's inactive mean and variance exactly.

    ``log_ratio[c]``: logsumexp over inactive columns - logsumexp over active columns;
    ``excess[c]``: logsumexp over inactive columns - their mean - log(their count), how far the tail sits
    above a flat distribution at its mean; ``inactive_var[c]``: the variance of the inactive logits.
    ``w_sum`` = sum of W's rows, ``b_sum`` = sum(b), ``gram`` = W^T W, ``w_b`` = W^T b, ``b_sq`` = b·b: with
    them the sum and the sum of squares of *all* N logits of a row cost O(d^2), so subtracting the computed
    columns gives the exact mean and variance of the inactive ones.
    """

    log_ratio: torch.Tensor  # (r,) float32
    excess: torch.Tensor  # (r,) float32
    inactive_var: torch.Tensor  # (r,) float32
    w_sum: torch.Tensor  # (d,) float32
    b_sum: float
    gram: torch.Tensor  # (d, d) float32
    w_b: torch.Tensor  # (d,) float32
    b_sq: float


def mass_tables(
    pm: PreparedMap, weight: torch.Tensor, bias: torch.Tensor | None, chunk_bytes: int = 1 << 28
) -> MassTables:
    """Precompute :class:`MassTables` once at load time: z(C_c) = W C_c + b for every centroid, in chunks."""
    n_vocab = weight.shape[0]
    device = weight.device
    cent = pm.centroids_t.T.to(weight.dtype)  # (r, d)
    r = cent.shape[0]
    log_ratio = torch.zeros(r, dtype=torch.float32, device=device)
    excess = torch.zeros(r, dtype=torch.float32, device=device)
    var = torch.zeros(r, dtype=torch.float32, device=device)
    step = max(1, chunk_bytes // (4 * n_vocab))
    sizes = torch.tensor(pm.sizes, dtype=torch.int64, device=device)
    for lo in range(0, r, step):
        hi = min(r, lo + step)
        z = F.linear(cent[lo:hi], weight, bias).float()  # (chunk, N)
        active = torch.zeros_like(z, dtype=torch.bool)
        seg = torch.repeat_interleave(torch.arange(hi - lo, device=device), sizes[lo:hi])
        active[seg, pm.indices[pm.indptr[lo] : pm.indptr[hi]]] = True
        lse_a = torch.logsumexp(z.masked_fill(~active, -math.inf), dim=1)
        lse_i = torch.logsumexp(z.masked_fill(active, -math.inf), dim=1)
        log_ratio[lo:hi] = lse_i - lse_a
        n_i = (~active).sum(dim=1).clamp(min=1).float()
        mean = z.masked_fill(active, 0.0).sum(dim=1) / n_i
        excess[lo:hi] = torch.where(n_i < n_vocab, lse_i - mean - torch.log(n_i), 0.0)
        var[lo:hi] = ((z - mean[:, None]).masked_fill(active, 0.0) ** 2).sum(dim=1) / n_i
    w = weight.float()
    b = None if bias is None else bias.float()
    return MassTables(
        log_ratio=log_ratio,
        excess=excess,
        inactive_var=var,
        w_sum=w.sum(dim=0),
        b_sum=0.0 if b is None else float(b.double().sum()),
        gram=w.T @ w,
        w_b=torch.zeros(w.shape[1], device=device) if b is None else w.T @ b,
        b_sq=0.0 if b is None else float((b.double() ** 2).sum()),
    )


def inactive_log_mass(
    method: str,
    h: torch.Tensor,
    logits: torch.Tensor,
    clusters: torch.Tensor,
    n_vocab: int,
    tables: MassTables,
) -> torch.Tensor:
    """Estimate of ``logsumexp`` over the columns a row did not compute, (rows,) float32.

    - ``centroid``: the row's own logsumexp shifted by the centroid's inactive/active log ratio.
    - ``moments``: ``log n_I + mean_I + excess_c * var_I / var_c``: the mean ``mean_I`` and variance
      ``var_I`` of the row's inactive logits are exact (sums over all N logits from ``w_sum``/``gram``, minus
      the computed columns); the tail's excess over the mean is the centroid's, rescaled by the variance
      ratio (a Gaussian tail's excess is var/2). On the demo model's states its error is 0.07 nats on
      average against 0.47 for ``centroid`` (benchmarks/README.md).
    """
    z = logits.float()  # (rows, C); padding is -inf
    if method == "centroid":
        return torch.logsumexp(z, dim=1) + tables.log_ratio[clusters]
    if method == "moments":
        hf = h.float()
        finite = torch.isfinite(z)
        zc = z.masked_fill(~finite, 0.0)
        n_i = (n_vocab - finite.sum(dim=1)).float()  # (rows,)
        n = n_i.clamp(min=1.0)
        s1 = hf @ tables.w_sum + tables.b_sum  # sum of all N logits
        s2 = ((hf @ tables.gram) * hf).sum(dim=1) + 2.0 * (hf @ tables.w_b) + tables.b_sq  # sum of squares
        mean = (s1 - zc.sum(dim=1)) / n
        var = ((s2 - (zc * zc).sum(dim=1)) / n - mean * mean).clamp(min=1e-6)
        scale = var / tables.inactive_var[clusters].clamp(min=1e-6)
        est = torch.log(n) + mean + tables.excess[clusters] * scale
        return torch.where(n_i > 0, est, torch.full_like(est, -math.inf))
    raise ValueError(f"unknown inactive-mass estimator {method!r}")


@dataclass
class NormaliserTables:
    """A second-order expansion, around each centroid, of the log-mass of the columns outside its set.

    With ``I_c`` the columns outside cluster ``c``'s set, ``p`` the softmax over ``I_c`` of the logits at
    the centroid ``C_c`` and ``dh = h - C_c``::

        log sum_{i in I_c} exp z_i(h) ~= lse[c] + grad[c]·dh + 1/2 dh^T Sigma_c dh

    ``lse[c]`` is exact at the centroid; ``grad[c] = sum_i p_i w_i`` (the gradient there, (r, d)) and
    ``Sigma_c = sum_i p_i (w_i - grad[c])(w_i - grad[c])^T`` (the Hessian). ``Sigma_c`` (d x d per cluster)
    is kept as ``curv[c] = U^T Sigma_c U`` in a basis ``U`` (d, k) shared by all clusters (the top
    eigenvectors of the clusters' mean ``Sigma``), plus ``resid[c]``, its mean variance outside ``U``: r k^2
    numbers instead of r d^2, O(k d) per row. Built once per map (``tasks/maps.py``) and stored in it.
    """

    lse: torch.Tensor  # (r,) float32, -inf for a cluster whose set covers every column
    grad: torch.Tensor  # (r, d) float32
    basis: torch.Tensor  # (d, k) float32
    curv: torch.Tensor  # (r, k, k) float32
    resid: torch.Tensor  # (r,) float32
    centroids: torch.Tensor  # (r, d) float32

    @property
    def rank(self) -> int:
        return self.basis.shape[1]


def normaliser_tables(
    centroids: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    rank: int,
    chunk_bytes: int = 1 << 28,
) -> NormaliserTables:
    """Compute :class:`NormaliserTables` for the sets ``(indptr, indices)`` (CSR on ``weight``'s device, the
    always-active ids already merged in: :func:`merged_csr`).

    Two passes over the centroids' full logits ``z(C_c) = W C_c + b`` (float32, ``chunk_bytes`` of clusters
    at a time): the first gives ``lse``, ``grad``, the trace of each ``Sigma_c`` and their mean, whose top
    ``rank`` eigenvectors are the basis; the second projects each ``Sigma_c`` on it.
    """
    device = weight.device
    n_vocab, d = weight.shape
    if not 0 <= rank <= d:
        raise ValueError(f"normaliser rank must be in [0, {d}], got {rank}")
    cent = centroids.to(device=device, dtype=torch.float32).contiguous()  # (r, d)
    r = cent.shape[0]
    w = weight.float()
    b = None if bias is None else bias.float()
    sizes = torch.diff(indptr)
    sq = (w * w).sum(dim=1)  # (N,) ||w_i||^2
    step = max(1, chunk_bytes // (4 * n_vocab * max(1, rank)))

    def softmax_chunk(lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        z = F.linear(cent[lo:hi], w, b)  # (chunk, N)
        seg = torch.repeat_interleave(torch.arange(hi - lo, device=device), sizes[lo:hi])
        z[seg, indices[indptr[lo] : indptr[hi]]] = -math.inf  # only the columns outside the set
        lse = torch.logsumexp(z, dim=1)  # (chunk,)
        p = torch.exp(z - lse[:, None]).nan_to_num_(0.0)  # (chunk, N); a full set leaves nothing: p = 0
        return lse, p

    lse = torch.empty(r, dtype=torch.float32, device=device)
    grad = torch.empty((r, d), dtype=torch.float32, device=device)
    trace = torch.empty(r, dtype=torch.float32, device=device)
    p_sum = torch.zeros(n_vocab, dtype=torch.float32, device=device)
    for lo in range(0, r, step):
        hi = min(r, lo + step)
        lse[lo:hi], p = softmax_chunk(lo, hi)
        grad[lo:hi] = p @ w
        trace[lo:hi] = p @ sq - (grad[lo:hi] ** 2).sum(dim=1)
        p_sum += p.sum(dim=0)
    # Mean Hessian over the clusters: its top eigenvectors carry most of every cluster's curvature.
    mean_sigma = (w.T * (p_sum / r)) @ w - (grad.T @ grad) / r  # (d, d)
    _, vecs = torch.linalg.eigh(mean_sigma.double())  # ascending eigenvalues
    basis = vecs[:, d - rank :].float().contiguous()  # (d, k)
    wu = w @ basis  # (N, k)
    gu = grad @ basis  # (r, k)
    curv = torch.empty((r, rank, rank), dtype=torch.float32, device=device)
    if rank:
        for lo in range(0, r, step):
            hi = min(r, lo + step)
            _, p = softmax_chunk(lo, hi)
            curv[lo:hi] = (p[:, :, None] * wu[None]).transpose(1, 2) @ wu  # (chunk, k, k)
        curv -= gu[:, :, None] * gu[:, None, :]
    inside = torch.diagonal(curv, dim1=1, dim2=2).sum(dim=1)  # (r,)
    resid = ((trace - inside) / (d - rank)).clamp(min=0.0) if rank < d else torch.zeros_like(trace)
    return NormaliserTables(lse=lse, grad=grad, basis=basis, curv=curv, resid=resid, centroids=cent)


def normaliser_log_mass(
    h: torch.Tensor,
    logits: torch.Tensor,
    ids: torch.Tensor,
    clusters: torch.Tensor,
    pm: PreparedMap,
    tables: NormaliserTables,
) -> torch.Tensor:
    """``logsumexp`` over the columns a row did not compute, (rows,) float32, from :class:`NormaliserTables`.

    The expansion gives the mass outside the row's *own* cluster's set. A row of a union batch computed
    more columns than that: their mass (exact, in ``logits``) is taken off the estimate; where the
    estimate is below it, nothing is left out (``-inf``).
    """
    est = normaliser_estimate(h, clusters, tables)
    if ids.dim() != 1 or logits.shape[1] == 0:
        return est  # per-row ids: each row computed exactly its own set
    uniq, inverse = torch.unique(clusters, return_inverse=True)
    cl = uniq.tolist()
    if len(cl) == 1 and ids.numel() == pm.sizes[cl[0]]:
        return est  # one cluster, and the union is its own set (no other probed cluster added to it)
    # (clusters in the batch, C): which computed columns belong to each cluster's own set
    own = torch.zeros((len(cl), ids.numel()), dtype=torch.bool, device=ids.device)
    pos = torch.searchsorted(ids, torch.cat([pm.ids[c] for c in cl]))
    seg = torch.repeat_interleave(
        torch.arange(len(cl), device=ids.device),
        torch.tensor([pm.sizes[c] for c in cl], device=ids.device),
    )
    own[seg, pos] = True
    return minus_other_sets(est, logits, own[inverse])


def normaliser_estimate(h: torch.Tensor, clusters: torch.Tensor, tables: NormaliserTables) -> torch.Tensor:
    """The expansion itself: ``logsumexp`` over the columns outside each row's own cluster's set, (rows,)."""
    dh = h.float() - tables.centroids[clusters]  # (rows, d)
    y = dh @ tables.basis  # (rows, k)
    quad = (torch.bmm(y[:, None, :], tables.curv[clusters]).squeeze(1) * y).sum(dim=1)  # (rows,)
    outside = ((dh * dh).sum(dim=1) - (y * y).sum(dim=1)).clamp(min=0.0)
    return (
        tables.lse[clusters]
        + (tables.grad[clusters] * dh).sum(dim=1)
        + 0.5 * (quad + tables.resid[clusters] * outside)
    )


def minus_other_sets(est: torch.Tensor, logits: torch.Tensor, own: torch.Tensor) -> torch.Tensor:
    """``est`` less the exact mass of the computed columns outside each row's own set (``own`` (rows, C)
    marks the row's own columns); ``-inf`` where that mass reaches the estimate. No host read."""
    extra = torch.logsumexp(logits.float().masked_fill(own, -math.inf), dim=1)  # (rows,)
    gap = (extra - est).clamp(max=0.0)
    left = est + torch.log(-torch.expm1(gap))  # log(exp(est) - exp(extra)); -inf when extra >= est
    return torch.where(torch.isneginf(extra), est, left)


# ------------------------------------------------------------------------------------------- certificate


@dataclass
class BoundTables:
    """What the exactness certificate needs: per cluster, bounds on the columns *outside* its set.

    Vocabulary columns are sorted by ``||w_i||`` (descending) and cut into ``G`` blocks of equal count,
    the same blocks for every cluster. For cluster ``c`` and block ``g`` over the inactive ids ``i``:
    ``top[c, g] = max_i z_i(C_c)`` and ``lse[c, g] = logsumexp_i z_i(C_c)``, with ``z(C_c) = W C_c + b`` the
    full logits at the centroid; ``norm[g] = max_i ||w_i||`` over the whole block.

    By Cauchy-Schwarz, ``z_i(h) = z_i(C_c) + w_i·(h - C_c) <= z_i(C_c) + ||w_i|| ||h - C_c||``, so with
    ``delta = ||h - C_c||``, every inactive logit of a row in cluster ``c`` is at most
    ``max_g top[c, g] + norm[g] * delta`` and their total mass at most
    ``logsumexp_g lse[c, g] + norm[g] * delta``. Blocks by norm keep the bound close to the per-column one
    (the norm within a block varies little) while a row costs O(G), not O(N).
    """

    top: torch.Tensor  # (r, G) float32, -inf where a block has no inactive column
    lse: torch.Tensor  # (r, G) float32
    norm: torch.Tensor  # (G,) float32
    centroids: torch.Tensor  # (r, d) float32: delta is measured in float32 whatever the weight dtype
    margin: float  # per unit of ||h||, added to the logit bound (rounding of logits in the weight's dtype)
    margin0: float  # the same for the bias term


def bound_tables(
    pm: PreparedMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    n_blocks: int = 64,
    chunk_bytes: int = 1 << 27,
) -> BoundTables:
    """Precompute :class:`BoundTables` once, at load time: ``z(C_c)`` for every centroid, in column chunks.

    Computed here rather than stored in the map because the inactive set is only known at load time (after
    ``min_count`` pruning and the always-active ids), and the cost is one (r x N x d) GEMM, streamed in
    column chunks so that no (r, N) tensor is held (float32 throughout, whatever the weight's dtype).
    """
    device = weight.device
    n_vocab, d = weight.shape
    r = pm.r
    cent = pm.centroids_t.T.float().contiguous()  # (r, d)
    norms = weight.float().norm(dim=1) if weight.dtype == torch.float32 else _row_norms(weight)  # (N,)
    order = torch.argsort(norms, descending=True, stable=True)  # (N,) column ids, largest norm first
    n_blocks = max(1, min(n_blocks, n_vocab))
    block = -(-n_vocab // n_blocks)  # columns per block (the last one may be shorter)
    n_blocks = -(-n_vocab // block)
    # Sorted position of every (cluster, id) pair of the sets, to mask the active columns chunk by chunk.
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n_vocab, device=device)
    pair_cluster = torch.repeat_interleave(
        torch.arange(r, device=device), torch.tensor(pm.sizes, dtype=torch.int64, device=device)
    )
    pair_pos = rank[pm.indices]
    pos_sorted, perm = torch.sort(pair_pos)
    pair_cluster = pair_cluster[perm]

    top = torch.full((r, n_blocks), -math.inf, dtype=torch.float32, device=device)
    lse = torch.full((r, n_blocks), -math.inf, dtype=torch.float32, device=device)
    norm = torch.zeros(n_blocks, dtype=torch.float32, device=device)
    blocks_per_chunk = max(1, chunk_bytes // (4 * max(r, d) * block))
    for g0 in range(0, n_blocks, blocks_per_chunk):
        g1 = min(n_blocks, g0 + blocks_per_chunk)
        lo, hi = g0 * block, min(n_vocab, g1 * block)
        cols = order[lo:hi]
        w = weight.index_select(0, cols).float()  # (n, d)
        z = cent @ w.T  # (r, n)
        if bias is not None:
            z += bias.index_select(0, cols).float()[None, :]
        a, b = torch.searchsorted(pos_sorted, torch.tensor([lo, hi], device=device)).tolist()
        z[pair_cluster[a:b], pos_sorted[a:b] - lo] = -math.inf  # the computed columns are not bounded
        pad = (g1 - g0) * block - (hi - lo)  # the last block may be short
        if pad:
            z = F.pad(z, (0, pad), value=-math.inf)
        zb = z.view(r, g1 - g0, block)
        top[:, g0:g1] = zb.amax(dim=2)
        lse[:, g0:g1] = torch.logsumexp(zb, dim=2)
        nb = norms[cols]
        if pad:
            nb = F.pad(nb, (0, pad), value=0.0)
        norm[g0:g1] = nb.view(g1 - g0, block).amax(dim=1)
    # Logits at decode time are computed in the weight's dtype: a logit may come out larger than its exact
    # value by a few ulps of its magnitude (at most ||h|| ||w|| + |b|); the margin keeps the bound above
    # what the full projection itself would compute. ||h|| is not known here: the bound scales with it.
    eps = torch.finfo(weight.dtype).eps
    max_b = 0.0 if bias is None else float(bias.float().abs().max())
    return BoundTables(
        top=top,
        lse=lse,
        norm=norm,
        centroids=cent,
        margin=float(8 * eps * float(norms.max())),
        margin0=float(8 * eps * max_b) + 1e-6,
    )


def _row_norms(weight: torch.Tensor, rows_per_chunk: int = 1 << 14) -> torch.Tensor:
    """``||w_i||`` in float32 without a float32 copy of a half-precision W."""
    out = torch.empty(weight.shape[0], dtype=torch.float32, device=weight.device)
    for lo in range(0, weight.shape[0], rows_per_chunk):
        out[lo : lo + rows_per_chunk] = weight[lo : lo + rows_per_chunk].float().norm(dim=1)
    return out


def inactive_bounds(
    h: torch.Tensor, clusters: torch.Tensor, tables: BoundTables
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, upper bounds on its cluster's inactive columns: ``(max logit, log of their total mass)``,
    each (rows,) float32 (see :class:`BoundTables`). Valid for any ``h``; tight when ``h`` is near ``C_c``."""
    hf = h.float()
    delta = (hf - tables.centroids[clusters]).norm(dim=1)  # (rows,)
    slope = tables.norm[None, :] * delta[:, None]  # (rows, G)
    # A logit off by e moves a logsumexp by at most e: both bounds get the rounding margin.
    margin = tables.margin * hf.norm(dim=1) + tables.margin0
    top = (tables.top[clusters] + slope).amax(dim=1) + margin
    mass = torch.logsumexp(tables.lse[clusters] + slope, dim=1) + margin
    return top, mass


def certify(
    logits: torch.Tensor,
    bound_top: torch.Tensor,
    bound_mass: torch.Tensor,
    k: int,
    log_tol: float | None,
) -> torch.Tensor:
    """Rows whose top-``k`` over the computed columns is the top-``k`` over all N, (rows,) bool.

    A row is certified when its ``k``-th best computed logit is above ``bound_top`` (no column left out can
    enter its top-k). With ``log_tol`` (beam search reads log-probs) the columns left out must also change
    the row's log-normaliser by at most ``log_tol``: ``log(1 + M / S) <= log_tol`` with ``M`` the bound on
    their mass and ``S`` the mass of the computed columns.
    """
    z = logits.float()
    if z.shape[1] < k:
        return torch.zeros(z.shape[0], dtype=torch.bool, device=z.device)
    kth = z.amax(dim=1) if k == 1 else torch.topk(z, k, dim=1).values[:, -1]  # (rows,)
    ok = kth > bound_top
    if log_tol is not None:
        # log(1 + M/S) <= tol  <=>  log M - log S <= log(expm1(tol)); no logsumexp over the row needed when
        # even its largest term cannot make S big enough (S >= exp(max z)).
        log_ratio = math.log(math.expm1(log_tol)) if log_tol > 0 else -math.inf
        ok &= bound_mass - z.amax(dim=1) <= log_ratio + math.log(z.shape[1])
        if bool(ok.any()):
            ok &= bound_mass - torch.logsumexp(z, dim=1) <= log_ratio
    return ok
