"""fbgemm's int8 GEMM is called from TorchScript (one call for a step's several packed row sets), which hands
it the packed weights in C++: the op's own logits, whichever way it is called."""

from __future__ import annotations

import pytest
import torch

from fastvocab.kernels import int8

D = 48


def layer(n: int, seed: int, bias: bool = True):
    gen = torch.Generator().manual_seed(seed)
    b = torch.randn(n, generator=gen) if bias else None
    return int8.int8_linear(torch.randn(n, D, generator=gen) * D**-0.5, b)


def op(x: torch.Tensor, packed: int8.PackedRows) -> torch.Tensor:
    return torch.ops.quantized.linear_dynamic.default(x, packed.fbgemm, True)


@pytest.mark.parametrize("rows", [1, 4, 33])
def test_packed_rows_give_the_ops_logits_one_set_or_several(rows):
    layers = [layer(n, seed=n, bias=n != 70) for n in (30, 70, 5)]
    packed = [int8.packed_of(lin) for lin in layers]
    x = torch.randn(rows, D, generator=torch.Generator().manual_seed(rows)) * 3
    want = [op(x, p) for p in packed]
    assert all(w.abs().max() > 0 for w in want)
    assert all(torch.equal(int8.linear_packed(x, p), w) for p, w in zip(packed, want, strict=True))
    assert all(torch.equal(lin(x), w) for lin, w in zip(layers, want, strict=True))
    got = int8.linear_packed_many(x, packed)
    assert len(got) == 3 and all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_the_calls_are_compiled_here_and_fall_back_to_python_without_torchscript(monkeypatch):
    one, each = int8._fbgemm_calls()
    assert isinstance(one.__wrapped__, torch.jit.ScriptFunction)
    assert isinstance(each.__wrapped__, torch.jit.ScriptFunction)
    packed = int8.packed_of(layer(20, seed=1))
    x = torch.randn(3, D)
    want = op(x, packed)
    assert torch.equal(one(x, packed.fbgemm), want)
    assert torch._C._get_graph_executor_optimize()  # the plain executor's flag is set back after a call

    def gone(fn):
        raise RuntimeError("no TorchScript")

    int8._fbgemm_calls.cache_clear()
    monkeypatch.setattr(torch.jit, "script", gone)
    try:
        assert int8._fbgemm_calls() == (int8._fbgemm_one, int8._fbgemm_each)
        assert torch.equal(int8.linear_packed(x, packed), want)
        assert torch.equal(int8.linear_packed_many(x, [packed, packed])[1], want)
    finally:
        int8._fbgemm_calls.cache_clear()


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.ao.quantization, the reference
def test_quantised_layers_call_the_op_as_torchs_own_dynamic_linear_does():
    """``quantize_linears`` swaps in :class:`~fastvocab.kernels.int8.Int8Linear`: torch's dynamic int8
    layer, with its weights, whose call gives torch's layer's output bit for bit (2-d and 3-d input)."""
    from torch import nn
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    gen = torch.Generator().manual_seed(3)
    model = nn.Sequential(nn.Linear(D, 40), nn.ReLU(), nn.Linear(40, 24, bias=False))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    ours = int8.quantize_linears(model)
    torchs = quantize_dynamic(model, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    assert isinstance(ours[0], int8.Int8Linear) and isinstance(ours[2], int8.Int8Linear)
    assert type(torchs[0]) is not int8.Int8Linear
    for x in (torch.randn(5, D, generator=gen), torch.randn(2, 3, D, generator=gen)):
        want = torchs(x)
        assert want.abs().max() > 0 and torch.equal(ours(x), want)
