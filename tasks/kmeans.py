"""Faiss k-means over recorded hidden states (one run per direction, or per target language in target scope).

Deterministic by construction: the training sample is drawn with a seeded numpy generator from the shards in
sorted order, Faiss gets a fixed seed, and the OpenMP thread count is fixed for the call. Same seed, same data
-> byte-identical centroids on one machine (tests/test_kmeans.py checks it; another CPU's BLAS kernels round
differently). The result folder's format is ``artifacts_schema.kmeans_result``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import (
    fixed_list_to_numpy,
    iter_batches,
    read_shard_meta,
    shard_rows,
)
from fastvocab.artifacts_schema.kmeans_result import KMeansInfo, save_kmeans
from fastvocab.kernels.faiss_import import import_faiss

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KMeansParams:
    """One k-means run: r centroids, niter iterations, a fixed seed, Faiss threads (fixed: determinism)."""

    r: int = 200
    niter: int = 20
    seed: int = 1234
    max_points_per_centroid: int = 256
    gpu: bool = False
    threads: int | None = None

    def __post_init__(self) -> None:
        if min(self.r, self.niter, self.max_points_per_centroid) < 1:
            raise ValueError(f"r, niter and max_points_per_centroid must be >= 1, got {self}")


@contextlib.contextmanager
def faiss_threads(n: int | None) -> Iterator[int]:
    """Fix Faiss' OpenMP thread count inside the block (restored after); yields the count used."""
    faiss = import_faiss()

    before = faiss.omp_get_max_threads()
    if n is not None:
        faiss.omp_set_num_threads(int(n))
    try:
        yield faiss.omp_get_max_threads()
    finally:
        faiss.omp_set_num_threads(before)


def use_gpu(requested: bool) -> bool:
    """GPU k-means only when asked for, the Faiss build has GPU support and a GPU is visible."""
    if not requested:
        return False
    faiss = import_faiss()

    ngpu = faiss.get_num_gpus() if hasattr(faiss, "get_num_gpus") else 0
    if ngpu == 0:
        log.warning("kmeans.gpu is set but this Faiss build sees no GPU: running k-means on CPU")
    return ngpu > 0


def train_kmeans(
    x: np.ndarray,
    r: int,
    *,
    niter: int = 20,
    seed: int = 1234,
    max_points_per_centroid: int = 256,
    gpu: bool = False,
    threads: int | None = None,
) -> tuple[np.ndarray, KMeansInfo]:
    """Train ``r`` centroids on ``x`` (n, d) with ``faiss.Kmeans``; returns (centroids (r, d) f32, info)."""
    faiss = import_faiss()

    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"training states must be (n, d), got shape {x.shape}")
    n, d = x.shape
    if n < r:
        raise ValueError(
            f"k-means needs at least r={r} training states, got {n}: dump more sentences or lower kmeans.r"
        )
    if not np.isfinite(x).all():
        raise ValueError("training states contain NaN or inf")
    on_gpu = use_gpu(gpu)
    with faiss_threads(threads) as used:
        km = faiss.Kmeans(
            d,
            r,
            niter=niter,
            seed=seed,
            max_points_per_centroid=max_points_per_centroid,
            gpu=on_gpu,
            verbose=False,
        )
        t0 = time.perf_counter()
        km.train(x)
        seconds = time.perf_counter() - t0
    centroids = np.ascontiguousarray(km.centroids, dtype=np.float32).reshape(r, d)
    info = KMeansInfo(
        r=r,
        d=d,
        niter=niter,
        seed=seed,
        max_points_per_centroid=max_points_per_centroid,
        n_train=min(n, r * max_points_per_centroid),  # Faiss subsamples above this (seeded)
        n_available=n,
        objective=[float(v) for v in (km.obj if km.obj is not None else [])],
        seconds=seconds,
        gpu=bool(on_gpu),
        threads=used,
    )
    return centroids, info


def sample_states(
    files: Sequence[Path], max_points: int | None, seed: int, batch_size: int = 65536
) -> tuple[np.ndarray, int]:
    """Hidden states for training, (m, d) float32, and the number available in ``files``.

    At most ``max_points`` rows, drawn uniformly without replacement by a generator seeded with ``seed``
    (rows kept in file order). Streams the shards: only the sample is ever in memory.
    """
    files = list(files)
    if not files:
        raise ArtifactError("no hidden-state shards to train k-means on")
    d = read_shard_meta(files[0]).d
    total = sum(shard_rows(files))
    if max_points is None or total <= max_points:
        picks = None
        out = np.empty((total, d), dtype=np.float32)
    else:
        picks = np.sort(np.random.default_rng(seed).choice(total, size=max_points, replace=False))
        out = np.empty((max_points, d), dtype=np.float32)
    offset, filled = 0, 0
    for batch in iter_batches(files, columns=["hidden"], batch_size=batch_size):
        rows = batch.num_rows
        if picks is None:
            out[filled : filled + rows] = fixed_list_to_numpy(batch.column("hidden"), d, np.float32)
            filled += rows
        else:
            lo, hi = np.searchsorted(picks, [offset, offset + rows])
            if hi > lo:
                h = fixed_list_to_numpy(batch.column("hidden"), d, np.float32)
                out[filled : filled + hi - lo] = h[picks[lo:hi] - offset]
                filled += hi - lo
        offset += rows
    if filled != len(out):
        raise ArtifactError(f"shards changed while reading: expected {len(out)} states, read {filled}")
    return out, total


def kmeans_job(
    files: Sequence[str],
    out_dir: str,
    params: KMeansParams,
    *,
    model_fingerprint: str,
    directions: Sequence[str],
    inputs_digest: str,
) -> dict[str, object]:
    """The k-means stage for one map (a Ray task in the pipeline): sample, train, save; returns the info.

    The sample (at most ``r * max_points_per_centroid`` states, seeded) is what Faiss trains on, so Faiss
    does not subsample again and memory stays bounded by the sample.
    """
    x, total = sample_states([Path(f) for f in files], params.r * params.max_points_per_centroid, params.seed)
    centroids, info = train_kmeans(
        x,
        params.r,
        niter=params.niter,
        seed=params.seed,
        max_points_per_centroid=params.max_points_per_centroid,
        gpu=params.gpu,
        threads=params.threads,
    )
    info.n_available = total
    info.model_fingerprint = model_fingerprint
    info.directions = sorted(directions)
    info.inputs_digest = inputs_digest
    save_kmeans(centroids, info, out_dir)
    log.info(
        "k-means %s: r=%d on %d of %d states in %.1f s", out_dir, params.r, info.n_train, total, info.seconds
    )
    return asdict(info)
