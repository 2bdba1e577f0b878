"""Dynamic int8 linear layers on CPU: the full projection's ``int8`` option and the decoder's int8 mode.

``torch.ao.quantization.quantize_dynamic`` stores each ``nn.Linear`` weight as int8 (one scale per output
channel, finer than one per tensor) and quantises the activations per call (fbgemm GEMMs), as CTranslate2's
``compute_type="int8"`` does on CPU. ``torch.ao.quantization`` is deprecated in favour of torchao but still
shipped with the pinned torch; its deprecation warnings are silenced here, nothing else in the environment
offers dynamic int8 GEMMs. It sits apart from the projections so that the model adapter (``decoding``) can
quantise the decoder's and the encoder's linears with it without importing a projection.
"""

from __future__ import annotations

import copy
import warnings
from typing import TypeVar

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
