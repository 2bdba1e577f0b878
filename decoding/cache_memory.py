"""The static decoder's cache allocations, checked before they are made.

A cache that would not fit (an explicit limit, ``max_cache_bytes`` or ``FASTVOCAB_CACHE_LIMIT_MB``, else the
device's free memory for large allocations) is refused with a ``MemoryError`` naming its shape, bytes and
the flags to lower, before anything is allocated: a batch that cannot fit fails at once, with a message a
user can act on, instead of an out-of-memory error in the middle of a run.
"""

from __future__ import annotations

import torch

from fastvocab import switches

# Allocations at least this big are also checked against the device's free memory (a cheap read, but not one
# to make every step for the small reorders).
_CHECK_FREE_BYTES = 256 << 20


def cache_limit(max_cache_bytes: int | None) -> int | None:
    """``max_cache_bytes``, else the ``FASTVOCAB_CACHE_LIMIT_MB`` environment variable's limit
    (``switches.CACHE_LIMIT_MB``), else None."""
    limit_mb = switches.CACHE_LIMIT_MB.get() if max_cache_bytes is None else None
    if limit_mb is not None:
        return int(limit_mb * 2**20)
    return max_cache_bytes


def allocate_cache(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, limit: int | None, what: str
) -> torch.Tensor:
    """An uninitialised cache tensor, or a ``MemoryError`` naming ``what`` (self- or cross-attention
    cache), its shape and bytes when it exceeds ``limit`` or the device's free memory."""
    size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
    source = f"max_cache_bytes / {switches.CACHE_LIMIT_MB.env}"
    if size >= _CHECK_FREE_BYTES:
        free = _free_bytes(device)
        if free is not None and (limit is None or free < limit):
            limit, source = free, f"free memory on {device}"
    if limit is not None and size > limit:
        why = f"the limit is {_size(limit)} ({source})"
        raise MemoryError(_too_big(shape, dtype, device, what, size, why))
    try:
        return torch.empty(shape, dtype=dtype, device=device)
    except (RuntimeError, MemoryError) as exc:  # torch.OutOfMemoryError is a RuntimeError
        raise MemoryError(_too_big(shape, dtype, device, what, size, "the allocation failed")) from exc


def _too_big(
    shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, what: str, size: int, why: str
) -> str:
    if what == "self-attention cache":
        layout = "(2, layers, rows, heads, positions, head_dim)"
        hint = "rows = batch x beam, positions = forced prefix + --max-len - 1"
    else:
        layout = "(2, layers, sentences, heads, source tokens, head_dim)"
        hint = "sentences = batch, source tokens = the longest source line"
    return (
        f"static decoder cache does not fit: {what} {tuple(shape)} = {_size(size)} ({layout}, "
        f"{dtype} on {device}); {why}. {hint}: lower --batch-size, --beam or --max-len"
    )


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**17 else f"{n:,} bytes"


def _free_bytes(device: torch.device) -> int | None:
    """Memory that can still be allocated on ``device`` (CPU: MemAvailable), None when unknown."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo", encoding="ascii") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None
