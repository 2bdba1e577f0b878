"""Helpers the GPU tests share: random layers and cluster maps on the device, states near centroids, and a
guard that turns any device-to-host sync into an error. Imports nothing that needs a GPU."""

from __future__ import annotations

import math

import numpy as np
import torch

from fastvocab.artifacts_schema.cluster_map import ClusterMap, MapManifest, active_fraction_stats
from fastvocab.artifacts_schema.fingerprint import projection_fingerprint

DEV = "cuda"
HALF = [torch.float16, torch.bfloat16]
# Both sides accumulate in fp32; they differ by the summation order and the final rounding to 16 bits.
TOL = {torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1.6e-2)}


def layer(n_vocab=3000, d=128, dtype=torch.float16, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n_vocab, d, generator=g) / math.sqrt(d)).to(dtype)
    b = (0.1 * torch.randn(n_vocab, generator=g)).to(dtype) if bias else None
    return w.to(DEV), None if b is None else b.to(DEV)


def csr(sets):
    indptr = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sets], out=indptr[1:])
    indices = np.concatenate([np.sort(np.asarray(s)) for s in sets]).astype(np.int32)
    return torch.from_numpy(indptr).to(DEV), torch.from_numpy(indices).to(DEV)


def random_sets(n_vocab, r, sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.choice(n_vocab, int(s), replace=False) for s in rng.choice(sizes, r)]


def make_map(w, b, sets, seed=0):
    rng = np.random.default_rng(seed)
    n_vocab, d = w.shape
    c = rng.standard_normal((len(sets), d)).astype(np.float32)
    indptr = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sets], out=indptr[1:])
    bb = None if b is None else b.float().cpu().numpy()
    manifest = MapManifest(
        model_fingerprint=projection_fingerprint(w.float().cpu().numpy(), bb),
        direction="en-it",
        scope="direction",
        r=len(sets),
        k=3,
        d=d,
        n_vocab=n_vocab,
        niter=0,
        seed=0,
        states_used=0,
        active_fraction=active_fraction_stats(indptr, n_vocab),
    )
    indices = np.concatenate([np.sort(s) for s in sets]).astype(np.int32)
    return ClusterMap(manifest, c, (c * c).sum(1), indptr, indices, np.ones(len(indices), np.int32))


def rows_near_centroids(cmap, rows, seed, dtype):
    rng = np.random.default_rng(seed)
    which = rng.integers(0, len(cmap.centroids), rows)
    h = cmap.centroids[which] + 0.05 * rng.standard_normal((rows, cmap.centroids.shape[1])).astype(np.float32)
    return torch.from_numpy(h).to(DEV, dtype)


def without_sync(fn):
    """``fn()`` with any device-to-host sync raising (``set_sync_debug_mode("error")``)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        return fn()
    finally:
        torch.cuda.set_sync_debug_mode("default")
