"""How the searches advance the decoder: eagerly, or with fixed shapes so that a CUDA graph can hold a step.

Greedy and beam search (``fastvocab.decoding.search``) are written once against :class:`Stepper`: ``start``
encodes a batch and feeds the forced prefix, ``step`` feeds one token per row and returns the next ``h``,
``reorder`` selects rows, and ``fixed`` says whether the shapes stay fixed for the whole batch:

- :class:`EagerStepper` (``fixed = False``): the adapter's ``decoder_step`` and ``reorder`` (either engine).
  Finished rows and sentences leave the batch, so a step costs less as sentences end.
- :class:`CapturedStepper` (``fixed = True``): the static engine's fixed-shape step
  (``StaticDecoder.step_fixed``: the position on the device, attention over the whole capacity), so that
  one step of the search (its token choice, the reorder, the decoder step) can be captured once per batch
  in a CUDA graph and replayed (:meth:`CapturedStepper.compile`). Eager decoding on a GPU launches a few
  hundred small kernels per step from Python, and at small batch that, not the arithmetic, is the step's
  cost. Nothing leaves the batch (a new row count would need a new graph): a finished row keeps emitting
  EOS, a done sentence keeps its finished hypotheses frozen, and the host reads the stop decision only every
  ``switches.SYNC_EVERY`` steps. Beam search's reorder gathers the whole self-attention capacity from one
  buffer into the other, so its step is captured twice (A -> B and B -> A) and the graphs replayed in turn.
  Without CUDA, or with ``capture=False``, the same step runs eagerly: that is how the CPU tests check its
  outputs.

``--graphs`` (:data:`GRAPHS`, :func:`use_graphs`) chooses between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from fastvocab.kernels.base import CapturableStep

# ``fastvocab translate --graphs`` and the translate stage's ``graphs``: "on" = the captured stepper, "off" =
# the eager one, "auto" = the captured one on CUDA where the step can be captured, else the eager one.
GRAPHS = ("auto", "on", "off")


def use_graphs(choice: str, adapter, projection) -> bool:
    """Whether ``choice`` (one of :data:`GRAPHS`) decodes with the captured stepper.

    ``on`` runs it anywhere (on CPU its fixed-shape step runs eagerly, with the same outputs); ``off`` never.
    ``auto`` runs it on CUDA when :func:`can_capture` says the step can be captured, and eagerly otherwise:
    on CPU a step is arithmetic, not launches, while on a GPU the eager step is launch-bound (the captured
    one decoded the demo model 2.8-3.6x and an M2M100-418M-shaped one 1.6-2.4x faster in fp16;
    benchmarks/gpu.md)."""
    if choice not in GRAPHS:
        raise ValueError(f"graphs must be one of {', '.join(GRAPHS)}; got {choice!r}")
    if choice != "auto":
        return choice == "on"
    return adapter.device.type == "cuda" and can_capture(adapter, projection)


def can_capture(adapter, projection) -> bool:
    """Whether the whole step can be captured: the static engine, and a projection that offers a capturable
    step (full, union-mode clustered without a certificate; not per-row selection or int8 clustered)."""
    if getattr(adapter, "static_decoder", None) is None:
        return False
    try:
        return capturable_step(projection, 1) is not None
    except ValueError:  # what a static union cannot hold (exact_k, mass_radius, int8)
        return False


def capturable_step(projection, rows: int) -> CapturableStep | None:
    """``projection``'s step for ``rows`` rows as a CUDA graph can capture it (``Projection.capturable``), or
    None when it offers none (a method without the hook, per-row selection). A ValueError passes through for
    what the projection cannot capture as configured."""
    capturable = getattr(projection, "capturable", None)
    return None if capturable is None else capturable(rows)


class Stepper(Protocol):
    """The decoder as the searches drive it (module docstring)."""

    fixed: bool  # shapes fixed for the batch: no row leaves, host reads every switches.SYNC_EVERY steps only

    def start(
        self, batch: dict, tgt_lang: str, max_len: int, group: int | None = None
    ) -> tuple[torch.Tensor, int]:
        """Encode ``batch``, feed the forced prefix; with ``group`` (beam search), ``group`` rows per
        sentence. Returns ``h`` (rows, d) of the last prefix token and the prefix's length."""
        ...

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row (rows,); returns the next ``h`` (rows, d)."""
        ...

    def reorder(self, rows: torch.Tensor, group: int | None = None) -> None:
        """Continue from rows ``rows`` (rows',) of the previous step; ``group`` as ``adapter.reorder``."""
        ...

    def compile(self, body: Callable[[], None], tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
        """``body`` (one whole step of a fixed-shape search) as it runs each step; ``tensors``: what the
        search's part of ``body`` changes in place."""
        ...


def feed_prefix(adapter, batch: dict, tgt_lang: str, max_len: int):
    """Encode the batch and feed the forced prefix; returns (h (rows, d), state, len(prefix))."""
    prefix = adapter.start_tokens(tgt_lang)
    state = adapter.encode(batch)
    # The decoder is fed the prefix and at most max_len - 1 generated tokens: a cache that big never grows.
    state.positions = len(prefix) + max_len - 1
    rows = batch["input_ids"].shape[0]
    h = None
    for tok in prefix:
        tokens = torch.full((rows,), tok, dtype=torch.long, device=adapter.device)
        h, state = adapter.decoder_step(tokens, state)
    return h, state, len(prefix)


def _expand(adapter, h: torch.Tensor, state, group: int | None):
    """Beam search's ``group`` rows per sentence, made only after the prefix (the same for every beam)."""
    if group is None:
        return h, state
    index = torch.arange(h.shape[0], device=adapter.device).repeat_interleave(group)
    return h.repeat_interleave(group, dim=0), adapter.reorder(state, index, group=group)


class EagerStepper:
    """The adapter's own step (``decoder_step``, ``reorder``), any engine; rows may leave the batch."""

    fixed = False

    def __init__(self, adapter) -> None:
        self.adapter = adapter
        self.state = None

    def start(
        self, batch: dict, tgt_lang: str, max_len: int, group: int | None = None
    ) -> tuple[torch.Tensor, int]:
        h, state, prefix_len = feed_prefix(self.adapter, batch, tgt_lang, max_len)
        h, self.state = _expand(self.adapter, h, state, group)
        return h, prefix_len

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        h, self.state = self.adapter.decoder_step(tokens, self.state)
        return h

    def reorder(self, rows: torch.Tensor, group: int | None = None) -> None:
        self.state = self.adapter.reorder(self.state, rows, group=group)

    def compile(self, body: Callable[[], None], tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
        return body


class CapturedStepper:
    """The static engine's fixed-shape step, captured in CUDA graphs (``capture``: None = when the model is
    on CUDA; otherwise it runs eagerly). ``h`` is one buffer for the whole batch, rewritten by every step."""

    fixed = True

    def __init__(self, adapter, capture: bool | None = None) -> None:
        if adapter.static_decoder is None:
            raise ValueError("the captured step needs the static engine (engine='static')")
        self.adapter = adapter
        self.dec = adapter.static_decoder
        self.capture = adapter.device.type == "cuda" if capture is None else capture

    def start(
        self, batch: dict, tgt_lang: str, max_len: int, group: int | None = None
    ) -> tuple[torch.Tensor, int]:
        h, state, prefix_len = feed_prefix(self.adapter, batch, tgt_lang, max_len)
        h, state = _expand(self.adapter, h, state, group)
        cache = state.cache
        last = max_len - 1  # the step whose tokens are never fed back
        if last > 0:
            self.dec.prepare_fixed(cache, cache.length + last - 1)
        self.cache = cache
        # Beam search reorders every step: from one buffer into the other, the next step the other way.
        kv = cache.self_kv.contiguous() if group is not None else cache.self_kv
        self.buffers = (kv, torch.empty_like(kv)) if group is not None else (kv,)
        self._use(0)
        self.h = h.clone()  # (rows, d) the state the next choice reads
        self.pos = torch.full((1,), cache.length, dtype=torch.long, device=self.adapter.device)
        return self.h, prefix_len

    def _use(self, buffer: int) -> None:
        self.parity = buffer
        self.cache.self_kv = self.buffers[buffer]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        self.h.copy_(self.dec.step_fixed(tokens, self.cache, self.pos))
        self.pos.add_(1)
        return self.h

    def reorder(self, rows: torch.Tensor, group: int | None = None) -> None:
        """Every row of the whole capacity gathered into the other buffer (``group`` needs no handling: the
        sentences never change)."""
        other = 1 - self.parity
        torch.index_select(self.buffers[self.parity], 2, rows, out=self.buffers[other])
        self._use(other)

    def compile(self, body: Callable[[], None], tensors: Sequence[torch.Tensor]) -> Callable[[], None]:
        """``body`` captured in a CUDA graph per buffer it can start from (one, or two with beam search's
        pair), replayed in turn; eagerly without capture. The capture's warm-up runs real steps: ``h``, the
        position, the cache and ``tensors`` are put back afterwards."""
        if not self.capture:
            return body
        held = (self.h, self.pos, self.buffers[0], *tensors)
        saved = [t.clone() for t in held]

        def from_buffer(b: int) -> Callable[[], None]:
            def run() -> None:
                self._use(b)
                body()

            return run

        graphs = [capture_graph(from_buffer(b)) for b in range(len(self.buffers))]
        for t, s in zip(held, saved, strict=True):
            t.copy_(s)
        self._use(0)

        def replay() -> None:
            b = self.parity
            graphs[b]()
            self._use((b + 1) % len(self.buffers))  # what the body's reorder did in Python at capture

        return replay


def capture_graph(fn: Callable[[], object], warmups: int = 1) -> Callable[[], None]:
    """``fn`` run ``warmups`` times on a side stream (lazy inits, cuBLAS handles: as ``torch.cuda.graph``
    asks), then captured in a CUDA graph; returns the graph's ``replay``. The warm-up runs are real: the
    caller restores what they changed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay
