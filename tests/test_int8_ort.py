"""int8 rows that serve steps of many rows run those steps on ONNX Runtime (MLAS) where the machine's probe
found it faster (or ``FASTVOCAB_INT8_GEMM`` says so), fed the input quantised as fbgemm quantises it:
fbgemm's logits to float rounding (bit for bit without a bias), in the parent process and in a forked worker
alike. The tests force the path on at every width, whatever the CPU and its probe."""

from __future__ import annotations

import multiprocessing as mp
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fastvocab import switches
from fastvocab.kernels import create_projection, int8, int8_union
from fastvocab.kernels.ort_session import onnx_unavailable
from tests.layers import random_layer, random_map, rows_near

N, D = 400, 64

pytestmark = pytest.mark.skipif(onnx_unavailable() is not None, reason=str(onnx_unavailable()))


@pytest.fixture
def ort_on(monkeypatch, switch):
    """The path on, and one thread (fastvocab's CPU workers' setting; on more, fbgemm runs)."""
    monkeypatch.setattr(int8, "ort_at", lambda d: True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class CountedSession:
    """A session that counts its runs."""

    def __init__(self, session) -> None:
        self.session, self.runs = session, 0

    def run(self, *args):
        self.runs += 1
        return self.session.run(*args)


def packed_layer(bias: bool, seed: int = 0):
    w, b = random_layer(n_vocab=N, d=D, seed=seed, bias=1.0)
    layer = int8.int8_linear(w * D**-0.5, b if bias else None)
    many = int8.packed_of(layer, many_rows=True)
    assert many.session is not None
    many.session = CountedSession(many.session)
    return layer, int8.packed_of(layer), many


def rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, D, generator=torch.Generator().manual_seed(seed)) * 2


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("n", [int8.ORT_MIN_ROWS, 45])
def test_many_rows_run_on_onnx_runtime_with_fbgemms_logits(ort_on, n, bias):
    layer, plain, many = packed_layer(bias)
    x = rows(n, seed=n)
    want = int8.linear_packed(x, plain)
    got = int8.linear_packed(x, many)
    assert many.session.runs == 1 and plain.session is None
    assert want.abs().max() > 0
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))
    torch.testing.assert_close(got, layer(x), rtol=1e-6, atol=1e-6 * float(want.abs().max()))
    if not bias:  # the same int32 sums times the same scales: fbgemm's floats exactly
        assert torch.equal(got, want)


def test_few_rows_and_several_threads_stay_on_fbgemm(ort_on):
    _, plain, many = packed_layer(bias=True, seed=1)
    x = rows(int8.ORT_MIN_ROWS - 1)
    assert torch.equal(int8.linear_packed(x, many), int8.linear_packed(x, plain))
    torch.set_num_threads(2)  # the fixture sets one back
    x = rows(int8.ORT_MIN_ROWS + 4)
    assert torch.equal(int8.linear_packed(x, many), int8.linear_packed(x, plain))
    assert many.session.runs == 0


def test_forced_onnx_runtime_takes_rows_from_the_floor_on(switch):
    switch(INT8_GEMM="onnxruntime")
    int8.ort_int8.cache_clear()
    int8.ort_at.cache_clear()
    try:
        floor = switches.ORT_MIN_DIM.get()
        layer = int8.int8_linear(torch.randn(8, floor - 1), None)
        assert int8.packed_of(layer, many_rows=True).session is None
        assert int8.packed_of(int8.int8_linear(torch.randn(8, floor), None), many_rows=True).session
    finally:
        int8.ort_int8.cache_clear()
        int8.ort_at.cache_clear()


def _child(packed, x, queue) -> None:
    torch.set_num_threads(1)
    queue.put(int8.linear_packed(x, packed).numpy())  # a tensor would travel by shared memory


def test_a_forked_worker_runs_the_session_it_inherits(ort_on):
    """As translate's workers do: the session opened before the fork runs in the child, on its thread."""
    _, plain, many = packed_layer(bias=True, seed=2)
    many.session = many.session.session  # a counter in the child would not reach the parent
    x = rows(32, seed=3)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child, args=(many, x, queue))
    child.start()
    got = torch.from_numpy(queue.get(timeout=60))
    child.join(timeout=60)
    assert child.exitcode == 0
    want = int8.linear_packed(x, plain)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


