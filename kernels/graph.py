"""Graph-search vocabulary selection: FGD (Zhang et al. 2018), an HNSW graph over the output layer searched
for the largest logits.

FGD fuses each output embedding and its bias, ``x~_i = [w_i; b_i]``, so that a query ``[h; 1]`` has the logit
``w_i h + b_i`` as its inner product with ``x~_i``: the K largest inner products are exactly the K largest
logits, bias included, unlike LSH. The paper then lifts the vectors to D+2 dimensions (its
inner-product-preserving transform, ``[w_i; b_i; sqrt(U^2 - ||x~_i||^2)]``, every vector of norm U) and
searches an L2 graph. Here the graph is built over ``x~_i`` with Faiss's inner-product HNSW
(``IndexHNSWFlat(D+1, M, METRIC_INNER_PRODUCT)``) instead: on the demo model the L2 graph over the lifted
vectors found the best token for 51% of decoder states at ``ef_search`` 64 (22% at 16, 88% at 1,024), where
the inner-product graph finds it for 97% at 64 (99.6% at 256), with the same M and ``ef_construction``
(benchmarks/results/graph-recall-cpu-2026-11-27.json). The default ``ef_search`` is 256: a 3% miss a step at
64 compounds over a sentence's steps into 42% of greedy outputs changed (300 en-it test lines), 4.7% at 256
(benchmarks/results/graph-greedy-cpu-2026-11-27-en-it300.json). The lifted dimension is what differs: it
dominates the distances between small-norm embeddings, so the graph's edges follow it rather than the
directions that decide a logit. The serialized index is the artifact (``MethodIndex`` "graph", every
direction, array ``faiss_index`` uint8; ``metric`` in its record).

At each step (FGD-I, Algorithm 2): every row's top-K by graph search (``ef_search`` = the paper's efSearch,
the length of the candidate queue), per-row ids (rows, K). The logits of the K candidates are recomputed
exactly from W and b. The softmax is normalised over the K candidates only, as in the paper (line 8):
``log_inactive_mass`` is None.

Faiss is imported only when an index is built or loaded (a GPU image may lack it). The search runs
on the CPU; on a CUDA device the states are copied to the host and the candidates back, and the logits are
computed on the device.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch

from fastvocab.artifacts_schema.method_index import ANY_DIRECTION, MethodIndex, method_index_for, new_index
from fastvocab.kernels.base import Projection, ProjectionOutput, register
from fastvocab.kernels.faiss_import import import_faiss
from fastvocab.kernels.lsh import candidates_output, check_int, manifest_params
from fastvocab.kernels.options import (
    INDEX_FLAG,
    ArtifactPath,
    Flag,
    MethodOptions,
    candidates_flag,
    check_count,
    option,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GraphParams:
    """What the HNSW graph is built with (the artifact's parameters)."""

    m: int = 32  # neighbours per node (the paper's M)
    ef_construction: int = 200  # candidate queue while inserting
    threads: int = 1  # Faiss OpenMP threads while building; 1 makes the graph reproducible

    def __post_init__(self) -> None:
        check_int("m", self.m, 2)
        check_int("ef_construction", self.ef_construction, 1)
        check_int("threads", self.threads, 1)


def _faiss():
    try:
        faiss = import_faiss()
    except ImportError as exc:
        raise ImportError(
            "the graph output-layer method needs Faiss, which is not installed: "
            "pip install 'fastvocab[pipeline]' (or faiss-cpu alone)"
        ) from exc
    return faiss


def fuse(weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """``[w_i; b_i]`` per vocabulary entry, (N, D+1) float32: the vectors the graph holds."""
    w = np.asarray(weight, dtype=np.float32)
    b = np.zeros(w.shape[0], np.float32) if bias is None else np.asarray(bias, dtype=np.float32)
    return np.ascontiguousarray(np.concatenate([w, b[:, None]], axis=1))


def fuse_queries(h: np.ndarray) -> np.ndarray:
    """``[h; 1]`` per row, (rows, D+1) float32: its inner product with ``[w_i; b_i]`` is the logit."""
    h = np.asarray(h, dtype=np.float32)
    out = np.ones((h.shape[0], h.shape[1] + 1), dtype=np.float32)
    out[:, :-1] = h
    return out


def build_graph_index(
    weight: torch.Tensor | np.ndarray,
    bias: torch.Tensor | np.ndarray | None,
    params: GraphParams,
    *,
    fingerprint: str,
    direction: str = ANY_DIRECTION,
) -> MethodIndex:
    """FGD-P: the inner-product HNSW graph over the fused output layer, serialized: the "graph" artifact."""
    faiss = _faiss()
    t0 = time.perf_counter()
    w = weight.detach().float().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    b = bias.detach().float().cpu().numpy() if isinstance(bias, torch.Tensor) else bias
    fused = fuse(w, b)
    index = faiss.IndexHNSWFlat(fused.shape[1], params.m, faiss.METRIC_INNER_PRODUCT)
    index.hnsw.efConstruction = params.ef_construction
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(params.threads)
    try:
        index.add(fused)
    finally:
        faiss.omp_set_num_threads(before)
    blob = faiss.serialize_index(index)  # uint8 array
    return new_index(
        "graph",
        model_fingerprint=fingerprint,
        direction=direction,
        n_vocab=w.shape[0],
        d=w.shape[1],
        params=asdict(params),
        tensors={"faiss_index": np.asarray(blob, dtype=np.uint8)},
        build_seconds=time.perf_counter() - t0,
        extra={
            "metric": "inner_product",
            "max_level": int(index.hnsw.max_level),
            "faiss_version": faiss.__version__,
        },
    )


@dataclass(frozen=True)
class GraphOptions(MethodOptions):
    """What a user chooses of the graph method: its HNSW graph (``index``; None: built from W at load),
    the candidates a row gets (``k``; None: the projection's 10) and the search queue (``ef_search``)."""

    method: ClassVar[str] = "graph"

    index: ArtifactPath | None = option(None, INDEX_FLAG)
    k: int | None = option(None, candidates_flag("top-K of the graph search", "10"))
    ef_search: int | None = option(
        None, Flag("--ef-search", "HNSW search queue, >= K is used", type=int, metavar="N", default="256")
    )

    def __post_init__(self) -> None:
        check_count("k", self.k, 1)
        check_count("ef_search", self.ef_search, 1)


@register("graph", GraphOptions)
class GraphProjection(Projection):
    """FGD over this model's W and b (refuses an index built for another model).

    Options: ``k`` (K, candidates per row from the graph; always-active ids come on top), ``ef_search``
    (the search's candidate queue; Faiss uses at least K), ``m`` / ``ef_construction`` (the graph; taken
    from ``index`` when one is given, where a different value is an error), ``index`` (a
    :class:`MethodIndex` or an index folder; None: the graph is built in memory, which takes seconds to
    minutes: ~N * M * ef_construction distance computations), ``threads`` (Faiss search threads; None:
    Faiss's default).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        k: int = 10,
        ef_search: int = 256,
        m: int | None = None,
        ef_construction: int | None = None,
        index: MethodIndex | str | Path | None = None,
        threads: int | None = None,
        **common: Any,  # always_active, fingerprint: see Projection
    ) -> None:
        super().__init__(weight, bias, **common)
        self.k = min(check_int("k", k, 1), self.n_vocab)
        self.ef_search = check_int("ef_search", ef_search, 1)
        self.threads = None if threads is None else check_int("threads", threads, 1)
        faiss = _faiss()
        given = {"m": m, "ef_construction": ef_construction}
        if index is None:
            defaults = GraphParams()
            self.params = GraphParams(
                m=defaults.m if m is None else m,
                ef_construction=defaults.ef_construction if ef_construction is None else ef_construction,
            )
            idx = build_graph_index(self.weight, self.bias, self.params, fingerprint=self.fingerprint)
            self.index_digest = None
        else:
            idx = method_index_for(
                index,
                "graph",
                fingerprint=self.fingerprint,
                n_vocab=self.n_vocab,
                d=self.d,
                required=("faiss_index",),
            )
            self.params = manifest_params(GraphParams, idx, given)
            self.index_digest = idx.manifest.tensors_digest
        self._index = faiss.deserialize_index(np.ascontiguousarray(idx.tensors["faiss_index"]))
        if (self._index.ntotal, self._index.d) != (self.n_vocab, self.d + 1):
            stale = " (an L2 graph over lifted vectors: rebuild it)" if self._index.d == self.d + 2 else ""
            raise ValueError(
                f"graph index holds {self._index.ntotal} vectors of dimension {self._index.d}; "
                f"expected {self.n_vocab} of {self.d + 1}{stale}"
            )
        # Per-call search parameters: the shared index is never mutated by a call.
        self._search_params = faiss.SearchParametersHNSW(efSearch=self.ef_search)

    def options(self) -> dict[str, object]:
        return {
            "k": self.k,
            "ef_search": self.ef_search,
            "m": self.params.m,
            "ef_construction": self.params.ef_construction,
        }

    def candidates(self, h: torch.Tensor) -> torch.Tensor:
        """Top-K ids per row by graph search, (rows, K) int64, nearest first; -1 where fewer were found."""
        faiss = _faiss()
        q = fuse_queries(h.detach().float().cpu().numpy())
        before = faiss.omp_get_max_threads()
        if self.threads is not None:
            faiss.omp_set_num_threads(self.threads)
        try:
            _, ids = self._index.search(q, self.k, params=self._search_params)
        finally:
            if self.threads is not None:
                faiss.omp_set_num_threads(before)
        return torch.from_numpy(ids).to(h.device)

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        return candidates_output(self, h, self.k)
