"""Faiss k-means over recorded hidden states (one run per direction, or per target language in target mode).

Deterministic by construction: the training sample is drawn with a seeded numpy generator from the shards in
sorted order, Faiss gets a fixed seed, and the OpenMP thread count is fixed for the call. Same seed, same data
-> byte-identical centroids (tests/test_kmeans.py checks it).

Output folder (``<work_dir>/kmeans/<map name>/``, written atomically)::

    centroids.safetensors   centroids [r, d] float32
    kmeans.json             r, d, niter, seed, objective per iteration, training points, inputs digest, time
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import fixed_list_to_numpy, iter_batches, read_shard_meta

log = logging.getLogger(__name__)

CENTROIDS_FILE = "centroids.safetensors"
INFO_FILE = "kmeans.json"
KMEANS_FORMAT_VERSION = 1


@dataclass
class KMeansInfo:
    r: int
    d: int
    niter: int
    seed: int
    max_points_per_centroid: int
    n_train: int  # states k-means was trained on (after sampling)
    n_available: int  # states recorded in the input shards
    objective: list[float]  # Faiss objective (sum of squared distances) after each iteration
    seconds: float
    gpu: bool
    threads: int
    inputs_digest: str = ""
    model_fingerprint: str = ""
    directions: list[str] = field(default_factory=list)
    format_version: int = KMEANS_FORMAT_VERSION

    @property
    def final_objective(self) -> float:
        return self.objective[-1] if self.objective else float("nan")


@contextlib.contextmanager
def faiss_threads(n: int | None) -> Iterator[int]:
    """Fix Faiss' OpenMP thread count inside the block (restored after); yields the count used."""
    import faiss

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
    import faiss

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
    import faiss

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


def shard_rows(files: Sequence[Path]) -> list[int]:
    import pyarrow.parquet as pq

    return [pq.ParquetFile(f).metadata.num_rows for f in files]


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


def inputs_digest(files: Sequence[Path], tail_bytes: int = 65536) -> str:
    """Cheap identity of a set of Parquet shards: names, sizes and each file's footer bytes.

    The footer holds row counts and column statistics, so a re-dumped shard with other content changes the
    digest without reading every state again.
    """
    h = hashlib.sha256()
    for f in sorted(Path(p) for p in files):
        size = f.stat().st_size
        h.update(f"{f.parent.name}/{f.name}:{size};".encode())
        with f.open("rb") as fh:
            fh.seek(max(0, size - tail_bytes))
            h.update(fh.read())
    return "sha256:" + h.hexdigest()[:32]


def save_kmeans(centroids: np.ndarray, info: KMeansInfo, out_dir: str | Path) -> Path:
    """Write centroids + info atomically (both appear together or neither)."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        save_file({"centroids": np.ascontiguousarray(centroids, dtype=np.float32)}, str(tmp / CENTROIDS_FILE))
        (tmp / INFO_FILE).write_text(json.dumps(asdict(info), indent=2, sort_keys=True) + "\n")
    return out_dir


def load_kmeans(out_dir: str | Path) -> tuple[np.ndarray, KMeansInfo]:
    """Load and check a k-means output folder; raises ArtifactError naming the folder when it is bad."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    out_dir = Path(out_dir)
    info_path = out_dir / INFO_FILE
    if not info_path.exists():
        raise ArtifactError(f"no k-means result at {out_dir} (missing {INFO_FILE})")
    try:
        info = KMeansInfo(**json.loads(info_path.read_text()))
    except (ValueError, TypeError) as exc:
        raise ArtifactError(f"corrupt k-means info {info_path}: {exc}") from exc
    try:
        centroids = load_file(str(out_dir / CENTROIDS_FILE))["centroids"]
    except (OSError, SafetensorError, KeyError) as exc:
        raise ArtifactError(f"corrupt k-means centroids in {out_dir}: {exc}") from exc
    if centroids.shape != (info.r, info.d) or centroids.dtype != np.float32:
        raise ArtifactError(
            f"k-means centroids in {out_dir} have shape {centroids.shape}, expected ({info.r}, {info.d})"
        )
    if info.format_version != KMEANS_FORMAT_VERSION:
        raise ArtifactError(f"k-means result {out_dir} has format version {info.format_version}")
    return centroids, info


def kmeans_job(
    files: Sequence[str],
    out_dir: str,
    *,
    r: int,
    niter: int,
    seed: int,
    max_points_per_centroid: int,
    gpu: bool,
    threads: int | None,
    model_fingerprint: str,
    directions: Sequence[str],
    inputs_digest: str,
) -> dict[str, object]:
    """The k-means stage for one map (a Ray task in the pipeline): sample, train, save; returns the info.

    The sample (at most ``r * max_points_per_centroid`` states, seeded) is what Faiss trains on, so Faiss
    does not subsample again and memory stays bounded by the sample.
    """
    x, total = sample_states([Path(f) for f in files], r * max_points_per_centroid, seed)
    centroids, info = train_kmeans(
        x,
        r,
        niter=niter,
        seed=seed,
        max_points_per_centroid=max_points_per_centroid,
        gpu=gpu,
        threads=threads,
    )
    info.n_available = total
    info.model_fingerprint = model_fingerprint
    info.directions = sorted(directions)
    info.inputs_digest = inputs_digest
    save_kmeans(centroids, info, out_dir)
    log.info("k-means %s: r=%d on %d of %d states in %.1f s", out_dir, r, info.n_train, total, info.seconds)
    return asdict(info)
