"""Clustered vocabulary projection (Amer et al. 2022, Sec. 2.3), and beyond it a per-row selection.

At each decoding step:

1. cluster of each row, Eq. 2: ``argmin_j ||C_j||^2 - 2 h·C_j`` (norms precomputed): one small GEMM + argmin;
2. ``selection="union"`` (the paper): union of the rows' active sets (boolean mask over N, compacted to column
   ids), logits of those columns only, shared ids (C,);
   ``selection="per-row"``: rows grouped by cluster, each group against its own set, per-row ids (rows, W)
   padded with ``-inf`` (or shared ids when every row falls in one cluster), so a batch of 40 rows does
   not pay for the union of 40 sets;
3. optionally an estimate of the probability mass of the columns not computed
   (``ProjectionOutput.log_inactive_mass``), so beam scores stay comparable across hypotheses. Greedy search
   needs none. ``inactive_mass="normaliser"`` expands the log-mass around the row's centroid to second order
   from tables stored in the map (exact at the centroid; ``inactive_mass.NormaliserTables``);
   ``centroid`` and ``moments`` estimate it from statistics computed at load time
   (``inactive_mass.inactive_log_mass``). ``normaliser`` errs least, and its error grows with the row's
   distance to the centroid (the measured errors of each estimator:
   docs/decisions/0006-moments-with-a-shortlist.md).
   ``mass_radius`` gives rows farther than it from their centroid (where the expansion errs most) the exact
   mass, from their full logits; ``inactive_mass="oracle"`` is the exact mass of every row, a diagnostic of
   the fidelity harness.

4. optionally (``exact_k``) an exactness certificate per row: an upper bound on every logit the row did not
   compute (``certificate.BoundTables``: the centroid's logits plus ``||w_i|| ||h - C_c||``). A row whose
   ``exact_k``-th best computed logit beats it has the exact top-``exact_k``; for ``exact_k > 1`` (beam
   search, which reads log-probs) the bound on the left-out mass must also move its log-normaliser by at most
   ``exact_tol``. Rows that fail get the full logits in the same call (the output is then dense), so greedy
   and beam search return what full softmax returns, with no change to the search.

Always-active ids (EOS, language tags) are added to every cluster's set at load time.

``shortlist`` (union selection, torch backend): a lexical shortlist of the same model and direction joins
the clusters' sets. The search binds the projection to each batch (``for_batch``, as it binds a shortlist),
and every step of that batch computes the union of its rows' sets and the candidates of the batch's source
sentences (``kernels/shortlist.py``). The clusters' sets miss mostly the source-specific content words that
a shortlist holds, so far smaller sets (K = 1) reach the same fidelity with the two together (measured:
benchmarks/README.md, "Clustered sets plus the sentence's shortlist").

Backends, chosen once in ``__init__`` from the weight's device (``clustered_load.pick_backend``; never
re-detected in the hot loop):

- ``torch`` (CPU and CUDA): ``cluster_assign``, ``gather``, ``inactive_mass`` and ``certificate``, also the
  oracle of the CuPy kernels (and ``int8_union``, CPU only). On CPU the contiguous sub-matrix ``W[set_c]`` of
  the most-populated clusters is cached (``cache_mb``), so a row whose cluster is cached costs one small GEMV
  with no gather: that is what makes batch-1 decoding fast on CPU.
- ``cupy`` (CUDA, fp16/bf16, sm_80+, d % 32 == 0): mask/compaction kernels and a fused gather-GEMM on tensor
  cores (``cupy_ops``), reading only the active rows of W once. CuPy is imported only then.

``int8=True`` (torch backend, CPU only, as ``FullProjection``'s ``int8`` option): W quantised once, int8 per
output row, the logits of the active columns those of the full int8 projection (``int8_union.Int8Weights``:
a union step gathers ``u N d`` int8 bytes instead of float32 ones, or runs the packed int8 GEMM over all N
when its union is large; cached clusters are packed int8 blocks). The inactive-mass estimates and the
certificate keep their float32 tables; the certificate adds a bound on how far an int8 logit is from the
float32 one, and rows without a certificate get the full int8 logits, so ``exact_k`` makes each row's top-k
that of the full int8 projection (which, like it, quantises its input per call: a row's int8 logits move
slightly with the rows beside it). In union mode the int8 rows are also packed in blocks, ids ordered by how
many clusters' sets hold them (``int8_union.PopularBlocks``): a step runs the packed GEMM on the blocks its
union fills densely and gathers the rest (``int8_union.int8_union_logits``). At a row count where the
union the map's sets are expected to form would fill every block densely enough
(``int8_union.int8_map_skipped``, with a margin for a beam's shared clusters), the step skips the map
altogether and returns the full int8 logits (``full_when_cheaper``; counted in ``counters["full"]``): the
assignment and the union would cost time there and save none. The tables price the two kernels alone, so the
projection also times its own map step against the full int8 step at 16-128 rows when it is built
(``kernels.map_probe``, kept per machine and map), and steps of as many rows skip the map where it measured
slower (on a 2-core Xeon with AMX, where the full GEMM runs on ONNX Runtime, from 16 rows at d 256).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastvocab import switches
from fastvocab.artifacts_schema.cluster_map import ClusterMap
from fastvocab.kernels.base import CapturableStep, Projection, ProjectionOutput, register
from fastvocab.kernels.certificate import BoundTables, bound_tables, certify, inactive_bounds
from fastvocab.kernels.cluster_assign import (
    PreparedMap,
    assign_clusters,
    centroid_scores_int8,
    nearest_clusters,
    prepare_map,
    union_columns,
    union_mask,
)
from fastvocab.kernels.clustered_load import (
    check_int8,
    checked_map,
    joined_shortlist,
    map_normaliser,
    pick_backend,
)
from fastvocab.kernels.clustered_parts import ORACLE, ClusteredOptions, ClusteredParts
from fastvocab.kernels.clustered_static import StaticUnion
from fastvocab.kernels.exact_gate import ExactGate
from fastvocab.kernels.full import FullProjection
from fastvocab.kernels.gather import (
    BatchColumns,
    batch_block_logits,
    batch_union_logits,
    cluster_logits,
    gathered_logits,
    per_row_logits,
)
from fastvocab.kernels.id_sets import unique_ids
from fastvocab.kernels.inactive_mass import (
    MassTables,
    NormaliserTables,
    inactive_log_mass,
    mass_tables,
    normaliser_log_mass,
    oracle_log_mass,
)
from fastvocab.kernels.int8 import PackedRows, linear_packed, open_sessions
from fastvocab.kernels.int8_union import (
    Int8Weights,
    int8_cluster_logits,
    int8_full_logits,
    int8_logit_error,
    int8_map_skipped,
    int8_union_logits,
    int8_weights,
)
from fastvocab.kernels.map_probe import MapStepProbe, probe_map_steps
from fastvocab.kernels.popular import hit_probability
from fastvocab.kernels.rowwise import argmax_rows

log = logging.getLogger(__name__)
_COUNTERS_LOCK = threading.Lock()  # guards every projection's counters (rare, tiny updates)

# Cached sub-matrices on CPU by default (MB): a cached cluster turns the per-step gather (a copy of the active
# rows) into a plain GEMV (measured: benchmarks/history/undertrained-model-2026-11.md, "Output layer alone").
DEFAULT_CPU_CACHE_MB = 512.0
# A step with the batch's columns whose rows fall in at most this many clusters, all cached, runs their
# blocks whole (gather.batch_block_logits) instead of gathering the union's columns: each block is read by
# every row, so beyond a few clusters the gather reads less.
BLOCK_CLUSTERS = 4


def decoding_probes(asked: int | None, map_probes: int, selection: str) -> int:
    """The probes a decode reads: those asked for, else the map's own (measured by its builder); per-row
    selection reads one cluster a row."""
    if asked is not None:
        return asked
    return map_probes if selection == "union" else 1


@register("clustered", ClusteredOptions)
class ClusteredProjection(Projection):
    """Clustered output layer over a cluster map built for this model (refuses any other map).

    Options: ``cluster_map`` (a :class:`ClusterMap` or a map folder), and by name those of the four parts
    the projection holds (``parts``, a :class:`ClusteredParts`; ``kernels/clustered_parts.py``, where
    each part documents its own): ``selection``, ``probes``, ``min_count`` (``Selection``); ``backend``,
    ``cache_mb``, ``int8``, ``full_when_cheaper`` (``Compute``); ``inactive_mass``, ``mass_radius``
    (``MassEstimate``); ``exact_k``, ``exact_tol``, ``bound_blocks`` (``Certificate``). Every estimate and
    certificate reads the nearest cluster, and takes the other columns as computed extras (the other probed
    clusters' sets), as it does for the other rows' sets of a union.

    ``counters`` accumulates, over calls, the rows projected, the columns computed (a fallback row counts
    its set and N) and the certified rows; :meth:`reset_counters` clears them. They never change an output.
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        cluster_map: ClusterMap | str | Path,
        **options: Any,  # the parts' options by name (ClusteredParts), and always_active, fingerprint
    ) -> None:
        parts = ClusteredParts.pop(options)
        super().__init__(weight, bias, **options)  # Projection's options; it refuses any other name
        if parts.compute.int8:
            check_int8(self.device)
        self.parts = parts
        # the options the static union, the benchmarks and the signature read
        self.selection, self.min_count = parts.selection.selection, parts.selection.min_count
        self.inactive_mass, self.mass_radius = parts.mass.inactive_mass, parts.mass.mass_radius
        self.exact_k, self.exact_tol = parts.certificate.exact_k, parts.certificate.exact_tol
        self.int8 = parts.compute.int8
        self.counters = {"rows": 0, "columns": 0, "certified": 0, "far": 0, "full": 0}
        self._full: FullProjection | None = None  # every column, for the rows that need them (_full_logits)

        cmap = checked_map(cluster_map, self.fingerprint, self.n_vocab, self.d)
        self.map_manifest = cmap.manifest
        # a pooled map (target scope, ``to-it``) serves every source into its target: any direction's table
        pooled = cmap.manifest.scope != "direction"
        aa = self.always_active.tolist()
        direction = None if pooled else cmap.manifest.direction
        self._shortlist = joined_shortlist(
            parts.selection, self.weight, self.bias, direction, aa, self.fingerprint
        )
        self.probes = decoding_probes(parts.selection.probes, cmap.manifest.probes, self.selection)
        if self.min_count > 1:
            cmap = cmap.pruned(self.min_count)  # drops the normaliser when it removes anything
        joined = self._shortlist is not None
        self.backend = pick_backend(parts.compute.backend, self.weight, joined, self.probes)
        cache_mb = parts.compute.cache_mb
        if cache_mb is None:
            cache_mb = DEFAULT_CPU_CACHE_MB if self.device.type == "cpu" else 0.0
        self.cache_mb = float(cache_mb)
        if self.backend == "cupy":
            cache_mb = 0.0  # the fused kernel reads W in place; cached blocks would only cost memory
        cache_bytes = int(cache_mb * 2**20)
        self._map = prepare_map(cmap, self.weight, self.bias, aa, cache_bytes=0 if self.int8 else cache_bytes)
        # int8 union mode: each id's chance to be in a row's set, for the union expected at a row count
        self.full_when_cheaper = parts.compute.full_when_cheaper  # may be switched off later (benchmarks do)
        self._hit = (
            hit_probability(self._map, self.n_vocab) if self.int8 and self.selection == "union" else None
        )
        self._w8: Int8Weights | None = None  # int8: W as the full int8 projection holds it
        self._assign8: PackedRows | None = None  # int8: the centroid scores, packed int8 rows
        if self.int8:
            self._w8 = int8_weights(self.weight, self.bias, self._map, cache_bytes=cache_bytes, hit=self._hit)
            self._assign8 = centroid_scores_int8(self._map)
        self._full_at_rows: dict[int, bool] = {}
        self._mass: MassTables | NormaliserTables | None = None
        self.normaliser_source: str | None = None  # "map" or "computed at load"
        if self.inactive_mass == "normaliser":
            self._mass, self.normaliser_source = map_normaliser(cmap, self._map, self.weight, self.bias, aa)
        elif self.inactive_mass not in ("none", ORACLE):
            self._mass = mass_tables(self._map, self.weight, self.bias)
        self._bounds = None
        if self.exact_k:
            n_blocks = max(1, parts.certificate.bound_blocks)
            self._bounds = bound_tables(self._map, self.weight, self.bias, n_blocks=n_blocks)
        # exact_k: what the certificate certifies and costs, for _full_cheaper (same outputs either way)
        self._gate = ExactGate(self.n_vocab, self._map.r) if self.exact_k else None
        if self.backend == "cupy":
            self._indices32 = self._map.indices.to(torch.int32)  # (nnz,) what the kernels read
            if self.bias is not None:
                self.bias = self.bias.contiguous()
        # int8 union mode: the map's step of many rows timed against the full step, here, before a decode
        # pool forks workers from this process (kernels.map_probe)
        self._step_probe: MapStepProbe | None = None
        if self._hit is not None and self._gate is None and switches.MAP_PROBE.get() == "auto":
            counters = dict(self.counters)  # the probe's steps are not counted
            # which library runs the full GEMM decides its time too (FASTVOCAB_INT8_GEMM may name one)
            keyed = {**self.options(), "full_on_onnxruntime": self._w8 is not None and self._w8.on_ort}
            self._step_probe = probe_map_steps(
                self._map, keyed, self.n_vocab, self._map_step, self._full_logits
            )
            self.counters.update(counters)
        log.debug(
            "clustered projection: r=%d, mean set %.1f ids (%.2f%% of N), backend %s%s, cached %.1f MB",
            self._map.r,
            float(np.mean(self._map.sizes)),
            100.0 * float(np.mean(self._map.sizes)) / self.n_vocab,
            self.backend,
            " int8" if self.int8 else "",
            (self._map.cached_bytes if self._w8 is None else self._w8.cached_bytes) / 2**20,
        )

    # ------------------------------------------------------------------ public helpers

    def open_sessions(self, rows: int) -> None:
        if self._w8 is not None:
            popular = [] if self._w8.popular is None else self._w8.popular.packed
            open_sessions([self._w8.full, self._assign8, *popular], rows)

    def options(self) -> dict[str, object]:
        m = self.map_manifest
        opts: dict[str, object] = {
            "selection": self.selection,
            "min_count": self.min_count,
            "inactive_mass": self.inactive_mass,
            "backend": self.backend,
            "map": f"{m.direction}/{m.scope}/r{m.r}/K{m.k}",
        }
        if self.int8:
            opts["dtype"] = "int8"
        if self.probes > 1:
            opts["probes"] = self.probes
        if self.mass_radius is not None:
            opts["mass_radius"] = self.mass_radius
        if self._hit is not None and not self.full_when_cheaper:
            opts["full_when_cheaper"] = False
        if self.exact_k:
            opts["exact_k"] = self.exact_k
            if self.exact_k > 1:
                opts["exact_tol"] = self.exact_tol
        if self._shortlist is not None:
            sl = self._shortlist.options()
            opts["shortlist"] = f"{sl['index']}/k{sl['k']}/frequent{sl['frequent']}/copy{sl['copy']}"
        return opts

    def _count(self, **added: int) -> None:
        # translate() may call one projection from several worker threads: += on a dict is not atomic.
        with _COUNTERS_LOCK:
            for key, value in added.items():
                self.counters[key] += value

    def reset_counters(self) -> None:
        for key in self.counters:
            self.counters[key] = 0

    def tally(self) -> dict[str, float]:
        return {**super().tally(), **self.counters}

    def add_tally(self, added: dict[str, float]) -> None:
        super().add_tally(added)
        self._count(**{key: int(added.get(key, 0)) for key in self.counters})

    def stats(self) -> dict[str, float | None]:
        rows = self.counters["rows"]
        if not rows:
            return super().stats()
        return {
            "active_columns_per_row": self.counters["columns"] / rows,
            "certified_fraction": self.certified_fraction,
            "far_fraction": self.counters["far"] / rows if self.mass_radius else None,
            "full_fraction": (
                self.counters["full"] / rows if self._hit is not None or self._gate is not None else None
            ),
        }

    @property
    def certified_fraction(self) -> float | None:
        """Share of the rows the certificate examined that it certified (None without ``exact_k``, or before
        it examined any); the rows of steps that computed every column (``full_fraction``) are not among
        them."""
        examined = self.counters["rows"] - self.counters["full"]
        if not self.exact_k or examined <= 0:
            return None
        return self.counters["certified"] / examined

    @property
    def step_probe(self) -> MapStepProbe | None:
        """The map probe's times (int8 union mode, when it ran): where steps of many rows skip the map."""
        return self._step_probe

    @property
    def prepared_map(self) -> PreparedMap:
        """The map as the step reads it (centroids, CSR sets, cached blocks), on the device."""
        return self._map

    @property
    def mass_tables(self) -> MassTables | NormaliserTables | None:
        """The tables of the inactive-mass estimate in use (None: none, or the oracle)."""
        return self._mass

    def capturable(self, rows: int) -> CapturableStep | None:
        """Union mode as a static-capacity union that no ``rows`` rows can outgrow (the same outputs,
        ``kernels.clustered_static.StaticUnion``); None for per-row selection, whose step groups rows by
        cluster on the host. A ValueError for what a static union cannot hold (``exact_k``,
        ``mass_radius``, the oracle estimate, ``int8``)."""
        if self.selection != "union":
            return None
        if self.int8:
            raise ValueError("a static union has no int8 path: decode an int8 projection with the eager step")
        if self._shortlist is not None:
            raise ValueError("a static union holds no shortlist: decode with the eager step")
        if self.probes > 1:
            raise ValueError("a static union reads one cluster a row: decode probes > 1 with the eager step")
        return StaticUnion(self, rows=rows).capturable(rows)

    def assign(self, h: torch.Tensor) -> torch.Tensor:
        """Cluster of each row (Eq. 2), (rows,) int64; with ``int8``, from the int8 centroid scores."""
        if self._assign8 is not None:
            return argmax_rows(linear_packed(h.float(), self._assign8))[:, 0]
        return assign_clusters(h, self._map.centroids_t, self._map.sq_norms)

    def _nearest(self, h: torch.Tensor, probes: int) -> torch.Tensor:
        """The ``probes`` nearest clusters of each row, nearest first, (rows, probes) int64; with ``int8``,
        by the int8 centroid scores."""
        if self._assign8 is not None:
            return linear_packed(h.float(), self._assign8).topk(min(probes, self._map.r), dim=1).indices
        return nearest_clusters(h, self._map.centroids_t, self._map.sq_norms, probes)

    def for_batch(
        self, input_ids: torch.Tensor | list[list[int]], attention_mask: torch.Tensor | None = None
    ) -> Callable[[torch.Tensor, torch.Tensor], ProjectionOutput]:
        """The projection bound to one batch of sources, called as ``bound(h, row_ids)`` (the search binds
        every projection that has this method): with a shortlist, every step's union also holds the
        candidates of the batch's sentences; without one, the plain step."""
        if self._shortlist is None:
            return lambda h, row_ids: self(h)
        sets = self._shortlist.batch_candidates(input_ids, attention_mask)
        ids = unique_ids(np.concatenate(sets)) if sets else np.zeros(0, dtype=np.int64)
        # the batch's candidates are gathered (float) or packed (int8) here, once for the batch
        extra = BatchColumns.of(torch.from_numpy(ids).to(self.device), self.weight, self.bias, self._w8)
        return lambda h, row_ids: self._checked_call(h, lambda x: self._project(x, extra))

    # ------------------------------------------------------------------ the step

    def _project(self, h: torch.Tensor, extra: BatchColumns | None = None) -> ProjectionOutput:
        rows = h.shape[0]
        if rows == 0:
            empty = h.new_empty((0, 0))
            return ProjectionOutput(empty, torch.zeros(0, dtype=torch.int64, device=h.device), self.n_vocab)
        if self._full_cheaper(rows):
            self._count(rows=rows, columns=rows * self.n_vocab, full=rows)
            return ProjectionOutput(logits=self._full_logits(h), ids=None, n_vocab=self.n_vocab, scratch=True)
        return self._map_step(h, extra)

    def _map_step(self, h: torch.Tensor, extra: BatchColumns | None = None) -> ProjectionOutput:
        """The step through the map: each row's cluster, the columns of the sets, the mass estimate."""
        rows = h.shape[0]
        # The CuPy grouping kernel runs in one block: beyond 1024 rows per-row selection takes the torch path.
        if self.backend == "cupy" and (self.selection == "union" or rows <= 1024):
            logits, ids, clusters = self._project_cupy(h)
        else:
            logits, ids, clusters = self._project_torch(h, extra)
        mass = None
        if isinstance(self._mass, NormaliserTables):
            mass = normaliser_log_mass(h, logits, ids, clusters, self._map, self._mass)
        elif self.inactive_mass == ORACLE:
            mass = oracle_log_mass(logits, ids, self._full_logits(h).float())
        elif self._mass is not None:
            mass = inactive_log_mass(
                self.inactive_mass, h, logits, clusters, self.n_vocab, self._mass, padded=ids.dim() > 1
            )
        columns = self._computed_columns(logits, ids)
        self._count(rows=rows, columns=columns)
        out = ProjectionOutput(logits, ids, self.n_vocab, log_inactive_mass=mass, scratch=True)
        if self.mass_radius is not None:
            return self._exact_mass_far_rows(h, out, clusters)
        if self._bounds is None:
            return out
        return self._exact(h, out, clusters, self._bounds, columns)

    def _full_cheaper(self, rows: int) -> bool:
        """Whether a step of ``rows`` rows skips the map (``full_when_cheaper``): in int8 union mode where
        the map's expected union costs more than the full int8 GEMM (decided once per row count); with
        ``exact_k`` where the certificate is measured not to pay (:class:`ExactGate`)."""
        if not self.full_when_cheaper:
            return False
        if self._hit is not None:
            full = self._full_at_rows.get(rows)
            if full is None:
                # each row brings the sets of its `probes` nearest clusters: as many draws
                pb = None if self._w8 is None else self._w8.popular
                width = None if pb is None else pb.block_columns
                on_ort = self._w8 is not None and self._w8.on_ort
                full = int8_map_skipped(self._hit, rows * self.probes, rows, self.n_vocab, width, on_ort)
                self._full_at_rows[rows] = full
            if full:
                return True
            if self._step_probe is not None and self._step_probe.skips(rows):
                return True
        return self._gate is not None and self._gate.full_step()

    def _exact_mass_far_rows(
        self, h: torch.Tensor, out: ProjectionOutput, clusters: torch.Tensor
    ) -> ProjectionOutput:
        """Rows farther than ``mass_radius`` from their centroid get the exact mass of the columns they did
        not compute, from their full logits: the normaliser's expansion errs most there (its error grows with
        the cube of the distance), and a beam search compares their scores with those of rows near a
        centroid. Their logits and the output's columns stay as computed, so the step stays sparse."""
        cent = self._map.centroids_t.T[clusters].float()  # (rows, d)
        far = (h.float() - cent).norm(dim=1) > self.mass_radius
        n_far = int(far.sum())  # one host sync
        self._count(far=n_far)
        if n_far == 0:
            return out
        self._count(columns=n_far * self.n_vocab)
        # a clustered output has ids, and mass_radius comes with an estimate (__init__)
        assert out.ids is not None and out.log_inactive_mass is not None
        idx = far.nonzero()[:, 0]
        ids = out.ids if out.ids.dim() == 1 else out.ids[idx]
        exact = oracle_log_mass(out.logits[idx], ids, self._full_logits(h[idx]).float())
        mass = out.log_inactive_mass.index_copy(0, idx, exact.to(out.log_inactive_mass.dtype))
        return replace(out, log_inactive_mass=mass)

    def _computed_columns(self, logits: torch.Tensor, ids: torch.Tensor) -> int:
        if ids.dim() == 1:
            return logits.shape[0] * ids.numel()
        return int(torch.isfinite(logits).sum())  # per-row padding holds -inf

    def _exact(
        self,
        h: torch.Tensor,
        out: ProjectionOutput,
        clusters: torch.Tensor,
        bounds: BoundTables,
        columns: int,
    ) -> ProjectionOutput:
        """Certify each row; rows that fail get their full logits, in a dense (rows, N) output.
        ``columns``: what the map's step computed, summed over its rows (for the gate)."""
        top, mass = inactive_bounds(h, clusters, bounds)
        if self._w8 is not None:  # the tables bound float32 logits; an int8 logit may be this far from one
            slack = int8_logit_error(h, self._w8)
            top, mass = top + slack, mass + slack
        log_tol = self.exact_tol if self.exact_k > 1 else None
        ok = certify(out.logits, top, mass, self.exact_k, log_tol)  # (rows,)
        n_ok = int(ok.sum())  # the one host sync the certificate adds
        self._count(certified=n_ok)
        if self._gate is not None:
            self._gate.record(out.rows, n_ok, columns)
        if self.exact_k > 1:
            # Certified rows' left-out mass moves their log-probs by at most exact_tol: counted as none, so
            # their log-probs are those of the computed columns, as full softmax's are within rounding.
            out.log_inactive_mass = None
        if n_ok == out.rows:
            return out
        self._count(columns=(out.rows - n_ok) * self.n_vocab)
        if n_ok == 0:  # every row falls back: the plain full projection, no scatter
            logits = self._full_logits(h)
            return ProjectionOutput(logits=logits, ids=None, n_vocab=self.n_vocab, scratch=True)
        fallback = (~ok).nonzero()[:, 0]  # (f,)
        dense = out.dense()  # (rows, N), -inf where a certified row computed nothing
        dense[fallback] = self._full_logits(h[fallback]).to(dense.dtype)
        left_out = out.log_inactive_mass
        if left_out is not None:  # an estimate for certified rows (exact_k == 1); fallback rows: nothing
            left_out = left_out.index_fill(0, fallback, -math.inf)
        return ProjectionOutput(
            logits=dense, ids=None, n_vocab=self.n_vocab, log_inactive_mass=left_out, scratch=True
        )

    def _full_logits(self, h: torch.Tensor) -> torch.Tensor:
        """All N columns, (rows, N): rows a certificate sends to the full projection, or whose
        mass ``mass_radius`` computes exactly. In float, through the full projection's own path (on CPU, W
        pre-packed: a plain GEMM lays W out again at every call, which for a step's few rows costs about as
        much as the multiply), built at the first row that needs it."""
        if self._w8 is not None:
            return int8_full_logits(h, self._w8)
        if self._full is None:
            self._full = FullProjection(self.weight, self.bias)
        return self._full(h).logits

    def _project_torch(
        self, h: torch.Tensor, extra: BatchColumns | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``extra``: the batch's columns every row of the step gets besides its clusters' sets."""
        if self.probes > 1:
            near = self._nearest(h, self.probes)
            clusters, cl = near[:, 0], near.reshape(-1).tolist()  # the estimates read the nearest
        else:
            clusters = self.assign(h)  # (rows,)
            cl = clusters.tolist()
        if self.selection == "per-row":
            logits, ids = per_row_logits(h, cl, self._map, self.weight, self.bias, self._w8)
            return logits, ids, clusters
        if extra is not None:  # the batch's columns gathered or packed already
            few = sorted(set(cl))
            if len(few) <= BLOCK_CLUSTERS and all(self._cached(c) for c in few):
                logits, ids = batch_block_logits(h, extra, self._map, few, self.weight, self.bias, self._w8)
                return logits, ids, clusters
            sets = union_mask(cl, self._map.ids, self.n_vocab)
            logits, ids = batch_union_logits(h, extra, sets, self.weight, self.bias, self._w8)
            return logits, ids, clusters
        ids = union_columns(cl, self._map.ids, self.n_vocab)  # (C,)
        uniq = set(cl)
        c = next(iter(uniq), -1)
        if self._w8 is not None:  # one cluster or many: int8 rows, a cached cluster's packed block if any
            logits = (
                int8_cluster_logits(h, self._w8, self._map, c)
                if len(uniq) == 1
                else int8_union_logits(h, self._w8, ids)
            )
        elif len(uniq) == 1 and self._map.blocks[c] is not None:  # one cluster: its cached block, no gather
            logits = cluster_logits(h, self._map, c, self.weight, self.bias)
        else:
            logits = gathered_logits(h, self.weight, self.bias, ids)  # (rows, C)
        return logits, ids, clusters

    def _cached(self, c: int) -> bool:
        """Whether cluster ``c``'s block is cached: an int8 block is packed at its first use, so being
        cached, not being packed, decides a step's path (``int8_union.ClusterBlocks``)."""
        if self._w8 is not None:
            return self._w8.blocks.cached(c)
        return self._map.blocks[c] is not None

    def _project_cupy(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        from fastvocab.kernels import cupy_ops

        pm = self._map
        h = h.contiguous()  # the decoder hands a strided view (last position of its output)
        if h.data_ptr() % 16:  # the kernels load 16-byte chunks
            h = h.clone()
        clusters = cupy_ops.assign(h.to(pm.centroids_t.dtype) @ pm.centroids_t, pm.sq_norms)  # (rows,)
        if self.selection == "union":
            mask = cupy_ops.mark_active(clusters, pm.indptr, self._indices32, self.n_vocab, pm.max_size)
            cols32, cols64 = cupy_ops.compact(mask)  # (C,) sorted; one device->host sync for C
            logits = cupy_ops.gather_gemm_union(h, self.weight, self.bias, cols32)  # (rows, C)
            return logits, cols64, clusters
        logits, ids = cupy_ops.gather_gemm_per_row(
            h, self.weight, self.bias, clusters, pm.indptr, self._indices32, width=pm.max_size
        )  # (rows, W) each, W = largest set of the map: static, so no host sync
        return logits, ids, clusters
