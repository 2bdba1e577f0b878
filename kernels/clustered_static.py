"""Union-mode clustered projection with a static capacity: no device-to-host sync, so a CUDA graph (or
``torch.compile(fullgraph=True)``) can hold the whole step.

Today's union mode (``ClusteredProjection(selection="union")``) reads the union's column count back to the
host every step (``cupy_ops.compact``, the ``nonzero`` of ``union_columns``): the GEMM's shape depends on it.
Here the shape is fixed in advance to a capacity ``C`` and the count stays on the device:

1. cluster of each row: ``cluster_assign.assign_clusters`` (one GEMM + argmin, no sync);
2. mark: every row's CSR range expanded to a static (rows, max_size) grid of candidate ids (positions past a
   row's set point to a dump slot ``N``) and scattered into a mask over ``N + 1``;
3. compact: inclusive ``cumsum`` of the mask gives each marked id its slot; ids whose slot is ``>= C`` (and
   unmarked ids) go to a dump slot ``C``, so one ``scatter_`` of ``arange(N)`` writes the sorted union into
   ``ids[:count]`` with static shapes (the same scan + scatter as ``cupy_ops.compact``, without reading C);
4. logits of the C columns (gather + GEMM), the padded columns ``[count, C)`` set to ``-inf`` and their ids
   repeating the first union id (``ProjectionOutput``'s padding convention).

Overflow: ``count > C`` cannot be represented. The step then keeps the first C union columns *and* raises a
device flag (``StaticUnionOutput.overflow``); a caller must not use such an output as is.
:meth:`StaticUnion.project` (eager) reads the flag once and returns the full logits for that step (and grows
the capacity when asked); a captured decoding loop passes ``overflow_acc`` (a sticky device flag) and checks
it where the search syncs anyway (its stop check), redoing those steps on the eager path. ``capacity=None``
takes the sum of the ``rows`` largest sets (capped at N): the union can never exceed it, so no overflow is
possible, at the cost of computing padded columns when sets overlap. The GEMM always reads C rows of W, so a
capacity close to the unions decoding sees (a configured one) is what keeps the cost near today's union mode.

The projection's inactive-mass estimate comes along (``centroid``, ``moments``, ``normaliser``: the same
numbers as union mode's, with static shapes: the normaliser's "columns of the row's own set" mask is
scattered from the same candidate grid), so beam search scores hypotheses as the eager union does. The
exactness certificate and ``mass_radius`` give some rows full logits, a shape no static step has: a
projection with either is refused.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

from fastvocab.kernels.base import CapturableStep, ProjectionOutput
from fastvocab.kernels.cluster_assign import PreparedMap, assign_clusters
from fastvocab.kernels.inactive_mass import (
    MassTables,
    NormaliserTables,
    inactive_log_mass,
    minus_other_sets,
    normaliser_estimate,
)

log = logging.getLogger(__name__)


@dataclass
class StaticUnionOutput:
    """One static-capacity union step; every field stays on the device.

    logits: (rows, C) in the weight's dtype, ``-inf`` at padded positions ``[count, C)``.
    ids: (C,) int64, the sorted union in ``[0, min(count, C))``, then the first union id repeated.
    count: 0-d int64, the union's size (may exceed C: then ``overflow``).
    overflow: 0-d bool, ``count > C``: the output lacks columns and must not be used.
    clusters: (rows,) int64, each row's cluster.
    log_inactive_mass: (rows,) float32, the projection's estimate of the mass not computed, or None.
    """

    logits: torch.Tensor
    ids: torch.Tensor
    count: torch.Tensor
    overflow: torch.Tensor
    clusters: torch.Tensor
    log_inactive_mass: torch.Tensor | None = None

    def output(self, n_vocab: int) -> ProjectionOutput:
        """As a ``ProjectionOutput`` (trustworthy only without ``overflow``)."""
        return ProjectionOutput(self.logits, self.ids, n_vocab, log_inactive_mass=self.log_inactive_mass)


@dataclass
class UnionColumns:
    """:func:`static_union_columns`' result; every field on the device."""

    ids: torch.Tensor  # (C,) int64, the sorted union, then the first union id repeated
    valid: torch.Tensor  # (C,) bool, position < count
    count: torch.Tensor  # 0-d int64
    overflow: torch.Tensor  # 0-d bool, count > C
    own: torch.Tensor | None  # (rows, C) bool, column in the row's own set (only when asked for)


