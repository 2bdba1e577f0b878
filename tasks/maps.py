"""Cluster maps from recorded states: assignment (Eq. 2) and per-cluster active-token sets (Amer et al. 2.2).

Pure numpy (no Ray, no Faiss), except the map's normaliser (:func:`attach_normaliser`), which reads the
model's output layer with torch. The active set of a cluster is the union of the top-K ids predicted for its
member states; we keep, for every (cluster, token) pair, how many members predicted it, so rare members can be
pruned later (``min_count``).

Counts live in a sparse accumulator (:class:`ActiveSetCounter`) keyed by ``cluster * n_vocab + token``: a
dense (r, N) table would be 2 GB at r=2000, N=250K. The accumulator merges batch by batch (and partial
counters from workers merge the same way), so a direction never has to be loaded whole.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from fastvocab.artifacts_schema.cluster_map import (
    MAP_SCOPES,
    ClusterMap,
    MapManifest,
    Normaliser,
    active_fraction_stats,
    map_dir_name,
    save_cluster_map,
)
from fastvocab.artifacts_schema.digest import array_digest
from fastvocab.artifacts_schema.hidden_states import (
    REFERENCE_BEAM,
    fixed_list_to_numpy,
    iter_batches,
    read_shard_meta,
    shard_beam,
    shard_rows,
)
from fastvocab.artifacts_schema.kmeans_result import load_kmeans
from fastvocab.artifacts_schema.stream_counts import read_stream_arrays, stream_beam
from fastvocab.kernels.clustered_load import DEFAULT_NORMALISER_RANK
from fastvocab.tasks.context import RunContext

log = logging.getLogger(__name__)

ASSIGN_CHUNK = 16384  # rows per GEMM in assign(): (chunk, r) float32 scores stay ~128 MB at r=2000


def centroid_sq_norms(centroids: np.ndarray) -> np.ndarray:
    """||C_j||^2 per centroid, (r,) float32."""
    c = np.asarray(centroids, dtype=np.float32)
    return np.einsum("rd,rd->r", c, c, dtype=np.float32)


def assign(
    states: np.ndarray,
    centroids: np.ndarray,
    sq_norms: np.ndarray | None = None,
    chunk: int = ASSIGN_CHUNK,
) -> np.ndarray:
    """Nearest centroid of every state, Eq. 2: ``argmin_j ||C_j||^2 - 2 h·C_j``; (n,) int64.

    The decoder's own assignment (``kernels.cluster_assign.assign_clusters``, float32 on the CPU), ``chunk``
    rows at a time so the (rows, r) score matrix stays small: a state on a near-tie between two centroids
    goes to the same cluster when the map is built as when it is decoded (two implementations round such a
    tie differently). Ties go to the lowest index.
    """
    c = np.ascontiguousarray(centroids, dtype=np.float32)
    if c.ndim != 2:
        raise ValueError(f"centroids must be (r, d), got shape {c.shape}")
    states = np.asarray(states)
    if states.ndim != 2 or states.shape[1] != c.shape[1]:
        raise ValueError(f"states must be (n, {c.shape[1]}), got shape {states.shape}")
    norms = centroid_sq_norms(c) if sq_norms is None else np.asarray(sq_norms, dtype=np.float32)
    if norms.shape != (c.shape[0],):
        raise ValueError(f"sq_norms must be ({c.shape[0]},), got {norms.shape}")
    ct, norms_t = centroid_tensors(c, norms, torch.device("cpu"))
    with torch.inference_mode():
        return assign_rows(torch.from_numpy(np.ascontiguousarray(states)), ct, norms_t, chunk).numpy()


def centroid_tensors(
    centroids: np.ndarray, sq_norms: np.ndarray, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(C^T (d, r), ||C_j||^2 (r,))`` float32 on ``device``: what :func:`assign_rows` reads."""
    ct = torch.from_numpy(np.ascontiguousarray(np.asarray(centroids, dtype=np.float32).T))
    return ct.to(device), torch.from_numpy(np.asarray(sq_norms, dtype=np.float32)).to(device)


