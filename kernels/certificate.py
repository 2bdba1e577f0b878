"""The exactness certificate (``exact_k``): per row, upper bounds on the logits and on the mass of the columns
it did not compute (:class:`BoundTables`, computed at load time), and which rows those bounds prove to have
the top-k of all N columns (:func:`certify`).

Shapes: ``h`` (rows, d); ``weight`` (N, d), one vocabulary entry contiguous; ``bias`` (N,) or None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fastvocab.kernels.cluster_assign import PreparedMap


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
