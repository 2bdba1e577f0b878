"""Model fingerprint: identifies the output projection a cluster map was built for."""

from __future__ import annotations

import hashlib

import numpy as np


def projection_fingerprint(weight: np.ndarray, bias: np.ndarray | None) -> str:
    """Hash of the output projection ``W`` [N, d] and ``b`` [N] (or no bias), with N and d.

    Values are hashed as float32 so the same checkpoint loaded in fp16 or fp32 gives the same fingerprint
    when it was stored in fp16 (fp16 -> fp32 is exact).
    """
    if weight.ndim != 2:
        raise ValueError(f"weight must be [N, d], got shape {weight.shape}")
    n, d = weight.shape
    h = hashlib.sha256()
    h.update(f"N={n};d={d};bias={bias is not None};".encode())
    h.update(np.ascontiguousarray(weight, dtype="<f4").tobytes())
    if bias is not None:
        if bias.shape != (n,):
            raise ValueError(f"bias must be [{n}], got shape {bias.shape}")
        h.update(np.ascontiguousarray(bias, dtype="<f4").tobytes())
    return f"sha256:{h.hexdigest()[:32]}:N{n}:d{d}"