def assign_rows(
    h: torch.Tensor, centroids_t: torch.Tensor, sq_norms: torch.Tensor, chunk: int = ASSIGN_CHUNK
) -> torch.Tensor:
    """:func:`assign` of states already in a tensor (on any device, any float dtype), float32 ``chunk`` rows
    at a time; (n,) int64 on ``h``'s device."""
    from fastvocab.kernels import cluster_assign as ops

    if len(h) == 0:
        return torch.zeros(0, dtype=torch.int64, device=h.device)
    return torch.cat(
        [
            ops.assign_clusters(h[lo : lo + chunk].float(), centroids_t, sq_norms)
            for lo in range(0, len(h), chunk)
        ]
    )


class ActiveSetCounter:
    """Sparse (cluster, token) -> count accumulator; ``add`` batches or ``merge`` partial counters.

    Adding the same states in any batching gives the same counts (integer sums), which is what makes the
    streaming extension exact: streamed counts equal the counts of one pass over the stored states.
    """

    def __init__(self, r: int, n_vocab: int) -> None:
        if r < 1 or n_vocab < 1:
            raise ValueError(f"r and n_vocab must be positive, got r={r}, n_vocab={n_vocab}")
        self.r = int(r)
        self.n_vocab = int(n_vocab)
        self.keys = np.zeros(0, dtype=np.int64)  # sorted, unique: cluster * n_vocab + token
        self.counts = np.zeros(0, dtype=np.int64)
        self.states = 0  # member states added (each contributes K ids)

    def add(self, cluster_ids: np.ndarray, topk_ids: np.ndarray) -> None:
        """Count the top-K ids (n, K) of n states whose clusters are ``cluster_ids`` (n,)."""
        cluster_ids = np.asarray(cluster_ids, dtype=np.int64)
        topk_ids = np.asarray(topk_ids)
        if topk_ids.ndim != 2 or cluster_ids.shape != (topk_ids.shape[0],):
            raise ValueError(
                f"cluster_ids must be (n,) and topk_ids (n, K); got {cluster_ids.shape} and {topk_ids.shape}"
            )
        if len(cluster_ids) == 0:
            return
        if cluster_ids.min() < 0 or cluster_ids.max() >= self.r:
            raise ValueError(f"cluster ids outside [0, {self.r})")
        if topk_ids.min() < 0 or topk_ids.max() >= self.n_vocab:
            raise ValueError(f"token ids outside [0, {self.n_vocab})")
        keys = (cluster_ids[:, None] * self.n_vocab + topk_ids.astype(np.int64)).reshape(-1)
        uniq, cnt = np.unique(keys, return_counts=True)
        self._merge_sorted(uniq, cnt.astype(np.int64))
        self.states += len(cluster_ids)

    def add_counts(self, keys: np.ndarray, counts: np.ndarray, states: int) -> None:
        """Add pairs counted elsewhere (on a GPU): sorted distinct ``cluster * n_vocab + token`` keys and
        their counts, from ``states`` member states."""
        keys = np.asarray(keys, dtype=np.int64)
        counts = np.asarray(counts, dtype=np.int64)
        if keys.shape != counts.shape or keys.ndim != 1:
            raise ValueError(f"keys and counts must be (n,) alike, got {keys.shape} and {counts.shape}")
        if len(keys) and (keys[0] < 0 or keys[-1] >= self.r * self.n_vocab or np.any(np.diff(keys) <= 0)):
            raise ValueError(f"keys must be sorted, distinct and inside [0, {self.r * self.n_vocab})")
        self._merge_sorted(keys, counts)
        self.states += int(states)

    def merge(self, other: ActiveSetCounter) -> None:
        """Add another counter's counts (e.g. a worker's partial result)."""
        if (other.r, other.n_vocab) != (self.r, self.n_vocab):
            raise ValueError(
                f"cannot merge counters of shape (r={other.r}, N={other.n_vocab}) into "
                f"(r={self.r}, N={self.n_vocab})"
            )
        self._merge_sorted(other.keys, other.counts)
        self.states += other.states

    def _merge_sorted(self, keys: np.ndarray, counts: np.ndarray) -> None:
        if len(self.keys) == 0:
            self.keys, self.counts = keys.copy(), counts.copy()
            return
        all_keys = np.concatenate([self.keys, keys])
        all_counts = np.concatenate([self.counts, counts])
        order = np.argsort(all_keys, kind="stable")
        all_keys, all_counts = all_keys[order], all_counts[order]
        starts = np.flatnonzero(np.concatenate([[True], all_keys[1:] != all_keys[:-1]]))
        self.keys = all_keys[starts]
        self.counts = np.add.reduceat(all_counts, starts)

    def to_csr(self, min_count: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indptr int64 [r+1], indices int32 [nnz], counts int32 [nnz]); ids sorted within each cluster.

        Pairs predicted fewer than ``min_count`` times are dropped.
        """
        keep = self.counts >= min_count
        keys, counts = self.keys[keep], self.counts[keep]
        clusters = keys // self.n_vocab
        sizes = np.bincount(clusters, minlength=self.r)
        indptr = np.zeros(self.r + 1, dtype=np.int64)
        np.cumsum(sizes, out=indptr[1:])
        if len(counts) and counts.max() > np.iinfo(np.int32).max:
            raise OverflowError("a (cluster, token) count exceeds int32")
        return indptr, (keys % self.n_vocab).astype(np.int32), counts.astype(np.int32)

    # Plain arrays travel cheaply between Ray workers and the driver.
    def to_arrays(self) -> dict[str, np.ndarray]:
        return {
            "keys": self.keys,
            "counts": self.counts,
            "shape": np.array([self.r, self.n_vocab, self.states], dtype=np.int64),
        }

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> ActiveSetCounter:
        r, n_vocab, states = (int(x) for x in arrays["shape"])
        out = cls(r, n_vocab)
        out.keys = np.asarray(arrays["keys"], dtype=np.int64)
        out.counts = np.asarray(arrays["counts"], dtype=np.int64)
        out.states = states
        return out


def count_shards(
    files: Sequence[Path],
    centroids: np.ndarray,
    k: int,
    n_vocab: int,
    counter: ActiveSetCounter | None = None,
    batch_size: int = 65536,
) -> ActiveSetCounter:
    """Stream record batches of hidden-state shards: assign each state, count its top-``k`` ids."""
    counters = {k: counter if counter is not None else ActiveSetCounter(len(centroids), n_vocab)}
    return count_shards_by_k(files, centroids, counters, batch_size)[k]


def count_shards_by_k(
    files: Sequence[Path],
    centroids: np.ndarray,
    counters: dict[int, ActiveSetCounter],
    batch_size: int = 65536,
) -> dict[int, ActiveSetCounter]:
    """Like :func:`count_shards` for several K at once (one assignment pass; K=1/3/5 as in Fig. 4)."""
    if not files:
        return counters
    meta = read_shard_meta(files[0])
    if max(counters) > meta.k:
        raise ValueError(f"maps k={max(counters)} exceeds the K={meta.k} recorded in {files[0]}")
    norms = centroid_sq_norms(centroids)
    for batch in iter_batches(list(files), columns=["hidden", "topk_ids"], batch_size=batch_size):
        hidden = fixed_list_to_numpy(batch.column("hidden"), meta.d, np.float32)
        topk = fixed_list_to_numpy(batch.column("topk_ids"), meta.k, np.int32)
        cluster_ids = assign(hidden, centroids, norms)
        for k, counter in counters.items():
            # top-K ids are stored best first, so the first k columns are the top-k
            counter.add(cluster_ids, topk[:, :k])
    return counters


def make_cluster_map(
    centroids: np.ndarray,
    counter: ActiveSetCounter,
    params: MapParams,
    *,
    model_fingerprint: str,
    name: str,
    niter: int,
    seed: int,
    extra: dict[str, object] | None = None,
    beam_states: dict[int, int] | None = None,
) -> ClusterMap:
    """A validated-shape ClusterMap (+ manifest with active-fraction statistics) from centroids and counts.

    ``params``: the map's scope, its K, the least count an id needs (``min_count``) and the probes (the
    nearest clusters each row reads when decoding is not told otherwise: the manifest's); its other fields
    are :func:`maps_job`'s. ``name`` is the map's direction: ``en-it`` in direction scope, ``to-it`` in
    target scope. ``niter`` and ``seed``: the k-means run that made the centroids. ``beam_states``: the
    states of each beam that fed the counts (the manifest's ``beams``, ``beam_states``).
    """
    scope, k, min_count, probes = params.scope, params.k, params.min_count, params.probes
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    r, d = centroids.shape
    if counter.r != r:
        raise ValueError(f"counter has r={counter.r}, centroids r={r}")
    indptr, indices, counts = counter.to_csr(min_count)
    sizes = np.diff(indptr)
    manifest = MapManifest(
        model_fingerprint=model_fingerprint,
        direction=name,
        scope=scope,
        r=r,
        k=k,
        d=d,
        n_vocab=counter.n_vocab,
        niter=niter,
        seed=seed,
        states_used=counter.states,
        active_fraction=active_fraction_stats(indptr, counter.n_vocab),
        extra={
            "min_count": min_count,
            "empty_clusters": int((sizes == 0).sum()),
            "centroids_digest": array_digest(centroids),
            **(extra or {}),
        },
        # the beams a map serves; the reference path (teacher forcing) is counted in beam_states only
        beams=sorted(b for b in (beam_states or {}) if b != REFERENCE_BEAM),
        beam_states={str(b): int(n) for b, n in sorted((beam_states or {}).items())},
        probes=probes,
    )
    return ClusterMap(manifest, centroids, centroid_sq_norms(centroids), indptr, indices, counts)


def attach_normaliser(
    cmap: ClusterMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    always_active: Sequence[int],
    rank: int,
) -> ClusterMap:
    """Compute the map's normaliser (for its sets plus ``always_active``, the ids every set gets at decode
    time) from the model's output layer; record the ids and rank in the manifest. Returns ``cmap``."""
    from fastvocab.kernels import cluster_assign, inactive_mass

    aa = np.asarray(sorted({int(i) for i in always_active}), dtype=np.int64)
    indptr, indices = cluster_assign.merged_csr(cmap.indptr, cmap.indices, cmap.manifest.n_vocab, aa)
    rank = min(rank, cmap.manifest.d)
    with torch.inference_mode():
        t = inactive_mass.normaliser_tables(
            torch.from_numpy(cmap.centroids),
            weight,
            bias,
            torch.from_numpy(indptr).to(weight.device),
            torch.from_numpy(indices).to(weight.device),
            rank,
        )
    cmap.normaliser = Normaliser(
        **{name: getattr(t, name).cpu().numpy() for name in ("lse", "grad", "basis", "curv", "resid")}
    )
    cmap.manifest.normaliser = {"rank": rank, "always_active": aa.tolist()}
    return cmap


