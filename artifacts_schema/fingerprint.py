"""Model fingerprint: identifies the output projection a cluster map or a dump was built for.

It is a hash over every weight of ``W`` and ``b``, so it costs a full read of the projection (about 1 GB at
N=250K, d=1024 in fp32). A pipeline run computes it once, on the driver, and hands it to every worker in a
:class:`ModelRef`; nothing downstream hashes the weights again.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import numpy as np

from fastvocab.artifacts_schema.digest import Digest

log = logging.getLogger(__name__)


def projection_fingerprint(weight: np.ndarray, bias: np.ndarray | None) -> str:
    """Hash of the output projection ``W`` [N, d] and ``b`` [N] (or no bias), with N and d.

    Values are hashed as float32 (fp16 and bf16 -> fp32 is exact); pass the checkpoint's own values: a
    float32 checkpoint rounded to fp16 hashes differently (``Seq2SeqAdapter.fingerprint`` reads ``W`` in
    float32 whatever dtype the model runs in).
    """
    if weight.ndim != 2:
        raise ValueError(f"weight must be [N, d], got shape {weight.shape}")
    n, d = weight.shape
    t0 = time.perf_counter()
    h = Digest().update(f"N={n};d={d};bias={bias is not None};")
    h.update(np.ascontiguousarray(weight, dtype="<f4").tobytes())
    if bias is not None:
        if bias.shape != (n,):
            raise ValueError(f"bias must be [{n}], got shape {bias.shape}")
        h.update(np.ascontiguousarray(bias, dtype="<f4").tobytes())
    log.debug("fingerprinted an output projection N=%d, d=%d in %.2f s", n, d, time.perf_counter() - t0)
    return f"{h.value}:N{n}:d{d}"


@dataclass(frozen=True)
class ModelRef:
    """A model folder and the identity of its output projection, computed once and passed around."""

    path: str
    fingerprint: str
    d: int
    n_vocab: int
