"""The static-capacity union step (``kernels/clustered_static.py``) on a GPU: no host sync (under
``torch.cuda.set_sync_debug_mode("error")``), captured in a CUDA graph and replayed on new inputs with the
same results as the eager step and as today's union mode.

Skipped with a reason without a CUDA GPU. On a GPU machine:

    python -m pytest -q tests/gpu/test_clustered_static_graph.py
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: captures the static union step in a CUDA graph",
)

from fastvocab.kernels import create_projection  # noqa: E402
from fastvocab.kernels.clustered_static import StaticUnion  # noqa: E402
from tests.gpu.common import DEV, TOL, layer, make_map, random_sets, rows_near_centroids, without_sync  # noqa: E402


def case(dtype, rows=40, seed=0, n_vocab=3000, r=40):
    w, b = layer(n_vocab=n_vocab, dtype=dtype, seed=seed)
    cmap = make_map(w, b, random_sets(n_vocab, r, [50, 300, 900], seed=seed), seed=seed)
    ref = create_projection("clustered", w, b, cluster_map=cmap, selection="union", backend="torch")
    return w, b, cmap, ref


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_step_has_no_host_sync(dtype):
    _, _, cmap, ref = case(dtype)
    su = StaticUnion(ref, rows=40)
    h = rows_near_centroids(cmap, 40, 1, dtype)
    su.step(h)  # warm-up: lazy init (cuBLAS handles) may sync once
    out = without_sync(lambda: su.step(h))
    want = ref(h)
    c = want.ids.numel()
    assert int(out.count) == c and torch.equal(out.ids[:c], want.ids)
    torch.testing.assert_close(out.logits[:, :c], want.logits, **TOL.get(dtype, dict(rtol=1e-5, atol=1e-5)))


@pytest.mark.parametrize("mass", ["moments", "normaliser"])
def test_step_with_inactive_mass_has_no_host_sync(mass):
    w, b, cmap, _ = case(torch.float32)
    ref = create_projection(
        "clustered", w, b, cluster_map=cmap, selection="union", backend="torch", inactive_mass=mass
    )
    su = StaticUnion(ref, rows=40)
    h = rows_near_centroids(cmap, 40, 3, torch.float32)
    su.step(h)
    out = without_sync(lambda: su.step(h))
    torch.testing.assert_close(out.log_inactive_mass, ref(h).log_inactive_mass, rtol=1e-4, atol=1e-4)


def test_sync_check_can_fail():
    # today's union mode reads its column count back: the same guard must catch it
    _, _, cmap, ref = case(torch.float16)
    h = rows_near_centroids(cmap, 40, 2, torch.float16)
    ref(h)
    with pytest.raises(RuntimeError):
        without_sync(lambda: ref(h))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 40, 128])
def test_cuda_graph_capture_and_replay(dtype, rows):
    _, _, cmap, ref = case(dtype, seed=rows)
    su = StaticUnion(ref, rows=rows)
    static_h = rows_near_centroids(cmap, rows, 0, dtype)
    acc = torch.zeros((), dtype=torch.bool, device=DEV)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs' docs ask
        for _ in range(3):
            su.step(static_h, overflow_acc=acc)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = su.step(static_h, overflow_acc=acc)
    for seed in range(1, 6):  # new inputs copied into the captured buffer, then replayed
        h = rows_near_centroids(cmap, rows, seed, dtype)
        static_h.copy_(h)
        graph.replay()
        eager = su.step(h)
        assert torch.equal(out.count, eager.count) and torch.equal(out.ids, eager.ids)
        # same inputs; cuBLAS may pick another algorithm under capture, so not required bit-identical
        torch.testing.assert_close(out.logits, eager.logits, **TOL[dtype])
        want = ref(h)
        c = want.ids.numel()
        assert torch.equal(out.ids[:c], want.ids)
        torch.testing.assert_close(out.logits[:, :c], want.logits, **TOL[dtype])
    assert not bool(acc)  # the default capacity cannot overflow


def test_cuda_graph_flags_overflow_on_replay():
    _, _, cmap, ref = case(torch.float16, seed=9)
    h_small = (
        rows_near_centroids(cmap, 1, 0, torch.float16).expand(40, -1).contiguous()
    )  # 40 rows, one cluster
    # one set fits, 40 distinct ones do not
    su = StaticUnion(ref, capacity=max(ref.prepared_map.sizes), grow=False)
    static_h = h_small.clone()
    acc = torch.zeros((), dtype=torch.bool, device=DEV)
    su.step(static_h, overflow_acc=acc)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = su.step(static_h, overflow_acc=acc)
    graph.replay()
    assert not bool(out.overflow) and not bool(acc)
    static_h.copy_(rows_near_centroids(cmap, 40, 3, torch.float16))
    graph.replay()
    assert bool(out.overflow) and bool(acc)
    assert int(out.count) == ref(static_h).ids.numel()
