"""Float32 GEMMs on pre-packed oneDNN weights (CPU): the full projection's and the decoder linears' fast path.

``torch.nn.functional.linear`` on CPU hands ``x @ W^T`` to MKL's sgemm on ``W`` as stored, which re-lays ``W``
out on every call: for decoding's few rows that costs more than the multiply. A copy of ``W`` packed once for
oneDNN (``torch.ops.mkldnn._reorder_linear_weight``, what inductor's frozen linears use) and multiplied by
``torch.ops.mkldnn._linear_pointwise`` does not. On M2M100-418M's decoder matrices (AMD EPYC, AVX2;
benchmarks/history/engine-notes.md, "Pre-packed decoder linears") it is 1.2-4x faster at 4-16 rows; from some
tens of rows on, depending on the thread count, MKL's own GEMM catches up. Outside :func:`packed_rows` and for
matrices under ``switches.PREPACK_MIN_BYTES`` (which sit in cache, where oneDNN's per-call overhead wins) the
plain GEMM stays.

The results differ from ``F.linear``'s in the last bits (another summation order, ~1e-6 relative), as between
any two BLAS libraries. The cost is memory: one more copy of every packed ``W``.
"""

from __future__ import annotations

import torch
from torch import nn

from fastvocab import switches

# The full projection: from this many rows on the pre-packed GEMM, below it a GEMV on W^T (kernels/full.py;
# measured: benchmarks/history/engine-notes.md).
SMALL_ROWS = 4
# The rows for which the decoder's packed linears beat MKL's GEMM, by thread count (measured at 1 and 2
# threads: benchmarks/history/engine-notes.md, "Pre-packed decoder linears"). On one thread the packed GEMM
# loses at 1 row (0.7x), wins from 4 to 32, is even at 48 and loses 5-15% from 64; on two it wins from 1 row
# up to 128 and is even at 256. More threads get the two-thread range (not measured).
PACKED_ROWS_ONE_THREAD = range(SMALL_ROWS, 48)
PACKED_ROWS = range(1, 256)


def packed_rows() -> range:
    """The row counts :class:`PackedLinear` multiplies on its packed copy, at torch's thread count."""
    return PACKED_ROWS_ONE_THREAD if torch.get_num_threads() == 1 else PACKED_ROWS


def prepack_unavailable(weight: torch.Tensor) -> str | None:
    """None when ``weight`` can be pre-packed for oneDNN here; otherwise why not (for a log line)."""
    if weight.device.type != "cpu":
        return f"W is on {weight.device} (pre-packing is a CPU path)"
    if weight.dtype != torch.float32:
        return f"W is {weight.dtype} (pre-packing is a float32 path)"
    if not torch.backends.mkldnn.is_available():
        return "this torch build has no oneDNN (mkldnn)"
    try:
        probe = torch.ops.mkldnn._reorder_linear_weight(torch.zeros(2, 2))
        torch.ops.mkldnn._linear_pointwise(torch.zeros(1, 2), probe, None, "none", [], "")
    except (AttributeError, RuntimeError) as exc:  # op missing or not built for this CPU
        return f"torch.ops.mkldnn linear ops unavailable ({type(exc).__name__}: {exc})"
    return None


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``W`` (out, in) float32 in oneDNN's opaque layout, for :func:`packed_linear`."""
    with torch.no_grad():
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach())


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ W^T + b`` for ``x`` (rows, in) on ``W`` packed by :func:`pack_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


class PackedLinear(nn.Module):
    """An ``nn.Linear`` (kept as ``linear``, weights shared) that multiplies 2-D float32 inputs with a row
    count in :func:`packed_rows` on a pre-packed copy of its weight; other inputs go to ``linear`` itself.

    An in-place change of the weight (its version counter moves) is seen at the next call, which packs again.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.linear = linear
        self._packed = pack_weight(linear.weight)
        self._version = linear.weight._version

    # The oneDNN tensor is opaque (no storage): pickling and deepcopy drop it and pack again.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_packed"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._packed = pack_weight(self.linear.weight)
        self._version = self.linear.weight._version

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.dim() != 2
            or x.dtype != torch.float32
            or x.device.type != "cpu"
            or x.shape[0] not in packed_rows()
        ):
            return self.linear(x)
        if self.linear.weight._version != self._version:
            self._packed = pack_weight(self.linear.weight)
            self._version = self.linear.weight._version
        bias = self.linear.bias
        return packed_linear(x, self._packed, None if bias is None else bias.detach())


def prepack_linears(module: nn.Module, min_bytes: int | None = None) -> int:
    """Replace, in place, every ``nn.Linear`` inside ``module`` whose float32 CPU weight has at least
    ``min_bytes`` (default ``switches.PREPACK_MIN_BYTES``) by a :class:`PackedLinear` around it; returns how
    many. Nothing is replaced where oneDNN's ops are unavailable."""
    floor = switches.PREPACK_MIN_BYTES.get() if min_bytes is None else min_bytes
    found = [
        (parent, name, child)
        for parent in module.modules()
        if not isinstance(parent, PackedLinear)  # its linear is packed already
        for name, child in parent.named_children()
        if type(child) is nn.Linear  # not a subclass (e.g. a quantised layer)
        and child.weight.numel() * child.weight.element_size() >= floor
        and prepack_unavailable(child.weight) is None
    ]
    for parent, name, child in found:
        setattr(parent, name, PackedLinear(child))
    return len(found)


def unpack_linears(module: nn.Module) -> int:
    """Undo :func:`prepack_linears` in place (each :class:`PackedLinear` back to its ``nn.Linear``, the
    packed copy freed); returns how many. Before int8 quantisation, which replaces ``nn.Linear`` layers."""
    found = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if isinstance(child, PackedLinear)
    ]
    for parent, name, child in found:
        setattr(parent, name, child.linear)
    return len(found)