def test_the_int8_gemm_is_chosen_by_its_switch():
    int8.ort_int8.cache_clear()
    try:
        with switches.override(INT8_GEMM="fbgemm"):
            assert int8.ort_int8() is False
        int8.ort_int8.cache_clear()
        with switches.override(INT8_GEMM="onnxruntime"):
            assert int8.ort_int8() is True
        refused = "FASTVOCAB_INT8_GEMM='mkl': expected auto, fbgemm or onnxruntime"
        with pytest.raises(ValueError, match=refused), switches.override(INT8_GEMM="mkl"):
            pass
    finally:
        int8.ort_int8.cache_clear()


@pytest.mark.parametrize("kernel", ["dense blocks", "full", "gather"])
def test_clustered_int8_on_onnx_runtime_gives_the_full_int8_logits(ort_on, monkeypatch, kernel, switch):
    """A union step of 32 rows: the centroid scores, and the popular blocks or the whole layer, run on
    ONNX Runtime; every column is the full int8 projection's (fbgemm's) logit, and the rows' clusters are
    fbgemm's."""
    switch(INT8_BLOCK_COLUMNS=64)
    n = len(int8_union.INT8_COST_ROWS)
    assert int8_union.ORT_COST_ROWS == int8_union.INT8_COST_ROWS
    gather_us, dense_us = {"dense blocks": (1.0, 0.5), "full": (1.0, 1e-9), "gather": (0.5, 1e9)}[kernel]
    for table in ("INT8", "ORT"):  # a projection whose rows have sessions prices them by the ORT table
        monkeypatch.setattr(int8_union, f"{table}_GATHER_US", (gather_us,) * n)
        monkeypatch.setattr(int8_union, f"{table}_DENSE_US", (dense_us,) * n)
    w, b = random_layer(n_vocab=N, d=D, seed=3, bias=1.0)
    w = w * D**-0.5
    # sets of half of N: the union touches every block, so with every block dense one GEMM runs over N
    cmap = random_map(w, b, r=12, size=200 if kernel == "full" else 60, seed=1)
    proj = create_projection(
        "clustered", w, b, cluster_map=cmap, int8=True, cache_mb=0, full_when_cheaper=False
    )
    blocks, full = proj._w8.popular.packed, proj._w8.full
    for p in (*blocks, full, proj._assign8):
        p.session = CountedSession(p.session)
    h = rows_near(
        cmap, torch.randint(0, 12, (32,), generator=torch.Generator().manual_seed(5)).tolist(), 0.3, 5
    )
    out = proj(h)
    assert proj._assign8.session.runs == 1
    dense_runs = sum(p.session.runs for p in blocks)
    assert (dense_runs > 0, full.session.runs > 0) == {
        "dense blocks": (True, False), "full": (False, True), "gather": (False, False)
    }[kernel]  # fmt: skip
    fb = create_projection("full", w, b, int8=True)
    fb._q = int8.packed_of(int8.int8_linear(w, b))  # fbgemm's own, whatever the CPU
    want = fb(h).logits.index_select(1, out.ids)
    torch.testing.assert_close(out.logits, want, rtol=1e-5, atol=1e-5)
    scores = torch.ops.quantized.linear_dynamic.default(h, proj._assign8.fbgemm, True)
    assert torch.equal(proj.assign(h), scores.argmax(dim=1))


def test_a_projection_with_sessions_prices_its_kernels_by_the_onnx_runtime_table(ort_on, monkeypatch):
    """The same union, rows and block: dense by one table, gathered by the other."""
    n = len(int8_union.INT8_COST_ROWS)
    monkeypatch.setattr(int8_union, "INT8_DENSE_US", (1.0,) * n)
    monkeypatch.setattr(int8_union, "ORT_DENSE_US", (0.01,) * n)
    monkeypatch.setattr(int8_union, "INT8_GATHER_US", (1.0,) * n)
    monkeypatch.setattr(int8_union, "ORT_GATHER_US", (1.0,) * n)
    assert int8_union.int8_dense_cheaper(100, 32, 1000, on_ort=True)
    assert not int8_union.int8_dense_cheaper(100, 32, 1000)
    w, b = random_layer(n_vocab=N, d=D, seed=3, bias=1.0)
    cmap = random_map(w, b, r=12, size=60, seed=1)
    with_sessions = create_projection("clustered", w, b, cluster_map=cmap, int8=True, cache_mb=0)
    assert with_sessions._w8.on_ort
    monkeypatch.setattr(int8, "ort_at", lambda d: False)
    without = create_projection("clustered", w, b, cluster_map=cmap, int8=True, cache_mb=0)
    assert not without._w8.on_ort


