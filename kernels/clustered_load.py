"""What a clustered projection checks and builds once, at load (``ClusteredProjection.__init__``): its map,
checked against the model; the tables of the ``normaliser`` estimate (the map's, else computed here); the
shortlist whose candidates join the clusters' sets; and the backend the step runs on, with why the CuPy
kernels or the int8 path cannot serve a weight."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from fastvocab.artifacts_schema.cluster_map import ClusterMap, load_cluster_map
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.kernels.cluster_assign import PreparedMap
from fastvocab.kernels.inactive_mass import NormaliserTables, normaliser_tables
from fastvocab.kernels.shortlist import ShortlistProjection

log = logging.getLogger("fastvocab.kernels.clustered")  # the projection's messages, under its own name

# The curvature basis of a map's normaliser: the maps' default (tasks.maps.MapParams, the pipeline's
# maps.normaliser_rank), and the rank used when a map has no normaliser for the sets in use and it is computed
# here.
DEFAULT_NORMALISER_RANK = 32


def checked_map(cluster_map: ClusterMap | str | Path, fingerprint: str, n_vocab: int, d: int) -> ClusterMap:
    """The map (a :class:`ClusterMap` or a map folder, loaded), refused with an ArtifactError unless it was
    built for the model of ``fingerprint`` and its output layer's ``n_vocab`` x ``d``."""
    if isinstance(cluster_map, (str, Path)):
        cmap = load_cluster_map(cluster_map, expect_fingerprint=fingerprint)
        where = str(cluster_map)
    elif isinstance(cluster_map, ClusterMap):
        cmap, where = cluster_map, f"cluster map {cluster_map.manifest.direction!r}"
        if cmap.manifest.model_fingerprint != fingerprint:
            raise ArtifactError(
                f"{where} was built for model {cmap.manifest.model_fingerprint}, "
                f"but the loaded model is {fingerprint}"
            )
    else:
        raise ValueError(f"cluster_map must be a ClusterMap or a map folder, got {type(cluster_map)}")
    m = cmap.manifest
    if (m.n_vocab, m.d) != (n_vocab, d) or cmap.centroids.shape[1] != d:
        raise ArtifactError(
            f"{where} has N={m.n_vocab}, d={m.d}; the model's output layer has N={n_vocab}, d={d}"
        )
    return cmap


def map_normaliser(
    cmap: ClusterMap,
    pm: PreparedMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    always_active: list[int],
) -> tuple[NormaliserTables, str]:
    """The map's stored normaliser when it describes the sets in use (their ``always_active`` ids), else one
    computed now over the prepared map ``pm``; and which: ``"map"`` or ``"computed at load"``."""
    stored = cmap.normaliser
    if stored is not None and cmap.manifest.normaliser.get("always_active") == sorted(always_active):
        dev = weight.device

        def t(a: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(dev)

        tables = NormaliserTables(
            lse=t(stored.lse),
            grad=t(stored.grad),
            basis=t(stored.basis),
            curv=t(stored.curv),
            resid=t(stored.resid),
            centroids=t(cmap.centroids),
        )
        return tables, "map"
    pruned = stored is None and cmap.manifest.normaliser
    why = "pruned by min_count" if pruned else "not stored for these sets"
    log.info("clustered projection: computing the normaliser at load time (%s)", why)
    rank = int(cast(int, cmap.manifest.normaliser.get("rank", DEFAULT_NORMALISER_RANK)))
    tables = normaliser_tables(
        torch.from_numpy(cmap.centroids), weight, bias, pm.indptr, pm.indices, min(rank, weight.shape[1])
    )
    return tables, "computed at load"


def joined_shortlist(
    selection: Any,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    direction: str | None,
    always_active: list[int],
    fingerprint: str,
) -> ShortlistProjection | None:
    """The shortlist whose candidates join the union (``Selection.shortlist``), over the same W; one of
    another model, or of another direction than a per-direction map's, is refused."""
    if selection.shortlist is None:
        return None
    return ShortlistProjection(
        weight,
        bias,
        index=selection.shortlist,
        k=selection.shortlist_k,
        frequent=selection.shortlist_frequent,
        copy=selection.shortlist_copy,
        scope="batch",
        direction=direction,
        always_active=always_active,
        fingerprint=fingerprint,
    )


def pick_backend(backend: str, weight: torch.Tensor, shortlist: bool, probes: int) -> str:
    """The backend asked for (``Compute.backend``) where the weight's device allows it: ``cupy`` on CUDA
    where its kernels serve the weight, without a ``shortlist`` joined and at one probe; else ``torch``
    (``auto``), or a ValueError naming why (``cupy`` asked for)."""
    device = weight.device
    if device.type != "cuda":
        if backend == "cupy":
            raise ValueError(f"backend 'cupy' needs a CUDA device; the weight is on {device}")
        return "torch"
    if backend == "torch":
        return "torch"
    if shortlist:
        reason: str | None = "a shortlist joins the sets"
    else:
        reason = "probes > 1" if probes > 1 else cupy_unsupported(weight)
    if reason is None:
        return "cupy"
    if backend == "cupy":
        raise ValueError(f"backend 'cupy' is not usable here: {reason}")
    log.info("clustered projection: torch CUDA backend (%s)", reason)
    return "torch"


def check_int8(device: torch.device) -> None:
    """``int8`` is a CPU path (its backend is checked with the options, ``clustered_parts.Compute``)."""
    if device.type != "cpu":
        raise ValueError(
            f"int8 clustered projection runs on CPU only (its int8 GEMMs are CPU kernels), W is on {device}"
        )


def cupy_unsupported(weight: torch.Tensor) -> str | None:
    """Why the CuPy kernels cannot serve this weight (None when they can)."""
    if weight.dtype not in (torch.float16, torch.bfloat16):
        return f"the kernels take fp16/bf16 weights, got {weight.dtype}"
    if weight.shape[1] % 32:
        return f"the kernels need d % 32 == 0, got d={weight.shape[1]}"
    major, _ = torch.cuda.get_device_capability(weight.device)
    if major < 8:
        return "the tensor-core kernel needs compute capability 8.0+ (mma.sync m16n8k16)"
    try:
        import cupy  # noqa: F401
    except ImportError as exc:
        return f"cupy is not installed ({exc})"
    return None