def union_capacity(sizes: list[int], rows: int, n_vocab: int, covered: int | None = None) -> int:
    """The smallest capacity a union of ``rows`` sets can never exceed: the ``rows`` largest sizes summed,
    and at most ``covered``, the ids that are in any set of the map (else ``n_vocab``).

    ``covered`` is what keeps the bound useful beyond a few rows: sets of ~10% of N summed over 40 rows
    reach N, while a direction's sets together hold its target language's share of a multilingual
    vocabulary (380 ids, 1.2% of N, on the demo en-it map; benchmarks/results/
    static-union-capacity-cpu-2026-11-24.json)."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    return min(n_vocab if covered is None else covered, sum(sorted(sizes, reverse=True)[:rows]))


def static_union_columns(
    clusters: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    n_vocab: int,
    max_size: int,
    capacity: int,
    own: bool = False,
) -> UnionColumns:
    """Sorted union of the rows' sets in a fixed-size buffer, with device ops only (:class:`UnionColumns`;
    ``own``: also each row's mask of its own set's columns, for the normaliser estimate)."""
    dev = clusters.device
    offs = torch.arange(max_size, device=dev)  # (S,)
    start = indptr[clusters]  # (rows,)
    size = indptr[clusters + 1] - start  # (rows,)
    in_set = offs[None, :] < size[:, None]  # (rows, S)
    pos = torch.where(in_set, start[:, None] + offs[None, :], 0)  # (rows, S), a valid address everywhere
    cand = torch.where(in_set, indices[pos], n_vocab)  # (rows, S); past a row's set: the dump slot N
    mark = torch.zeros(n_vocab + 1, dtype=torch.int32, device=dev)
    mark.index_fill_(0, cand.reshape(-1), 1)
    mark = mark[:n_vocab]  # (N,)
    slot = torch.cumsum(mark, 0) - 1  # (N,) int64: the output position of each marked id
    count = slot[-1] + 1  # 0-d, on the device
    target = torch.where((mark > 0) & (slot < capacity), slot, capacity)  # unmarked / beyond C: dump slot C
    ids = torch.zeros(capacity + 1, dtype=torch.int64, device=dev)
    ids.scatter_(0, target, torch.arange(n_vocab, device=dev))
    ids = ids[:capacity]  # (C,)
    valid = torch.arange(capacity, device=dev) < count  # (C,)
    ids = torch.where(valid, ids, ids[:1])  # padding repeats the first union id (count >= 1 always)
    own_mask = None
    if own:
        at = slot[cand.clamp(max=n_vocab - 1)]  # (rows, S) each candidate's output position
        at = torch.where(in_set & (at < capacity), at, capacity)  # past the set or beyond C: dump column C
        own_mask = torch.zeros((cand.shape[0], capacity + 1), dtype=torch.bool, device=dev)
        own_mask = own_mask.scatter_(1, at, True)[:, :capacity]
    return UnionColumns(ids, valid, count, count > capacity, own_mask)


def static_union_logits(
    h: torch.Tensor,
    pm: PreparedMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    capacity: int,
    overflow_acc: torch.Tensor | None = None,
    inactive_mass: str = "none",
    tables: MassTables | NormaliserTables | None = None,
) -> StaticUnionOutput:
    """The whole union step at a static capacity ``C`` (see the module docstring); no host sync.

    ``overflow_acc``: a 0-d bool device tensor OR-ed in place with this step's overflow (a captured loop
    checks it once at its next host sync). ``inactive_mass`` / ``tables``: the estimate of the mass not
    computed, as ``ClusteredProjection`` makes it (``none``: no estimate).
    """
    n_vocab = weight.shape[0]
    clusters = assign_clusters(h, pm.centroids_t, pm.sq_norms)  # (rows,)
    normaliser = isinstance(tables, NormaliserTables)
    cols = static_union_columns(
        clusters, pm.indptr, pm.indices, n_vocab, pm.max_size, capacity, own=normaliser
    )
    w = weight.index_select(0, cols.ids)  # (C, d)
    b = None if bias is None else bias.index_select(0, cols.ids)
    logits = F.linear(h, w, b).masked_fill_(~cols.valid[None, :], -math.inf)  # (rows, C)
    if overflow_acc is not None:
        overflow_acc.logical_or_(cols.overflow)
    mass = None
    if isinstance(tables, NormaliserTables) and cols.own is not None:
        mass = minus_other_sets(normaliser_estimate(h, clusters, tables), logits, cols.own)
    elif isinstance(tables, MassTables):
        mass = inactive_log_mass(inactive_mass, h, logits, clusters, n_vocab, tables)
    return StaticUnionOutput(logits, cols.ids, cols.count, cols.overflow, clusters, log_inactive_mass=mass)


class UnionSource(Protocol):
    """What :class:`StaticUnion` reads of a union-mode clustered projection (``ClusteredProjection``)."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    inactive_mass: str
    exact_k: int
    mass_radius: float | None

    @property
    def prepared_map(self) -> PreparedMap: ...

    @property
    def mass_tables(self) -> MassTables | NormaliserTables | None: ...