def test_several_sets_at_many_rows_run_each_on_its_session(ort_on):
    """``linear_packed_many``: where a set runs on ONNX Runtime, every set runs as ``linear_packed`` does."""
    _, plain, many = packed_layer(bias=True, seed=4)
    x = rows(int8.ORT_MIN_ROWS + 2, seed=5)
    got = int8.linear_packed_many(x, [many, plain, many])
    assert many.session.runs == 2
    want = int8.linear_packed(x, plain)
    assert torch.equal(got[1], want)
    for g in (got[0], got[2]):
        torch.testing.assert_close(g, want, rtol=1e-6, atol=1e-6 * float(want.abs().max()))


@pytest.mark.skipif(
    not getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)(), reason="the CPU has no AMX tiles"
)
def test_amx_refused_by_the_kernel_counts_as_no_amx():
    """A process the kernel refuses the tile state (as a sandbox or an old kernel does) runs MLAS's AVX-512
    kernels, so the auto choice must not count it as an AMX machine."""
    code = (
        "import sys; sys.path.insert(0, 'benchmarks'); from bench_meta import refuse_amx; "
        "refuse_amx() if sys.argv[1] == 'refuse' else None; "
        "from fastvocab.kernels.cpu_features import amx_usable; print(amx_usable())"
    )
    root = Path(__file__).resolve().parent.parent
    seen = [
        subprocess.run(
            [sys.executable, "-c", code, how], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        for how in ("refuse", "allow")
    ]
    assert seen == ["False", "True"]


def test_a_session_opens_at_its_first_use_or_before_a_fork_of_many_rows(ort_on, monkeypatch):
    """Building the graph imports onnx (0.6 s): rows packed for many rows open their session only when a
    step of as many rows runs them, or when a decode pool will fork workers for such steps."""
    opened: list[int] = []
    real = int8.ort_session_of
    monkeypatch.setattr(int8, "ort_session_of", lambda p: opened.append(1) or real(p))
    layer, _, _ = packed_layer(bias=True)
    assert len(opened) == 1  # packed_layer reads .session
    many = int8.packed_of(layer, many_rows=True)
    assert many.on_ort and len(opened) == 1
    int8.linear_packed(rows(int8.ORT_MIN_ROWS - 1), many)  # few rows: fbgemm, nothing opened
    int8.open_sessions([many, None], int8.ORT_MIN_ROWS - 1)
    assert len(opened) == 1
    int8.open_sessions([many], int8.ORT_MIN_ROWS)
    assert len(opened) == 2 and many.session is not None
    int8.linear_packed(rows(int8.ORT_MIN_ROWS), many)
    assert len(opened) == 2  # opened once


def test_a_clustered_int8_projection_opens_its_sessions_for_many_rows_only(ort_on, monkeypatch):
    w, b = random_layer(n_vocab=N, d=D, seed=3, bias=1.0)
    cmap = random_map(w, b, r=12, size=60, seed=1)
    proj = create_projection("clustered", w, b, cluster_map=cmap, int8=True, cache_mb=0)
    packed = [proj._w8.full, proj._assign8, *proj._w8.popular.packed]
    assert all(p.on_ort and p._session is None for p in packed)
    proj(rows_near(cmap, [0], 0.3, 0))  # one row: fbgemm
    proj.open_sessions(4)
    assert all(p._session is None for p in packed)
    proj.open_sessions(32)
    assert all(p._session is not None for p in packed)
    full = create_projection("full", w, b, int8=True)
    full.open_sessions(int8.ORT_MIN_ROWS)
    assert full._q._session is not None
