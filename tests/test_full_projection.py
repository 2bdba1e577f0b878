"""The full projection's pre-packed CPU path (``fastvocab.kernels.full``): same logits as ``F.linear`` (to
float rounding) on every row-count path, ``self.weight`` kept, pickling, and the F.linear fallback; and the
step timer every projection has (``Projection.time_steps``)."""

from __future__ import annotations

import copy
import logging
import pickle
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn.functional as F

from fastvocab.kernels import create_projection
from fastvocab.kernels import prepack as prepack_mod
from fastvocab.kernels.full import FullProjection
from fastvocab.kernels.prepack import prepack_unavailable

needs_prepack = pytest.mark.skipif(
    prepack_unavailable(torch.zeros(1, 1)) is not None, reason="torch.ops.mkldnn linear ops unavailable"
)


@pytest.fixture(autouse=True)
def pack_small_w(switch):
    """The test matrices are far below PREPACK_MIN_BYTES: pack them anyway (unless a test says otherwise)."""
    switch(PREPACK_MIN_BYTES=0)


def _wb(n: int = 300, d: int = 24, bias: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(n, d, generator=gen)
    return w, (torch.randn(n, generator=gen) if bias else None)


@needs_prepack
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [0, 1, prepack_mod.SMALL_ROWS - 1, prepack_mod.SMALL_ROWS, 33])
def test_packed_logits_equal_f_linear(rows, bias):
    w, b = _wb(bias=bias)
    proj = create_projection("full", w, b)
    assert proj.packed and proj.weight.shape == (300, 24)
    torch.testing.assert_close(proj.weight, w)  # other users (fingerprint, fallbacks) read W as (N, d)
    h = torch.randn(rows, 24)
    out = proj(h)
    assert out.ids is None and out.logits.shape == (rows, 300)
    torch.testing.assert_close(out.logits, F.linear(h, w, b), rtol=1e-5, atol=1e-5)
    with torch.inference_mode():
        torch.testing.assert_close(proj(h).logits, out.logits)


@needs_prepack
def test_pickle_and_deepcopy_pack_again():
    w, b = _wb()
    proj = create_projection("full", w, b, always_active=(2, 5))
    h = torch.randn(9, 24)
    for other in (pickle.loads(pickle.dumps(proj)), copy.deepcopy(proj)):
        assert other.packed
        torch.testing.assert_close(other(h).logits, proj(h).logits)
        assert other.signature() == proj.signature()


@needs_prepack
def test_in_place_change_of_w_is_seen():
    """As with F.linear on W: a row of W edited in place (a test fits the EOS row so) changes the logits."""
    w, b = _wb()
    proj = create_projection("full", w, b)
    h = torch.randn(6, 24)
    for rows in (1, 6):  # both copies (W^T and the packed W) follow
        with torch.no_grad():
            w[7] = torch.randn(24)
        torch.testing.assert_close(proj(h[:rows]).logits, F.linear(h[:rows], w, b), rtol=1e-5, atol=1e-5)


def test_fallback_is_f_linear_and_logged(caplog, switch):
    w, b = _wb()
    switch(PREPACK_MIN_BYTES=4 << 20)
    with caplog.at_level(logging.DEBUG, logger="fastvocab.kernels.full"):
        small = FullProjection(w, b)  # 29 KB: F.linear is as fast
    assert not small.packed and "where packing does not pay" in caplog.text
    h = torch.randn(5, 24)
    off = FullProjection(w, b, prepack=False)
    assert not off.packed
    assert torch.equal(off(h).logits, F.linear(h, w, b))
    with caplog.at_level(logging.DEBUG, logger="fastvocab.kernels.full"):
        half = FullProjection(w.to(torch.bfloat16), b.to(torch.bfloat16))
    assert not half.packed
    assert "F.linear on W" in caplog.text and "float32 path" in caplog.text
    assert prepack_unavailable(torch.zeros(1, 1, device="meta")) is not None


def test_int8_projection_does_not_pack():
    w, b = _wb()
    q = FullProjection(w, b, int8=True)
    assert not q.packed


def test_int8_option_equals_a_dynamic_int8_linear_over_w():
    """``create_projection("full", ..., int8=True)``: the logits of a dynamic int8 ``nn.Linear`` holding W and
    b (what the int8 projection computed before it became an option), ``dtype:int8`` in the signature."""
    from torch import nn

    from fastvocab.kernels.int8 import quantize_linears

    w, b = _wb()
    lin = nn.Linear(w.shape[1], w.shape[0])
    with torch.no_grad():
        lin.weight.copy_(w)
        lin.bias.copy_(b)
    h = torch.randn(7, w.shape[1], generator=torch.Generator().manual_seed(3))
    want = quantize_linears(nn.Sequential(lin))[0](h)
    q = create_projection("full", w, b, int8=True, fingerprint="sha256:test")
    got = q(h)
    assert torch.equal(got.logits, want) and got.ids is None
    assert q.options() == {"dtype": "int8"} and "|dtype:int8|" in q.signature()
    assert create_projection("full", w, b, fingerprint="sha256:test").options() == {}
    with pytest.raises(ValueError, match="CPU only"):
        FullProjection(w.to("meta"), b.to("meta"), int8=True)


def test_capturable_steps():
    """The full projection's captured step is itself; a method without one says None (the base class)."""
    from fastvocab.kernels.base import Projection

    w, b = _wb()
    full = FullProjection(w, b)
    step = full.capturable(rows=5)
    h = torch.randn(5, w.shape[1])
    assert step is not None and step.overflow is None and torch.equal(step(h).logits, full(h).logits)

    class NoStep(Projection):
        pass

    assert NoStep(w, b).capturable(rows=5) is None


def test_time_steps_sums_the_steps_over_threads_and_changes_no_output():
    from fastvocab.kernels.base import Projection, ProjectionOutput

    class Slow(Projection):
        def _project(self, h: torch.Tensor) -> ProjectionOutput:
            time.sleep(0.02)
            return ProjectionOutput(h @ self.weight.t(), None, self.n_vocab)

    w, _ = _wb(bias=False)
    proj = Slow(w, None)
    h = torch.randn(3, w.shape[1])
    untimed = proj(h).logits
    assert proj.step_seconds == 0.0  # off until asked
    proj.time_steps()
    assert torch.equal(proj(h).logits, untimed)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(proj, [h] * 4))
    assert 5 * 0.02 <= proj.step_seconds < 5 * 0.02 + 1.0  # summed over the threads, not wall time
    proj.time_steps()  # zeroes
    assert proj.step_seconds == 0.0
    proj.time_steps(False)
    proj(h)
    assert proj.step_seconds == 0.0
