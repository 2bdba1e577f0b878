"""k-means result folder: the centroids of one map and how they were trained.

``<work_dir>/kmeans/<map name>/`` (written atomically, both files or neither)::

    centroids.safetensors   centroids [r, d] float32
    kmeans.json             r, d, niter, seed, objective per iteration, training points, inputs digest, time
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.jsonfile import require_json, write_json

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


def save_kmeans(centroids: np.ndarray, info: KMeansInfo, out_dir: str | Path) -> Path:
    """Write centroids + info atomically (both appear together or neither)."""
    from safetensors.numpy import save_file

    out_dir = Path(out_dir)
    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        save_file({"centroids": np.ascontiguousarray(centroids, dtype=np.float32)}, str(tmp / CENTROIDS_FILE))
        write_json(tmp / INFO_FILE, asdict(info))
    return out_dir


def load_kmeans_info(out_dir: str | Path) -> KMeansInfo:
    """The ``kmeans.json`` of a result folder (without reading the centroids)."""
    info_path = Path(out_dir) / INFO_FILE
    data = require_json(info_path, "k-means info", f"no k-means result at {out_dir} (missing {INFO_FILE})")
    try:
        info = KMeansInfo(**data)
    except TypeError as exc:
        raise ArtifactError(f"corrupt k-means info {info_path}: {exc}") from exc
    if info.format_version != KMEANS_FORMAT_VERSION:
        raise ArtifactError(f"k-means result {out_dir} has format version {info.format_version}")
    return info


def load_kmeans(out_dir: str | Path) -> tuple[np.ndarray, KMeansInfo]:
    """Load and check a k-means output folder; raises ArtifactError naming the folder when it is bad."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    out_dir = Path(out_dir)
    info = load_kmeans_info(out_dir)
    try:
        centroids = load_file(str(out_dir / CENTROIDS_FILE))["centroids"]
    except (OSError, SafetensorError, KeyError) as exc:
        raise ArtifactError(f"corrupt k-means centroids in {out_dir}: {exc}") from exc
    if centroids.shape != (info.r, info.d) or centroids.dtype != np.float32:
        raise ArtifactError(
            f"k-means centroids in {out_dir} have shape {centroids.shape}, expected ({info.r}, {info.d})"
        )
    return centroids, info
