"""Pre-packed float32 linears (``fastvocab.kernels.prepack``) and the static decoder's use of them: the same
outputs as ``nn.Linear`` to float rounding, only large enough layers packed, undone before int8, and the
decoder's ``h`` unchanged on a model whose layers all get packed."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from conftest import decoder_steps, generate_ids, synthetic_sentences
from torch import nn

from fastvocab import switches
from fastvocab.decoding import Seq2SeqAdapter, greedy_search
from fastvocab.kernels import create_projection
from fastvocab.kernels import prepack as prepack_mod
from fastvocab.kernels.int8 import Int8Linear
from fastvocab.kernels.prepack import PackedLinear, prepack_linears, prepack_unavailable, unpack_linears

orig_packed_linear = prepack_mod.packed_linear

pytestmark = pytest.mark.skipif(
    prepack_unavailable(torch.zeros(1, 1)) is not None, reason="torch.ops.mkldnn linear ops unavailable"
)


def _linear(d_in: int = 24, d_out: int = 40, bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(d_in, d_out, bias=bias).requires_grad_(False)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [0, 1, 3, 4, 33, 300])
def test_packed_linear_equals_the_linear(rows, bias, monkeypatch):
    lin = _linear(bias=bias)
    packed = PackedLinear(lin)
    x = torch.randn(rows, 24)
    want = lin(x)
    calls = []
    monkeypatch.setattr(prepack_mod, "packed_linear", lambda *a: calls.append(1) or orig_packed_linear(*a))
    got = packed(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # few rows, or more than the packed GEMM pays for at this thread count: the linear itself
    plain = rows not in prepack_mod.packed_rows()
    assert bool(calls) is not plain
    if plain:
        assert torch.equal(got, want)
    # 3-D input (a sequence): the linear itself
    assert torch.equal(packed(x[None]), lin(x[None]))


@pytest.mark.parametrize("threads", [1, 2])
def test_packed_rows_follow_the_thread_count(threads):
    before = torch.get_num_threads()
    lin = _linear()
    packed = PackedLinear(lin)
    try:
        torch.set_num_threads(threads)
        assert (1 in prepack_mod.packed_rows()) is (threads > 1)  # one row: packed only on several threads
        assert 8 in prepack_mod.packed_rows() and 300 not in prepack_mod.packed_rows()
        x = torch.randn(1, 24)
        torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)
        if threads == 1:
            assert torch.equal(packed(x), lin(x))  # the linear itself
    finally:
        torch.set_num_threads(before)


def test_packed_linear_follows_an_in_place_weight_change():
    lin = _linear()
    packed = PackedLinear(lin)
    x = torch.randn(8, 24)
    with torch.no_grad():
        lin.weight[3] = 10.0
    torch.testing.assert_close(packed(x), lin(x), rtol=1e-5, atol=1e-5)


def test_packed_linear_survives_deepcopy_and_pickle():
    packed = PackedLinear(_linear())
    x = torch.randn(8, 24)
    for other in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed))):
        torch.testing.assert_close(other(x), packed(x), rtol=1e-6, atol=1e-6)


def test_prepack_linears_takes_only_large_float_linears_and_unpack_undoes_it():
    big, small = _linear(64, 64), _linear(4, 4)  # 16 KiB and 64 bytes of weight
    block = nn.Sequential(big, nn.ReLU(), nn.Sequential(small, _linear(64, 64, seed=1).to(torch.float64)))
    assert prepack_linears(block, min_bytes=1024) == 1  # not the small one, not the float64 one
    assert isinstance(block[0], PackedLinear) and block[0].linear is big
    assert block[2][0] is small and type(block[2][1]) is nn.Linear
    assert prepack_linears(block, min_bytes=1024) == 0  # already packed: not wrapped twice
    assert unpack_linears(block) == 1
    assert block[0] is big
    assert not any(isinstance(m, PackedLinear) for m in block.modules())


@pytest.fixture
def packed_adapter(tiny_model_dir, switch) -> Seq2SeqAdapter:
    """The tiny model with every decoder-layer linear packed (its matrices are far below the floor)."""
    switch(PREPACK_MIN_BYTES=0)
    adapter = Seq2SeqAdapter.load(tiny_model_dir)
    assert adapter.engine == "static"
    return adapter


def test_static_decoder_packs_its_layers_and_keeps_h(packed_adapter, tiny_model_dir):
    # the default floor: nothing of the tiny model is packed
    with switches.override(PREPACK_MIN_BYTES=4 << 20):
        plain = Seq2SeqAdapter.load(tiny_model_dir)
    assert not any(isinstance(m, PackedLinear) for m in plain.static_decoder.modules())
    layers = packed_adapter.static_decoder.layers
    kinds = {name for layer in layers for name, m in layer.named_children() if isinstance(m, PackedLinear)}
    assert kinds == {"qkv", "q_cross", "out_self", "out_cross", "fc1", "fc2"}
    assert not isinstance(packed_adapter.static_decoder.cross_kv, PackedLinear)  # once per batch: plain
    batch = plain.encode_texts(synthetic_sentences("en", 6, seed=5), "en")
    tokens = torch.randint(4, plain.n_vocab, (6, 7), generator=torch.Generator().manual_seed(1))
    tokens = torch.cat([torch.tensor(plain.start_tokens("it")).expand(6, -1), tokens], dim=1)
    want = decoder_steps(plain, batch, tokens)
    got = decoder_steps(packed_adapter, batch, tokens)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    proj = create_projection("full", plain.output_weight, plain.output_bias)
    assert greedy_search(packed_adapter, proj, batch, "en", "it", max_len=12) == generate_ids(
        plain, batch, "it", 12
    )


def test_int8_quantisation_replaces_packed_layers(packed_adapter):
    packed_adapter.quantize_int8()
    dec = packed_adapter.static_decoder
    assert not any(isinstance(m, (PackedLinear, nn.Linear)) for m in dec.layers.modules())
    int8 = [m for m in dec.layers.modules() if isinstance(m, Int8Linear)]  # torch's dynamic int8 Linear
    assert len(int8) == 6 * len(dec.layers)
    batch = packed_adapter.encode_texts(synthetic_sentences("en", 3, seed=2), "en")
    proj = create_projection("full", packed_adapter.output_weight, packed_adapter.output_bias)
    out = greedy_search(packed_adapter, proj, batch, "en", "it", max_len=6)
    assert len(out) == 3 and all(len(row) > 0 for row in out)
