"""Dynamic int8 linear layers on CPU: the projections' ``int8`` option and the decoder's int8 mode.

``torch.ao.quantization.quantize_dynamic`` stores each ``nn.Linear`` weight as int8 (one scale per output
channel, finer than one per tensor) and quantises the activations per call (fbgemm GEMMs), as CTranslate2's
``compute_type="int8"`` does on CPU. ``torch.ao.quantization`` is deprecated in favour of torchao but still
shipped with the pinned torch; its deprecation warnings are silenced here, nothing else in the environment
offers dynamic int8 GEMMs. It sits apart from the projections so that the model adapter (``decoding``) can
quantise the decoder's and the encoder's linears with it without importing a projection.

A dynamic int8 linear quantises its input per call, per tensor, to unsigned 7-bit integers (``reduce_range``:
fbgemm's AVX2 kernels add pairs of u8 x s8 products in int16, which 8 bits could saturate), multiplies in
int32 and scales back to float32. :func:`quantize_input` reproduces that quantisation, so a kernel that
multiplies some of the layer's rows in float32 arithmetic (the clustered projection's gathers) computes the
same integers and the same logits, to float rounding.
"""

from __future__ import annotations

import copy
import warnings
from typing import TypeVar, cast

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.ao")
    warnings.filterwarnings("ignore", message=r".*deprecated.*", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
    return ctx


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
    """``W`` (N, d) and ``b`` as a dynamic int8 ``nn.Linear`` (CPU only): int8 per output row, symmetric."""
    if weight.device.type != "cpu":
        raise ValueError(f"int8 projection runs on CPU only, W is on {weight.device}")
    n_vocab, d = weight.shape
    # no random init of N x d weights that are overwritten at once, and no second copy while quantising
    lin = nn.utils.skip_init(nn.Linear, d, n_vocab, bias=bias is not None)
    with torch.no_grad():
        lin.weight.copy_(weight.float())
        if bias is not None:
            lin.bias.copy_(bias.float())
    return quantize_linears(nn.Sequential(lin), inplace=True)[0]


def int8_rows(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """The int8 weight of a layer from :func:`int8_linear`, unpacked: (N, d) int8 and the (N,) float32 row
    scales the layer multiplies by (its zero points are 0: the weights are symmetric)."""
    qw = layer.weight()  # type: ignore[operator]  # a dynamic int8 Linear unpacks its weight in a method
    if qw.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric):
        raise ValueError(f"expected int8 weights per output row, got {qw.qscheme()}")
    if bool(qw.q_per_channel_zero_points().any()):
        raise ValueError("expected symmetric int8 weights (zero points 0)")
    return qw.int_repr().contiguous(), qw.q_per_channel_scales().float()


def packed_rows(q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.ScriptObject:
    """Rows ``q`` (n, d) int8 with their scales (n,) packed for ``quantized.linear_dynamic`` (fbgemm), as a
    layer from :func:`int8_linear` holds its own: :func:`linear_packed` on them gives that layer's logits."""
    ctx = _quiet()
    try:
        zero = torch.zeros(q.shape[0], dtype=torch.int64)
        qw = torch._make_per_channel_quantized_tensor(q, scale.double(), zero, 0)
        return torch.ops.quantized.linear_prepack(qw, bias)
    finally:
        ctx.__exit__(None, None, None)


def linear_packed(x: torch.Tensor, packed: torch.ScriptObject) -> torch.Tensor:
    """``x`` (rows, d) float32 through rows packed by :func:`packed_rows` (or :func:`packed_of` a layer),
    (rows, n) float32."""
    # The overload itself: the op packet's call looks for fake script objects in the arguments first,
    # ~2 us of a one-row step's 14 us GEMM.
    return torch.ops.quantized.linear_dynamic.default(x, packed, True)  # reduce_range, as the layers


def packed_of(layer: nn.Module) -> torch.ScriptObject:
    """The fbgemm-packed weight and bias of a layer from :func:`int8_linear`, for :func:`linear_packed`
    (the same logits as calling the layer, without the module call)."""
    params = cast(nn.Module, layer._packed_params)  # a dynamic int8 Linear's LinearPackedParams
    return cast(torch.ScriptObject, params._packed_params)


def quantize_input(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (rows, d) as a dynamic int8 linear quantises it (one scale for the tensor, unsigned 7 bits):
    the integers less their zero point, as float32 (exact), and the scale, a 0-d float32 tensor."""
    qx = torch.quantize_per_tensor_dynamic(x.float().contiguous(), torch.quint8, reduce_range=True)
    ints = qx.int_repr().float() - qx.q_zero_point()
    return ints, torch.tensor(qx.q_scale(), dtype=torch.float32)


def quantize_linears(module: M, inplace: bool = False) -> M:
    """A copy of ``module`` (``module`` itself with ``inplace``) whose ``nn.Linear`` layers are dynamic int8
    (per-channel weight scales)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    ctx = _quiet()
    try:
        target = module if inplace else copy.deepcopy(module)
        return quantize_dynamic(
            target, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
        )
    finally:
        ctx.__exit__(None, None, None)
