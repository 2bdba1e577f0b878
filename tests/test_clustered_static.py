"""Static-capacity union step (``kernels/clustered_static.py``): equal to today's union mode on the union's
columns and in the argmax, overflow flagged and never silently served, and no host sync inside the step
(checked two ways on CPU: no op that reads a tensor's value back to the host is dispatched, and the step
traces under ``torch.compile(fullgraph=True)``). The CUDA-graph capture test is in tests/gpu/.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fastvocab.kernels import create_projection
from fastvocab.kernels.clustered_static import StaticUnion, static_union_columns, union_capacity
from tests.layers import fingerprint, map_from_sets, paper_case, random_layer, random_map, rows_near

# Ops that copy a tensor's value to the host (.item(), int(t), .tolist(), bool(t)) or whose output shape
# depends on the data (a sync on CUDA): none may run inside the step.
SYNC_OPS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "item")


class RecordOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def union_case(seed: int, n_vocab: int = 500, r: int = 16, size: int = 40, rows: int = 9):
    w, b = random_layer(n_vocab, 24, seed=seed)
    cmap = random_map(w, b, r=r, size=size, seed=seed)
    which = np.random.default_rng(seed).integers(0, r, rows).tolist()
    h = rows_near(cmap, which, seed=seed)
    ref = create_projection("clustered", w, b, cluster_map=cmap, selection="union", cache_mb=0)
    return w, b, cmap, h, ref


def test_paper_example_columns_and_padding():
    w, b, cmap, h = paper_case()
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection="union", cache_mb=0)
    su = StaticUnion(proj, capacity=10)
    out = su.step(h)
    assert int(out.count) == 7 and not bool(out.overflow)
    assert out.ids[:7].tolist() == [1, 2, 3, 4, 6, 8, 9]  # the paper's reduced column set
    assert out.ids[7:].tolist() == [1, 1, 1]  # padding repeats the first union id
    assert torch.isneginf(out.logits[:, 7:]).all()
    full = torch.nn.functional.linear(h, w, b)
    torch.testing.assert_close(out.logits[:, :7], full[:, out.ids[:7]], rtol=0, atol=1e-6)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bias", [True, False])
def test_equals_union_mode_on_random_inputs(seed, bias):
    w, _, _, h, ref = union_case(seed)
    if not bias:
        ref = create_projection(
            "clustered", w, None, cluster_map=random_map(w, None, r=16, size=40, seed=seed), cache_mb=0
        )
    want = ref(h)
    c = want.ids.numel()
    for capacity in (c, c + 37, union_capacity(ref._map.sizes, h.shape[0], ref.n_vocab)):
        out = StaticUnion(ref, capacity=capacity).step(h)
        assert int(out.count) == c and not bool(out.overflow)
        assert torch.equal(out.ids[:c], want.ids)
        torch.testing.assert_close(out.logits[:, :c], want.logits, rtol=1e-6, atol=1e-6)
        assert torch.isneginf(out.logits[:, c:]).all()
        assert torch.equal(out.clusters, ref.assign(h))
        # the search reads the argmax over the whole (padded) buffer and maps it to vocabulary ids
        got = out.ids[out.logits.argmax(dim=1)]
        assert torch.equal(got, want.ids[want.logits.argmax(dim=1)])
        # and the dense view equals union mode's
        eager = StaticUnion(ref, capacity=capacity).project(h)
        torch.testing.assert_close(eager.dense(), want.dense(), rtol=1e-6, atol=1e-6)


def test_half_precision_matches_union_mode():
    w, b, cmap, h, _ = union_case(3)
    w16, b16 = w.to(torch.bfloat16), b.to(torch.bfloat16)
    cmap.manifest.model_fingerprint = fingerprint(w16, b16)
    ref = create_projection("clustered", w16, b16, cluster_map=cmap, selection="union", cache_mb=0)
    want = ref(h.to(torch.bfloat16))
    out = StaticUnion(ref, rows=h.shape[0]).step(h)
    c = want.ids.numel()
    assert out.logits.dtype == torch.bfloat16 and torch.equal(out.ids[:c], want.ids)
    torch.testing.assert_close(out.logits[:, :c], want.logits, rtol=1e-2, atol=1e-2)


def test_default_capacity_never_overflows():
    *_, cmap, _, ref = union_case(7, size=60, rows=12)
    su = StaticUnion(ref, rows=12)
    covered = len(set(cmap.indices.tolist()))  # 440 of 500: sixteen sets of 60 overlap
    assert su.capacity == min(covered, 12 * max(ref._map.sizes))
    for seed in range(5):
        which = np.random.default_rng(100 + seed).integers(0, 16, 12).tolist()
        assert not bool(su.step(rows_near(cmap, which, seed=seed)).overflow)


def test_default_capacity_is_at_most_the_ids_the_map_holds():
    """Sets drawn from a pool of 60 ids out of 500: past a few rows the sum of set sizes exceeds the pool,
    and the bound is the pool (the ids in any set), not N; every cluster in the batch still fits."""
    w, b = random_layer(500, 24, seed=5)
    pool = np.random.default_rng(5).choice(500, 60, replace=False)
    sets = [np.random.default_rng(c).choice(pool, 30, replace=False).tolist() for c in range(16)]
    centroids = 3.0 * np.random.default_rng(6).standard_normal((16, 24))
    cmap = map_from_sets(centroids, sets, 500, fingerprint(w, b))
    ref = create_projection("clustered", w, b, cluster_map=cmap, selection="union", cache_mb=0)
    covered = len(set().union(*sets))
    assert (
        union_capacity(ref._map.sizes, 16, 500) == 480
        and union_capacity(ref._map.sizes, 16, 500, covered) == covered
    )
    su = StaticUnion(ref, rows=16)
    assert su.capacity == covered <= 60
    h = rows_near(cmap, list(range(16)))  # every cluster at once: the largest union the map can give
    want = ref(h)
    out = su.step(h)
    assert not bool(out.overflow) and int(out.count) == want.ids.numel() == covered
    torch.testing.assert_close(out.logits[:, :covered], want.logits, rtol=1e-6, atol=1e-6)


def test_overflow_is_flagged_and_falls_back_to_full_logits():
    w, b, _, h, ref = union_case(11, rows=9)
    c = ref(h).ids.numel()
    assert c > 10
    su = StaticUnion(ref, capacity=c - 5, grow=False)
    out = su.step(h)
    assert bool(out.overflow) and int(out.count) == c  # the true size, not the capacity
    acc = torch.zeros((), dtype=torch.bool)
    su.step(h[:1], overflow_acc=acc)
    assert not bool(acc)  # one row's set fits
    su.step(h, overflow_acc=acc)
    su.step(h[:1], overflow_acc=acc)
    assert bool(acc)  # sticky once set
    # eager: full logits for the overflowing step, never a truncated column set
    got = su.project(h)
    assert got.ids is None and su.fallbacks == 1
    torch.testing.assert_close(got.logits, torch.nn.functional.linear(h, w, b))
    assert su.capacity == c - 5  # grow=False keeps it


def test_overflow_grows_capacity_when_asked():
    *_, h, ref = union_case(12, rows=9)
    c = ref(h).ids.numel()
    su = StaticUnion(ref, capacity=4)
    assert su.project(h).ids is None and su.capacity >= c
    again = su.project(h)  # the grown capacity holds the union: the clustered output again
    assert again.ids is not None and torch.equal(again.ids[:c], ref(h).ids)


def test_columns_helper_with_capacity_n():
    # capacity == N: any union fits; ids past the count repeat the first one
    indptr = torch.tensor([0, 3, 6])
    indices = torch.tensor([2, 4, 6, 2, 8, 9])
    cols = static_union_columns(torch.tensor([1, 0, 1]), indptr, indices, 10, 3, 10)
    assert cols.ids.tolist() == [2, 4, 6, 8, 9, 2, 2, 2, 2, 2]
    assert cols.valid.tolist() == [True] * 5 + [False] * 5 and int(cols.count) == 5
    assert not bool(cols.overflow) and cols.own is None  # own: only when asked for


def test_columns_helper_marks_each_rows_own_set():
    # union [2, 4, 6, 8, 9]; cluster 0 = {2, 4, 6} at positions 0-2, cluster 1 = {2, 8, 9} at 0, 3, 4
    indptr = torch.tensor([0, 3, 6])
    indices = torch.tensor([2, 4, 6, 2, 8, 9])
    cols = static_union_columns(torch.tensor([1, 0, 1]), indptr, indices, 10, 3, 6, own=True)
    assert cols.own.tolist() == [
        [True, False, False, True, True, False],
        [True, True, True, False, False, False],
        [True, False, False, True, True, False],
    ]
    # over capacity (4 < 5): the id that found no position (9) is in no row's mask, the rest keep theirs
    cols = static_union_columns(torch.tensor([1, 0]), indptr, indices, 10, 3, 4, own=True)
    assert bool(cols.overflow)
    assert cols.own.tolist() == [[True, False, False, True], [True, True, True, False]]


@pytest.mark.parametrize("mass", ["centroid", "moments", "normaliser"])
def test_inactive_mass_equals_union_modes(mass):
    """The projection's estimate comes along, the same numbers as union mode's, at a tight capacity and at
    one with padding; the log-probs of the union's columns then agree too (what beam search reads)."""
    w, b, cmap, h, _ = union_case(4)
    ref = create_projection(
        "clustered", w, b, cluster_map=cmap, selection="union", cache_mb=0, inactive_mass=mass
    )
    want = ref(h)
    assert want.log_inactive_mass is not None and len(set(ref.assign(h).tolist())) > 1
    c = want.ids.numel()
    for capacity in (c, c + 29):
        su = StaticUnion(ref, capacity=capacity)
        out = su.step(h)
        torch.testing.assert_close(out.log_inactive_mass, want.log_inactive_mass, rtol=1e-5, atol=1e-5)
        got = su.project(h).log_probs()
        torch.testing.assert_close(got[:, :c], want.log_probs(), rtol=1e-5, atol=1e-5)
    # without an estimate there is none
    assert StaticUnion(union_case(4)[-1], capacity=c).step(h).log_inactive_mass is None