class StaticUnion:
    """A static-capacity union step over a clustered projection's prepared map.

    ``StaticUnion(proj, capacity=None, rows=...)``: ``proj`` is a ``ClusteredProjection`` (its map, W and
    b are shared, not copied, and so is its inactive-mass estimate); ``capacity`` the column budget C, or
    None for the overflow-free bound of ``rows`` rows (:func:`union_capacity`). :meth:`step` is the
    capturable step; :meth:`project` the eager one, which returns a ``ProjectionOutput`` and never drops a
    column (full logits on overflow).
    """

    def __init__(
        self, proj: UnionSource, *, capacity: int | None = None, rows: int | None = None, grow: bool = True
    ) -> None:
        if proj.exact_k or proj.mass_radius is not None:
            raise ValueError(
                "a static union cannot certify rows or send far ones to full logits (a shape it cannot "
                "hold): build the clustered projection without exact_k / mass_radius"
            )
        self.inactive_mass: str = proj.inactive_mass
        if self.inactive_mass not in ("none", "centroid", "moments", "normaliser"):
            raise ValueError(f"a static union has no {self.inactive_mass!r} inactive-mass estimate")
        self.tables: MassTables | NormaliserTables | None = proj.mass_tables
        pm = proj.prepared_map
        self.map = pm
        self.weight: torch.Tensor = proj.weight
        self.bias: torch.Tensor | None = proj.bias
        self.n_vocab = int(self.weight.shape[0])
        h_dtype = self.weight.dtype
        if h_dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"unsupported weight dtype {h_dtype}")
        if capacity is None:
            if rows is None:
                raise ValueError("give capacity, or rows to size the overflow-free capacity")
            capacity = union_capacity(pm.sizes, rows, self.n_vocab, pm.covered)
        if not 1 <= capacity <= self.n_vocab:
            raise ValueError(f"capacity must be in [1, {self.n_vocab}], got {capacity}")
        self.capacity = int(capacity)
        self.grow = grow
        self.fallbacks = 0  # eager steps that overflowed and returned full logits

    def step(self, h: torch.Tensor, overflow_acc: torch.Tensor | None = None) -> StaticUnionOutput:
        """The step with static shapes and no host sync (CUDA-graph capturable)."""
        return static_union_logits(
            h.to(self.weight.dtype),
            self.map,
            self.weight,
            self.bias,
            self.capacity,
            overflow_acc,
            self.inactive_mass,
            self.tables,
        )

    def capturable(self, rows: int) -> CapturableStep:
        """:meth:`step` as a search captures it: a ``ProjectionOutput`` per call (padded columns: ``-inf``
        logits, ids repeating a real one), a fresh overflow flag, and :meth:`project` to decode again with
        when it is set. ``rows`` is not read: the capacity was fixed at construction."""
        overflow = torch.zeros((), dtype=torch.bool, device=self.weight.device)

        def project(h: torch.Tensor) -> ProjectionOutput:
            return self.step(h, overflow).output(self.n_vocab)

        return CapturableStep(project, overflow=overflow, fallback=self.project)

    def project(self, h: torch.Tensor) -> ProjectionOutput:
        """Eager step: one host read of the overflow flag; full logits for an overflowing step (and, with
        ``grow``, a capacity that holds this union from the next step on)."""
        out = self.step(h)
        if not bool(out.overflow):  # the one sync, eager path only
            return out.output(self.n_vocab)
        self.fallbacks += 1
        if self.grow:
            need = int(out.count)
            self.capacity = min(self.n_vocab, 1 << (need - 1).bit_length())
            log.info("static union: %d columns > capacity; capacity grown to %d", need, self.capacity)
        logits = F.linear(h.to(self.weight.dtype), self.weight, self.bias)
        return ProjectionOutput(logits=logits, ids=None, n_vocab=self.n_vocab)
