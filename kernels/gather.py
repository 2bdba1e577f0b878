"""Logits of the active columns only, float32 (or the weight's dtype): the rows of W a step needs, gathered
and multiplied, or a cluster's cached block; each row against its own cluster's set (per-row selection).

The torch twin of the CuPy gather-GEMM kernels (``cupy_ops``), and the CPU path. With int8 rows
(:class:`~fastvocab.kernels.int8_union.Int8Weights`) a cluster's logits come from ``int8_union``.

Shapes: ``h`` (rows, d); ``weight`` (N, d), one vocabulary entry contiguous; ``bias`` (N,) or None.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import cast

import numpy as np
import torch
import torch.nn.functional as F

from fastvocab import switches
from fastvocab.kernels import int8
from fastvocab.kernels.cluster_assign import PreparedMap
from fastvocab.kernels.int8_union import Int8Weights, int8_cluster_logits, int8_union_logits
from fastvocab.kernels.rowwise import numpy_can


def gathered_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cols: torch.Tensor
) -> torch.Tensor:
    """Logits of columns ``cols`` only, (rows, C): copy the active rows of W, then GEMM.

    On CPU, sets above ``switches.GATHER_CHUNK_BYTES`` are gathered and multiplied a cache-sized block at a
    time.
    """
    c, d = cols.numel(), weight.shape[1]
    row_bytes = d * weight.element_size()
    chunk = switches.GATHER_CHUNK_BYTES.get()
    if weight.device.type != "cpu" or c * row_bytes <= chunk:
        w = weight.index_select(0, cols)  # (C, d)
        b = None if bias is None else bias.index_select(0, cols)
        return F.linear(h, w, b)
    step = max(1, chunk // row_bytes)
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


@dataclass(frozen=True)
class BatchColumns:
    """Columns every step of one batch computes besides its rows' sets (a shortlist's candidates for the
    batch's sentences): ``ids`` (C,) sorted, ``mask`` (N,) bool, and, made once for the whole batch, on the
    float path ``weight`` (C, d) and ``bias`` (C,) gathered, on the int8 path ``packed``, their int8 rows
    packed for fbgemm (the full int8 layer's own logits on them, at its packed GEMM's cost a column)."""

    ids: torch.Tensor
    mask: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    packed: int8.PackedRows | None = None  # fbgemm only: made per batch, too briefly held for a session

    @cached_property
    def held(self) -> np.ndarray:
        """The mask on the host (:func:`_new_columns`), read at the batch's first step with few clusters."""
        return self.mask.cpu().numpy()

    @cached_property
    def held_ids(self) -> np.ndarray:
        """``ids`` on the host (:func:`batch_block_logits` on CPU)."""
        return self.ids.cpu().numpy()

    @classmethod
    def of(
        cls,
        ids: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        w8: Int8Weights | None = None,
    ) -> BatchColumns:
        mask = torch.zeros(weight.shape[0], dtype=torch.bool, device=weight.device)
        mask[ids] = True
        if w8 is not None:
            b8 = None if w8.bias is None else w8.bias.index_select(0, ids)
            packed = int8.packed_rows(w8.q.index_select(0, ids), w8.scale.index_select(0, ids), b8)
            return cls(ids, mask, None, None, packed)
        return cls(
            ids,
            mask,
            weight.index_select(0, ids).contiguous(),
            None if bias is None else bias.index_select(0, ids),
        )


def batch_union_logits(
    h: torch.Tensor,
    cols: BatchColumns,
    sets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    w8: Int8Weights | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of the batch's columns and of the rows' sets ``sets`` ((N,) bool), ``(logits, ids)``, (rows, C)
    and (C,): the batch's columns from what :meth:`BatchColumns.of` made once per batch (gathered float rows,
    or packed int8 ones with ``w8``), only the sets' other columns gathered at this step. ``ids`` are the
    batch's, then the others, each run sorted."""
    rest = (sets & ~cols.mask).nonzero().squeeze(1)
    pre = _batch_logits(h, cols)
    if not rest.numel():
        return pre, cols.ids
    other = gathered_logits(h, weight, bias, rest) if w8 is None else int8_union_logits(h, w8, rest)
    return torch.cat([pre, other], dim=1), torch.cat([cols.ids, rest])


def batch_block_logits(
    h: torch.Tensor,
    cols: BatchColumns,
    pm: PreparedMap,
    clusters: Sequence[int],
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    w8: Int8Weights | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`batch_union_logits` for rows in a few ``clusters`` (distinct, ascending), each with its block
    cached (``pm.blocks[c]``, or ``w8.blocks[c]`` with ``w8``): every row through every block whole, then
    the columns the batch holds already, or an earlier block held, dropped from their logits. The same
    logits and ids, without the mask over N, its compaction and the gather, which at a few rows cost more
    than the GEMMs (a greedy step at batch 1: 260 -> 140 us with the demo model)."""
    if w8 is not None and cols.packed is not None:  # int8: every GEMM of the step in one call
        blocks8 = [cast(int8.PackedRows, w8.blocks[c]) for c in clusters]  # packed at first use
        *parts, batch = int8.linear_packed_many(h.float().contiguous(), [*blocks8, cols.packed])
    else:
        parts = [cluster_logits(h, pm, c, weight, bias, w8) for c in clusters]
        batch = _batch_logits(h, cols)
    keep, ids = _new_columns(cols, pm, clusters)
    if numpy_can(batch):  # the same copies in numpy
        blocks = np.concatenate([p.numpy() for p in parts], axis=1) if len(parts) > 1 else parts[0].numpy()
        logits = np.concatenate([batch.numpy(), blocks[:, keep]], axis=1)
        return torch.from_numpy(logits), torch.from_numpy(np.concatenate([cols.held_ids, ids]))
    device = cols.ids.device
    blocks_t = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
    logits_t = blocks_t.index_select(1, torch.from_numpy(keep).to(device))
    return torch.cat([batch, logits_t], dim=1), torch.cat([cols.ids, torch.from_numpy(ids).to(device)])


def _new_columns(
    cols: BatchColumns, pm: PreparedMap, clusters: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """Of the sets of ``clusters`` laid side by side, the positions to keep and their ids, each (K,) int64
    on the host: every id the batch does not hold, once (its first place), ids ascending. Worked out in
    numpy: the same in tensor ops took ~25 of them, each costing more than its work at a few hundred ids."""
    indptr, indices = pm.host_csr
    parts = [indices[indptr[c] : indptr[c + 1]] for c in clusters]
    ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
    pos = np.flatnonzero(~cols.held[ids])  # the ids the batch does not hold
    if len(parts) == 1:  # one set: its ids are distinct and ascending already
        return pos, ids[pos]
    new, first = np.unique(ids[pos], return_index=True)  # a stable sort: each id's first place
    return pos[first], new


def _batch_logits(h: torch.Tensor, cols: BatchColumns) -> torch.Tensor:
    """The rows' logits over the batch's columns, (rows, C_batch), from their contiguous (or packed) rows."""
    if cols.packed is not None:
        return int8.linear_packed(h.float().contiguous(), cols.packed)
    assert cols.weight is not None  # gathered for the float path
    return F.linear(h, cols.weight, cols.bias)


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
