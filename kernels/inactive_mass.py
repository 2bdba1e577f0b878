"""Estimates of the probability mass of the columns a row did not compute (``inactive_mass``), so that beam
scores stay comparable across hypotheses: ``centroid`` and ``moments`` from :class:`MassTables` computed at
load time, ``normaliser`` from :class:`NormaliserTables`, a second-order expansion stored in the map.

Shapes: ``h`` (rows, d); ``weight`` (N, d), one vocabulary entry contiguous; ``bias`` (N,) or None.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from fastvocab.kernels.base import ProjectionOutput
from fastvocab.kernels.cluster_assign import PreparedMap


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
    has_bias: bool = True  # False: b_sum, w_b and b_sq are zero, and a step skips adding them
    per_cluster: torch.Tensor = field(init=False)  # (r, 2): excess and floored inactive_var, one index a step

    def __post_init__(self) -> None:
        self.per_cluster = torch.stack([self.excess, self.inactive_var.clamp(min=1e-6)], dim=1)

    @functools.cached_property
    def host(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``w_sum``, ``gram``, ``w_b`` and ``per_cluster`` on the host (the compiled CPU step's)."""
        w_sum, gram, w_b, per_cluster = (
            t.float().cpu().contiguous().numpy() for t in (self.w_sum, self.gram, self.w_b, self.per_cluster)
        )
        return w_sum, gram, w_b, per_cluster


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
        has_bias=b is not None,
    )


def inactive_log_mass(
    method: str,
    h: torch.Tensor,
    logits: torch.Tensor,
    clusters: torch.Tensor,
    n_vocab: int,
    tables: MassTables,
    padded: bool = True,
) -> torch.Tensor:
    """Estimate of ``logsumexp`` over the columns a row did not compute, (rows,) float32. ``padded``: rows
    may hold -inf padding (per-row sets, a static union); False when every row computed every column of
    ``logits`` (a union), which spares ``moments`` three passes over them.

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
        if not padded and z.device.type == "cpu":
            return _moments_union_cpu(hf, z, clusters, n_vocab - z.shape[1], tables)
        # A step at a few rows costs its number of tensor ops (each about as much as its arithmetic), so the
        # count given by a union (every row computed the same columns) or a model without bias is used as
        # a number, not as tensors; the arithmetic is the same.
        if padded:
            finite = torch.isfinite(z)
            zc = z.masked_fill(~finite, 0.0)
            n_i = (n_vocab - finite.sum(dim=1)).float()  # (rows,)
            n = n_i.clamp(min=1.0)
        else:
            zc, count = z, n_vocab - z.shape[1]
            n = torch.full((z.shape[0],), float(max(count, 1)), device=z.device)
        s1, s2 = _logit_sums(hf, tables)
        mean = (s1 - zc.sum(dim=1)) / n
        var = ((s2 - (zc * zc).sum(dim=1)) / n - mean * mean).clamp(min=1e-6)
        stats = tables.per_cluster[clusters]  # (rows, 2): excess, inactive variance
        est = torch.log(n) + mean + stats[:, 0] * (var / stats[:, 1])
        if not padded:
            return est if count > 0 else torch.full_like(est, -math.inf)
        return torch.where(n_i > 0, est, torch.full_like(est, -math.inf))
    raise ValueError(f"unknown inactive-mass estimator {method!r}")


def _logit_sums(hf: torch.Tensor, tables: MassTables) -> tuple[torch.Tensor, torch.Tensor]:
    """The sum of each row's N logits and the sum of their squares, (rows,) each, from the model-wide sums."""
    s1 = hf @ tables.w_sum
    s2 = ((hf @ tables.gram) * hf).sum(dim=1)
    if tables.has_bias:
        s1 = s1 + tables.b_sum
        s2 = s2 + 2.0 * (hf @ tables.w_b) + tables.b_sq
    return s1, s2


def _moments_union_cpu(
    hf: torch.Tensor, z: torch.Tensor, clusters: torch.Tensor, count: int, tables: MassTables
) -> torch.Tensor:
    """``moments`` for a union on CPU: one compiled call (``host_moments.moments_union``; numba, imported
    on first use) where the tensor path makes ~15 operations, each costing more than its work at a step's
    few rows. The same estimate to float32 rounding (its sums run in float64)."""
    if count <= 0:  # the union holds every column: nothing is inactive
        return torch.full((z.shape[0],), -math.inf)
    from fastvocab.kernels.host_moments import moments_union

    out = np.empty(z.shape[0], dtype=np.float32)
    w_sum, gram, w_b, per_cluster = tables.host
    rows, logits, near = (t.contiguous().numpy() for t in (hf, z, clusters))
    sums = (w_sum, gram, w_b, tables.b_sum, tables.b_sq, tables.has_bias)
    moments_union(rows, logits, near, count, *sums, per_cluster, out)
    return torch.from_numpy(out)


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
    sorted_ids, order = torch.sort(ids)  # a batch's pre-gathered columns come first: ids may be unsorted
    pos = order[torch.searchsorted(sorted_ids, torch.cat([pm.ids[c] for c in cl]))]
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


def oracle_log_mass(logits: torch.Tensor, ids: torch.Tensor, full: torch.Tensor) -> torch.Tensor:
    """Exact ``logsumexp`` of the logits a row did not compute, (rows,) float32 (the ``oracle`` estimate),
    from the row's ``full`` logits (rows, N) float32."""
    # per-row padding repeats an id with -inf; dense() keeps the real logit: only computed columns are finite
    computed = torch.isfinite(ProjectionOutput(logits, ids, full.shape[1]).dense())
    return torch.logsumexp(full.masked_fill(computed, -math.inf), dim=1)
