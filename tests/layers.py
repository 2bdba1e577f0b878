"""Random output layers, cluster maps and states for the projection tests (clustered, static union, fidelity,
LSH, graph), the two calls those tests make on the tiny model, and the check of a decoder's step input."""

from __future__ import annotations

import numpy as np
import torch

from fastvocab.artifacts_schema.cluster_map import ClusterMap, MapManifest, active_fraction_stats
from fastvocab.artifacts_schema.fingerprint import projection_fingerprint
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels import create_projection
from fastvocab.tasks.maps import ActiveSetCounter, assign, centroid_sq_norms


def build_active_sets(
    cluster_ids: np.ndarray, topk_ids: np.ndarray, r: int, n_vocab: int | None = None, min_count: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Active sets as CSR (indptr, indices, counts) from every state's cluster and top-K ids (n, K).

    ``n_vocab`` defaults to the largest id + 1 (only used to encode pairs; it does not change the result).
    """
    topk_ids = np.asarray(topk_ids)
    if n_vocab is None:
        n_vocab = int(topk_ids.max()) + 1 if topk_ids.size else 1
    counter = ActiveSetCounter(r, n_vocab)
    counter.add(cluster_ids, topk_ids)
    return counter.to_csr(min_count)


def fingerprint(weight: torch.Tensor, bias: torch.Tensor | None) -> str:
    b = None if bias is None else bias.float().numpy()
    return projection_fingerprint(weight.float().numpy(), b)


def map_from_sets(
    centroids: np.ndarray, sets: list[list[int]], n_vocab: int, fp: str, counts: list[list[int]] | None = None
) -> ClusterMap:
    """A ClusterMap from explicit centroids and active sets (ids sorted per cluster)."""
    sets = [sorted(s) for s in sets]
    indptr = np.zeros(len(sets) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sets], out=indptr[1:])
    indices = np.array([i for s in sets for i in s], dtype=np.int32)
    cnt = (
        np.ones(len(indices), np.int32)
        if counts is None
        else np.array([n for c in counts for n in c], np.int32)
    )
    c = np.asarray(centroids, dtype=np.float32)
    manifest = MapManifest(
        model_fingerprint=fp,
        direction="en-it",
        scope="direction",
        r=len(sets),
        k=3,
        d=c.shape[1],
        n_vocab=n_vocab,
        niter=0,
        seed=0,
        states_used=0,
        active_fraction=active_fraction_stats(indptr, n_vocab),
    )
    return ClusterMap(manifest, c, centroid_sq_norms(c), indptr, indices, cnt)


def map_set(cmap: ClusterMap, c: int) -> np.ndarray:
    """Cluster ``c``'s sorted vocabulary ids as the map stores them."""
    return cmap.indices[cmap.indptr[c] : cmap.indptr[c + 1]]


def projection_sets(proj) -> list[torch.Tensor]:
    """Each cluster's sorted vocabulary ids as a clustered projection computes them (always-active ids
    included), on its device."""
    return list(proj.prepared_map.ids)


def map_from_states(states: np.ndarray, topk: np.ndarray, r: int, n_vocab: int, fp: str, seed: int = 0):
    """Centroids = r sampled states (no k-means needed for a test), sets from the members' top-K ids."""
    rng = np.random.default_rng(seed)
    centroids = states[rng.choice(len(states), r, replace=False)].astype(np.float32)
    cluster_ids = assign(states, centroids)
    indptr, indices, counts = build_active_sets(cluster_ids, topk, r, n_vocab)
    sets = [indices[indptr[c] : indptr[c + 1]].tolist() for c in range(r)]
    cnts = [counts[indptr[c] : indptr[c + 1]].tolist() for c in range(r)]
    return map_from_sets(centroids, sets, n_vocab, fp, cnts)


def random_layer(n_vocab=300, d=16, seed=0, dtype=torch.float32, bias: float = 1.0):
    """(W (n_vocab, d), b (n_vocab,)) with standard normal entries; ``bias`` scales b (0: no bias)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_vocab, d, generator=g).to(dtype)
    b = (bias * torch.randn(n_vocab, generator=g)).to(dtype) if bias else None
    return w, b


def random_map(w, b, r=12, size=30, seed=0, extra_empty=0):
    rng = np.random.default_rng(seed)
    n_vocab, d = w.shape
    centroids = 3.0 * rng.standard_normal((r + extra_empty, d))
    sets = [rng.choice(n_vocab, size, replace=False).tolist() for _ in range(r)] + [[]] * extra_empty
    return map_from_sets(centroids, sets, n_vocab, fingerprint(w, b))


def rows_near(cmap: ClusterMap, clusters: list[int], noise=0.05, seed=0, dtype=torch.float32):
    rng = np.random.default_rng(seed)
    h = cmap.centroids[clusters] + noise * rng.standard_normal((len(clusters), cmap.centroids.shape[1]))
    return torch.from_numpy(h.astype(np.float32)).to(dtype)


def random_states(rows: int, d: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(rows, d, generator=torch.Generator().manual_seed(seed))


def paper_case():
    """Clusters 0, 1, 2 with active sets {2,4,6}, {2,8,9}, {1,3} over a vocabulary of 10 (Sec. 2.3)."""
    d, n_vocab = 4, 10
    w, b = random_layer(n_vocab, d, seed=1)
    centroids = 10.0 * np.eye(3, d)  # far apart: row i lands in cluster i
    cmap = map_from_sets(centroids, [[2, 4, 6], [2, 8, 9], [1, 3]], n_vocab, fingerprint(w, b))
    h = torch.from_numpy(centroids.astype(np.float32))  # (3, d), one row per cluster
    return w, b, cmap, h


def decode(adapter, proj, texts, beam=1, max_len=12):
    from fastvocab.decoding.search import beam_search, greedy_search

    batch = adapter.encode_texts(texts, "en", "it")
    if beam == 1:
        return greedy_search(adapter, proj, batch, "en", "it", max_len=max_len)
    settings = SearchSettings(beam=beam, max_len=max_len, early_stopping=False)
    return beam_search(adapter, proj, batch, "en", "it", settings)


def make(adapter, method, **options):
    return create_projection(
        method,
        adapter.output_weight,
        adapter.output_bias,
        always_active=adapter.always_active_ids() if method != "full" else (),
        **options,
    )


def assert_embedding_equals_the_tensor_one(dec) -> None:
    """``dec.embed`` (a ``StaticDecoder``; numpy on CPU where it can) equals the embedding lookup, scale and
    position rows in torch, bit for bit, a pad token's position included."""
    tokens = torch.tensor([5, dec.pad_id, 17, 9])
    for pos in (0, 3, 11):
        x = torch.nn.functional.embedding(tokens, dec.embed_weight) * dec.embed_scale
        row = pos + dec.pos_offset
        if dec.family.pad_positions:
            x = x + dec.positions.index_select(0, torch.where(tokens == dec.pad_id, dec.pad_id, row))
        else:
            x = x + dec.positions[row]
        want = x if dec.ln_embed is None else dec.ln_embed(x)
        got = dec.embed(tokens, pos)
        assert got.dtype == torch.float32 and torch.equal(got, want), pos
