"""The full projection ``z = h W^T + b`` over all N columns: the reference for every other method.

On CPU in float32 the GEMM does not run on ``W`` as stored (N, d): MKL's ``h @ W^T`` on that layout is
slower than necessary for decoding shapes (the measurements, and the end-to-end gain:
benchmarks/history/engine-notes.md, "The full projection's weight layouts"). So the projection keeps, besides
``self.weight`` (which other users read: the fingerprint, the clustered fallbacks), two copies in
GEMM-friendly layouts, built once at construction when ``W`` is at least ``switches.PREPACK_MIN_BYTES`` (4
MiB; below that ``W`` sits in cache and oneDNN's per-call overhead wins):

- ``W`` pre-packed for oneDNN (``kernels.prepack``, the decoder's linears use it too), from
  ``prepack.SMALL_ROWS`` rows on;
- a contiguous ``W^T`` (d, N) for fewer rows (greedy at batch 1, the tail of a batch), where one GEMV
  streaming W^T beats both.

The logits differ from ``F.linear``'s in the last bits (another summation order, ~1e-6 relative): a
near-tie can in principle flip, as between any two BLAS libraries. An in-place change of ``W`` (its version
counter moves) is seen at the next call, which packs again, as ``F.linear`` on ``W`` would have seen it.
The cost is memory: two more copies of ``W`` (2 x N x d x 4 bytes, 2 GB at N=250K, d=1024);
``prepack=False`` keeps the plain ``F.linear`` on ``W``.

Elsewhere (GPU, fp16/bf16, a torch without oneDNN) the projection is ``F.linear`` on ``W``; a debug log line
says why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from fastvocab import switches
from fastvocab.kernels import prepack
from fastvocab.kernels.base import CapturableStep, Projection, ProjectionOutput, register
from fastvocab.kernels.int8 import PackedRows, int8_linear, linear_packed, open_sessions, packed_of
from fastvocab.kernels.options import MethodOptions

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FullOptions(MethodOptions):
    """The full projection has no option a user chooses; a model decoding in int8 gives it ``int8``."""

    method: ClassVar[str] = "full"

    def projection_kwargs(self, beam: int = 1, int8: bool = False) -> dict[str, object]:
        return {"int8": True} if int8 else {}


@register("full", FullOptions)
class FullProjection(Projection):
    """All N columns. ``prepack`` (default True): on CPU fp32, keep ``W`` in GEMM-friendly layouts too
    (module docstring); ignored where that path is unavailable. ``int8`` (CPU only): ``W`` and ``b`` in a
    dynamic int8 linear layer instead (``kernels.int8``; float32 in and out, no pre-packing), recorded as
    ``dtype:int8`` in the signature."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        prepack: bool = True,
        int8: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight, bias, **kwargs)
        self.int8 = bool(int8)
        self.prepack = bool(prepack) and not self.int8  # int8 reads W once, into its own layer
        self._packed: torch.Tensor | None = None  # opaque oneDNN layout of W
        self._wt: torch.Tensor | None = None  # (d, N) contiguous
        self._packed_version = -1  # W's version counter when the copies were made
        self._q: PackedRows | None = None  # the int8 linear layer's packed rows
        if self.int8:
            self._q = packed_of(int8_linear(weight, bias), many_rows=True)
        self._pack()

    def _pack(self) -> None:
        if not self.prepack:
            return
        reason = prepack.prepack_unavailable(self.weight)
        nbytes = self.weight.numel() * self.weight.element_size()
        floor = switches.PREPACK_MIN_BYTES.get()
        if reason is None and nbytes < floor:
            reason = f"W is {nbytes / 2**20:.1f} MiB < {floor >> 20} MiB, where packing does not pay"
        if reason is not None:
            log.debug("full projection: F.linear on W (N=%d, d=%d): %s", self.n_vocab, self.d, reason)
            return
        with torch.no_grad():
            w = self.weight.detach()  # shares W's version counter
            self._packed = prepack.pack_weight(w)
            self._wt = w.t().contiguous()
        self._packed_version = self.weight._version
        if self.bias is not None:
            self.bias = self.bias.detach().contiguous()

    @property
    def packed(self) -> bool:
        """Whether the pre-packed CPU path is in use."""
        return self._packed is not None

    # The oneDNN tensor is opaque (no storage): pickling and deepcopy drop the copies and pack again.
    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_packed"] = state["_wt"] = None
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._pack()

    def open_sessions(self, rows: int) -> None:
        open_sessions([self._q], rows)

    def options(self) -> dict[str, object]:
        return {"dtype": "int8"} if self.int8 else {}

    def capturable(self, rows: int) -> CapturableStep:
        """The projection itself: its call reads nothing back to the host."""
        return CapturableStep(self)

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        if self._q is not None:
            logits = linear_packed(h.float().contiguous(), self._q)  # (rows, N) float32
            return ProjectionOutput(logits=logits, ids=None, n_vocab=self.n_vocab, scratch=True)
        if self._packed is not None and self.weight._version != self._packed_version:
            # W was changed in place (a tied embedding edited, a fitted row): the copies follow it.
            log.debug("full projection: W changed in place, packing it again")
            self._pack()
        if self._packed is None or self._wt is None:  # (packed together: both or neither)
            logits = torch.nn.functional.linear(h, self.weight, self.bias)  # (rows, N)
        elif h.shape[0] < prepack.SMALL_ROWS:
            h = h.contiguous()
            logits = h @ self._wt if self.bias is None else torch.addmm(self.bias, h, self._wt)  # (rows, N)
        else:
            logits = prepack.packed_linear(h, self._packed, self.bias)
        return ProjectionOutput(logits=logits, ids=None, n_vocab=self.n_vocab, scratch=True)
