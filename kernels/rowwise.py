"""Row-wise argmax and top-k over wide score rows (the search's per-step choice), faster on CPU than torch's.

``argmax_rows`` is numpy's argmax on CPU: a SIMD pass that torch's CPU ``argmax`` over the last dimension
is not (benchmarks/results/rowwise-argmax-cpu-2026-11-28.json). ``topk_rows`` reads the row once by
``amax`` over blocks of columns, then searches only the blocks that can hold the answer. Measured on the
demo model's 32,108 columns, 1 thread (AMD EPYC; benchmarks/results/rowwise-reorder-cpu-2026-11-23.json):
``topk(8)`` 1.45 / 7.15 ms against 0.41 / 3.96 ms at 32 / 128 rows. On an accelerator, and where the rows
are too short for blocks to pay, they are torch's own.
"""

from __future__ import annotations

import torch

_NUMPY_FLOATS = (torch.float32, torch.float64)


def argmax_rows(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmax(dim=-1, keepdim=True)`` (rows, 1), the first maximum on ties, faster on CPU.

    torch's CPU ``argmax`` over the last dimension does not vectorise: at 32 x 32,108 float32 it took ~10x
    as long as numpy's, at 4 x 2,000 (a beam's centroid scores) ~5x (1 thread, Xeon; the record in the
    module docstring), and a search calls it every step. numpy's keeps torch's answer: the first maximum,
    and a row's first NaN where it has one. Elsewhere (an accelerator, other dtypes, a tensor that records
    gradients) it is torch's ``argmax``.
    """
    if numpy_can(scores):
        return torch.from_numpy(scores.numpy().argmax(axis=-1, keepdims=True))
    return scores.argmax(dim=-1, keepdim=True)


def argmin_rows(scores: torch.Tensor) -> torch.Tensor:
    """``scores.argmin(dim=-1)`` (rows,), the first minimum on ties: :func:`argmax_rows`' counterpart (the
    nearest centroid of each row, from its distances)."""
    if numpy_can(scores):
        return torch.from_numpy(scores.numpy().argmin(axis=-1))
    return scores.argmin(dim=-1)


def numpy_can(t: torch.Tensor) -> bool:
    """Whether ``t`` can be worked on in numpy, on its own memory: float32 or float64 on CPU, recording no
    gradients. The CPU step's small work runs there: a torch op on a few rows costs ~5x its arithmetic."""
    return t.device.type == "cpu" and t.dtype in _NUMPY_FLOATS and not t.requires_grad


# topk_rows: block width (the k best blocks are searched again, k x this per row).
_TOPK_BLOCK = 128


def topk_rows(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk(scores, k, dim=-1)`` (values, columns), each (rows, k), best first, faster on CPU.

    The row's k best values lie in the k blocks of ``_TOPK_BLOCK`` columns with the largest maxima (a block
    outside them has k blocks' maxima above its own) or in the tail after the last whole block, so ``topk``
    runs over those ``k * _TOPK_BLOCK`` (+ tail) columns only. The values equal ``torch.topk``'s; among
    equal values the columns may come in another order (``torch.topk`` promises none either). Rows with NaN
    take ``torch.topk`` itself.
    """
    rows, n = scores.shape
    b = _TOPK_BLOCK
    if scores.device.type != "cpu" or n < 8 * k * b or not scores.is_floating_point():
        return torch.topk(scores, k, dim=-1)
    scores = scores.contiguous()
    full = n // b * b
    block_max = scores[:, :full].view(rows, -1, b).amax(dim=-1)  # (rows, blocks)
    if bool(block_max.isnan().any()) or (full < n and bool(scores[:, full:].isnan().any())):
        return torch.topk(scores, k, dim=-1)
    blocks = torch.topk(block_max, k, dim=-1, sorted=False).indices  # (rows, k)
    cols = (blocks[:, :, None] * b + torch.arange(b, device=scores.device)).view(rows, -1)  # (rows, k*b)
    if full < n:
        cols = torch.cat([cols, torch.arange(full, n, device=scores.device).expand(rows, -1)], dim=1)
    values, where = torch.topk(scores.gather(1, cols), k, dim=-1)
    return values, cols.gather(1, where)