def test_what_a_static_shape_cannot_hold_is_refused():
    w, b, cmap, _, _ = union_case(0)
    kw = dict(cluster_map=cmap, selection="union", cache_mb=0)
    with pytest.raises(ValueError, match="exact_k / mass_radius"):
        StaticUnion(create_projection("clustered", w, b, exact_k=2, **kw), capacity=50)
    radius = create_projection("clustered", w, b, inactive_mass="moments", mass_radius=1.0, **kw)
    with pytest.raises(ValueError, match="exact_k / mass_radius"):
        StaticUnion(radius, capacity=50)
    with pytest.raises(ValueError, match="no 'oracle' inactive-mass"):
        StaticUnion(create_projection("clustered", w, b, inactive_mass="oracle", **kw), capacity=50)


def test_bad_capacity_is_refused():
    *_, ref = union_case(0)
    with pytest.raises(ValueError, match="capacity must be"):
        StaticUnion(ref, capacity=0)
    with pytest.raises(ValueError, match="give capacity"):
        StaticUnion(ref)


# ------------------------------------------------------------------------------------------- no host sync


@pytest.mark.parametrize("mass", ["none", "moments", "normaliser"])
def test_step_dispatches_no_host_read(mass):
    w, b, cmap, h, ref = union_case(5)
    if mass != "none":
        ref = create_projection(
            "clustered", w, b, cluster_map=cmap, selection="union", cache_mb=0, inactive_mass=mass
        )
    su = StaticUnion(ref, rows=h.shape[0])
    with RecordOps() as rec:
        su.step(h)
    bad = [n for n in rec.names if n in SYNC_OPS]
    assert rec.names and not bad, f"host-syncing ops in the step: {bad}"
    # the check can fail: today's union mode reads its column count back (nonzero in union_columns)
    with RecordOps() as rec_union:
        ref(h)
    assert any(n in SYNC_OPS for n in rec_union.names)


def test_step_traces_as_one_graph():
    *_, h, ref = union_case(6)
    su = StaticUnion(ref, rows=h.shape[0])
    torch._dynamo.reset()
    # backend "eager": Dynamo traces (and refuses any graph break: .item(), .tolist(), data-dependent shapes)
    # without compiling code, so this needs no C++ compiler
    step = torch.compile(lambda x: su.step(x).logits, backend="eager", fullgraph=True)
    want = su.step(h)
    torch.testing.assert_close(step(h), want.logits)
    # ... and the check can fail: the eager fallback path reads the flag on the host
    with pytest.raises(Exception):  # noqa: B017 (torch._dynamo's Unsupported or a subclass of it)
        torch.compile(lambda x: su.project(x).logits, backend="eager", fullgraph=True)(h)
    torch._dynamo.reset()


def test_output_logits_are_minus_inf_only_at_padding():
    *_, h, ref = union_case(8)
    out = StaticUnion(ref, rows=h.shape[0]).step(h)
    c = int(out.count)
    assert torch.isfinite(out.logits[:, :c]).all()
    assert (out.logits[:, c:] == -math.inf).all()
