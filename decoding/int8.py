"""Int8 decoding on CPU: dynamic quantisation of linear layers and of the full output projection.

``torch.ao.quantization.quantize_dynamic`` stores each ``nn.Linear`` weight as int8 (one scale per output
channel, finer than one per tensor) and quantises the activations per call (fbgemm GEMMs), as CTranslate2's
``compute_type="int8"`` does on CPU. ``torch.ao.quantization`` is deprecated in favour of torchao but still
shipped with the pinned torch; its deprecation warnings are silenced here, nothing else in the environment
offers dynamic int8 GEMMs.

The clustered projection is left in float32: it computes ~0.1% of the columns, so int8 would save nothing
measurable there and only cost accuracy.
"""

from __future__ import annotations

import copy
import warnings
from typing import TypeVar

import torch
from torch import nn

from fastvocab.kernels.base import Projection, ProjectionOutput
from fastvocab.kernels.full import FullProjection

M = TypeVar("M", bound=nn.Module)


def _quiet():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.ao")
    warnings.filterwarnings("ignore", message=r".*deprecated.*", category=UserWarning)
    warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
    return ctx


def quantize_linears(module: M) -> M:
    """A copy of ``module`` whose ``nn.Linear`` layers are dynamic int8 (per-channel weight scales)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    ctx = _quiet()
    try:
        return quantize_dynamic(
            copy.deepcopy(module), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
        )
    finally:
        ctx.__exit__(None, None, None)


class Int8FullProjection(FullProjection):
    """The full projection with ``W`` (and ``b``) in a dynamic int8 linear layer; CPU, float32 in and out."""

    name = "full"

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, **kwargs: object) -> None:
        super().__init__(weight, bias, prepack=False, **kwargs)  # W is read once, into the int8 layer
        if weight.device.type != "cpu":
            raise ValueError(f"int8 projection runs on CPU only, W is on {weight.device}")
        lin = nn.Linear(self.d, self.n_vocab, bias=bias is not None)
        with torch.no_grad():
            lin.weight.copy_(weight.float())
            if bias is not None:
                lin.bias.copy_(bias.float())
        self._q = quantize_linears(nn.Sequential(lin))[0]

    def options(self) -> dict[str, object]:
        return {**super().options(), "dtype": "int8"}

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        logits = self._q(h.float().contiguous())  # (rows, N) float32
        return ProjectionOutput(logits=logits, ids=None, n_vocab=self.n_vocab)


def quantize_projection(projection: Projection) -> Projection:
    """The int8 version of ``projection``: the full projection gets int8 ``W``; other methods are returned
    unchanged (see the module docstring)."""
    if isinstance(projection, FullProjection) and not isinstance(projection, Int8FullProjection):
        q = Int8FullProjection(
            projection.weight, projection.bias, always_active=tuple(projection.always_active.tolist())
        )
        q._fingerprint = projection._fingerprint  # same W and b: no need to hash them again
        return q
    return projection