@dataclass(frozen=True)
class MapParams:
    """How the active sets of a map are built from its states."""

    scope: str = "direction"  # one of MAP_SCOPES
    k: int = 5  # top-K ids of each state that enter its cluster's set (<= the dump's K)
    min_count: int = 1  # drop (cluster, id) pairs predicted fewer times
    compare_ks: tuple[int, ...] = ()  # also report per-cluster fractions at these K (Fig. 4)
    normaliser_rank: int = DEFAULT_NORMALISER_RANK  # curvature basis of the stored normaliser
    probes: int = 1  # nearest clusters a row reads when decoding is not told otherwise (the manifest's)

    def __post_init__(self) -> None:
        if self.scope not in MAP_SCOPES:
            raise ValueError(f"unknown map scope {self.scope!r}; valid: {', '.join(MAP_SCOPES)}")
        if self.k < 1 or self.min_count < 1 or self.probes < 1 or self.normaliser_rank < 0:
            raise ValueError(f"k, min_count and probes must be >= 1, normaliser_rank >= 0, got {self}")


def map_name(scope: str, directions: Iterable[str]) -> str:
    """The manifest ``direction`` of a map fed by ``directions``, which is also its folder name
    (``map_dir_name``): the direction itself (``en-it``), or ``to-<tgt>`` in target scope."""
    directions = sorted(directions)
    if scope == "direction":
        if len(directions) != 1:
            raise ValueError(f"direction scope builds one map per direction, got {directions}")
        return directions[0]
    targets = {d.split("-", 1)[1] for d in directions}
    if len(targets) != 1:
        raise ValueError(f"target scope pools directions into one target language, got {directions}")
    src, _, tgt = directions[0].partition("-")
    return map_dir_name(src, tgt, scope)


def group_directions(directions: Sequence[str], scope: str) -> dict[str, list[str]]:
    """Map groups: ``{map folder name: directions feeding it}``.

    Direction scope: one group per direction (``en-it``). Target scope (Amer et al. 2.2, target-only known):
    one group per target language (``to-it``) pooling every configured direction into it.
    """
    groups: dict[str, list[str]] = {}
    for direction in directions:
        src, sep, tgt = direction.partition("-")
        if not sep or not src or not tgt:
            raise ValueError(f"direction must look like 'en-it', got {direction!r}")
        groups.setdefault(map_dir_name(src, tgt, scope), []).append(direction)
    return {name: sorted(dirs) for name, dirs in sorted(groups.items())}


def maps_job(
    files: Sequence[str],
    stream_files: Sequence[str],
    kmeans_dir: str,
    out_dir: str,
    params: MapParams,
    *,
    directions: Sequence[str],
    run_ctx: RunContext,
    extra: dict[str, object] | None = None,
) -> dict[str, object]:
    """The maps stage for one map (a Ray task in the pipeline; a plain function here).

    Assigns every stored state of ``files`` to the centroids in ``kmeans_dir``, adds the streamed partial
    counts, computes the normaliser from the model of ``run_ctx`` (loaded on its device), writes the map to
    ``out_dir`` (atomically) and returns its manifest and per-cluster active fractions;
    ``params.compare_ks`` adds the per-cluster fractions the stored states give at other K (Fig. 4).
    """
    n_vocab, model_fingerprint = run_ctx.model.n_vocab, run_ctx.model.fingerprint
    t0 = time.perf_counter()
    k = params.k
    centroids, info = load_kmeans(kmeans_dir)
    r = len(centroids)
    ks = sorted({k, *(c for c in params.compare_ks if c <= k)})
    counters = count_shards_by_k(
        [Path(f) for f in files], centroids, {c: ActiveSetCounter(r, n_vocab) for c in ks}
    )
    stored_states = counters[k].states
    counter = counters[k]
    beam_states: dict[int, int] = {}  # what the map covers: states per beam, from the shards' own plans
    for f, rows in zip(files, shard_rows([Path(f) for f in files]), strict=True):
        beam = shard_beam(f)
        beam_states[beam] = beam_states.get(beam, 0) + rows
    for f in stream_files:
        arrays = read_stream_arrays(Path(f))
        if arrays is None:
            raise FileNotFoundError(f"stream counts {f} disappeared before the maps stage read them")
        streamed = ActiveSetCounter.from_arrays(arrays)
        beam = stream_beam(Path(f))
        beam_states[beam] = beam_states.get(beam, 0) + streamed.states
        counter.merge(streamed)
    cmap = make_cluster_map(
        centroids,
        counter,
        params,
        model_fingerprint=model_fingerprint,
        name=map_name(params.scope, directions),
        niter=info.niter,
        seed=info.seed,
        extra={
            "directions": sorted(directions),
            "stored_states": stored_states,
            "streamed_states": counter.states - stored_states,
            "kmeans_objective": info.final_objective,
            **(extra or {}),
        },
        beam_states=beam_states,
    )
    adapter = run_ctx.load_adapter()
    t1 = time.perf_counter()
    attach_normaliser(
        cmap, adapter.output_weight, adapter.output_bias, adapter.always_active_ids(), params.normaliser_rank
    )
    normaliser_seconds = time.perf_counter() - t1
    save_cluster_map(cmap, out_dir)
    fractions = {
        c: np.diff(cnt.to_csr(params.min_count)[0]).astype(np.float64) / n_vocab
        for c, cnt in counters.items()
        if c != k
    }
    fractions[k] = cmap.active_fractions()
    return {
        "manifest": asdict(cmap.manifest),
        "fractions": fractions,
        "seconds": time.perf_counter() - t0,
        "normaliser_seconds": normaliser_seconds,
    }
