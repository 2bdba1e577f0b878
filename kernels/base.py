"""The output-layer interface every method implements, and the registry that names them.

A projection maps decoder hidden states ``h`` (rows, d) to logits over *some* vocabulary columns:

- the full projection computes all N columns (``ids is None``),
- candidate-set methods compute C << N columns and say which (``ids`` shared (C,) or per row (rows, C)).

Projections hold no per-call state: two consecutive calls with different candidate sets must give the same
results as two fresh objects (the CTranslate2 ``use_vmap`` bug, docs/DESIGN-NOTES.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, TypeVar

import torch

from fastvocab import __version__
from fastvocab.artifacts_schema.fingerprint import projection_fingerprint
from fastvocab.kernels.options import MethodOptions

_REGISTRY: dict[str, type[Projection]] = {}  # the methods by name (kernels/registry.py reads it)
_TIMING_LOCK = threading.Lock()  # translate() may call one projection from several worker threads

P = TypeVar("P", bound="type[Projection]")


def register(name: str, options: type[MethodOptions]) -> Callable[[P], P]:
    """Class decorator: make a projection available under ``name`` (``--method name``), with the dataclass of
    the options a user chooses of it (``kernels/options.py``), from which its flags are made."""

    def deco(cls: P) -> P:
        if name in _REGISTRY:
            raise ValueError(f"projection {name!r} is already registered by {_REGISTRY[name].__name__}")
        if options.method != name:
            raise ValueError(f"projection {name!r} registered with the options of {options.method!r}")
        cls.name = name
        cls.options_type = options
        _REGISTRY[name] = cls
        return cls

    return deco


@dataclass
class ProjectionOutput:
    """Logits over a subset of the vocabulary.

    logits: (rows, C). Columns that a row does not own (per-row padding) hold ``-inf``.
    ids: None when C == n_vocab and column j is token j; (C,) vocabulary ids shared by every row;
        or (rows, C) per-row ids (padding positions repeat a valid id and carry ``-inf``).
    log_inactive_mass: optional (rows,) estimate of ``logsumexp`` over the columns *not* computed, added to
        the softmax normalizer so scores stay comparable across hypotheses (beam search).
    scratch: the logits are this output's alone (computed for it; no projection keeps or reuses them), so
        :meth:`search_scores` may write in them.
    """

    logits: torch.Tensor
    ids: torch.Tensor | None
    n_vocab: int
    log_inactive_mass: torch.Tensor | None = None
    scratch: bool = False
    _log_probs: torch.Tensor | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def rows(self) -> int:
        return self.logits.shape[0]

    def log_probs(self) -> torch.Tensor:
        """Log-softmax over the computed columns, (rows, C), in float32.

        Computed on the first call and kept: the dump's step hook and beam search both read it, and each
        computation is a pass over every computed column. An output is not changed once its projection has
        returned it, and callers treat the result as read-only.
        """
        if self._log_probs is None:
            logits = self.logits.float()
            if self.log_inactive_mass is None:
                self._log_probs = torch.log_softmax(logits, dim=-1)
            else:
                self._log_probs = logits - self._log_norm(logits)[:, None]
        return self._log_probs

    def search_scores(self, banned: torch.Tensor | None, log_probs: bool, spend: bool) -> torch.Tensor:
        """What a search ranks, (rows, C): the logits (greedy: their argmax is the log-probs') or the
        log-probs (beam search), the ``banned`` vocabulary ids at -inf (after the log-softmax, as generate's
        processors).

        ``spend``: the caller reads this output last. Then, where the logits are ``scratch`` and nothing
        has read the log-probs, both are written in the logits' own memory (on CPU): at a full vocabulary each
        out of place result is a (rows, N) pass and a fresh allocation (16 MB at 128 rows of 32K columns),
        beside a GEMM that takes a few times as long. The values are the same; the output's logits are spent.
        """
        logits = self.logits
        # On CPU only: the accelerators' searches keep their fixed-shape steps as measured.
        in_place = spend and self.scratch and self._log_probs is None and logits.device.type == "cpu"
        in_place = in_place and logits.dtype == torch.float32 and logits.is_contiguous()
        if not log_probs:
            scores = logits
        elif not in_place:
            scores = self.log_probs()
        elif self.log_inactive_mass is None:
            scores = torch._log_softmax(logits, 1, False, out=logits)  # torch.log_softmax's own kernel
        else:
            scores = logits.sub_(self._log_norm(logits)[:, None])
        if banned is None:
            return scores
        if self.ids is None:
            fill = scores.index_fill_ if in_place else scores.index_fill
            return fill(1, banned, -math.inf)
        mask = torch.isin(self.ids, banned)  # (C,) or (rows, C)
        return scores.masked_fill_(mask, -math.inf) if in_place else scores.masked_fill(mask, -math.inf)

    def _log_norm(self, logits: torch.Tensor) -> torch.Tensor:
        """The softmax normaliser of ``logits`` (the output's, in float32) with the left-out mass, (rows,)."""
        assert self.log_inactive_mass is not None
        return torch.logaddexp(torch.logsumexp(logits, dim=-1), self.log_inactive_mass.float())

    def to_vocab_ids(self, cols: torch.Tensor) -> torch.Tensor:
        """Map column positions (rows, k) to vocabulary ids (rows, k)."""
        if self.ids is None:
            return cols
        if self.ids.dim() == 1:
            if self.ids.device.type == "cpu":  # numpy: a step's few rows cost a torch index ~5x its work
                return torch.from_numpy(self.ids.numpy()[cols.numpy()])
            return self.ids[cols]
        return torch.gather(self.ids, 1, cols)

    def topk(self, k: int, log_probs: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k (values, vocabulary ids), each (rows, k); values are log-probs unless ``log_probs=False``."""
        scores = self.log_probs() if log_probs else self.logits
        k = min(k, scores.shape[-1])
        values, cols = torch.topk(scores, k, dim=-1)
        return values, self.to_vocab_ids(cols)

    def dense(self, fill: float = -math.inf) -> torch.Tensor:
        """Scatter into a (rows, n_vocab) tensor, ``fill`` where no column was computed."""
        if self.ids is None:
            return self.logits
        out = self.logits.new_full((self.rows, self.n_vocab), fill)
        ids = self.ids if self.ids.dim() == 2 else self.ids.expand(self.rows, -1)
        # Per-row padding repeats an id with -inf; scatter_reduce(amax) keeps the real logit.
        return out.scatter_reduce(1, ids, self.logits, reduce="amax")

    def active_columns(self) -> torch.Tensor:
        """Columns computed per row, (rows,) int64 (padding not counted)."""
        if self.ids is None:
            return torch.full((self.rows,), self.n_vocab, dtype=torch.int64)
        if self.ids.dim() == 1:
            return torch.full((self.rows,), self.ids.numel(), dtype=torch.int64)
        return torch.isfinite(self.logits).sum(dim=1).to(torch.int64)


@dataclass
class CapturableStep:
    """A projection's step in the form a CUDA graph can hold (:meth:`Projection.capturable`): called with
    ``h`` (rows, d), it returns a ``ProjectionOutput`` of fixed shapes and reads nothing back to the host.

    ``overflow``: None when every output is complete; else a 0-d bool device flag the step ORs with "this
    output lacked columns" (a static union that outgrew its capacity). A search reads it at its next host
    read and then decodes the batch again with ``fallback``, an eager step that never drops a column.
    ``state``: device tensors the step itself changes in place (a recorder's slot counter); a capture's
    warm-up runs a real step, and the search puts them back afterwards with its own.
    """

    project: Callable[[torch.Tensor], ProjectionOutput]
    overflow: torch.Tensor | None = None
    fallback: Callable[[torch.Tensor], ProjectionOutput] | None = None
    state: tuple[torch.Tensor, ...] = ()

    def __call__(self, h: torch.Tensor) -> ProjectionOutput:
        return self.project(h)


class Projection:
    """Base class: the public ``__call__`` checks its input, then calls the method's ``_project`` hook.

    Subclasses take ``(weight, bias, *, always_active, fingerprint, **their_options)`` in ``__init__`` and
    must call ``super().__init__``. ``weight`` is (N, d) (one vocabulary entry contiguous), ``bias`` (N,) or
    None.
    """

    name: ClassVar[str] = "?"
    options_type: ClassVar[type[MethodOptions]] = MethodOptions  # what a user chooses of it (register)
    # What time_steps() sums; class defaults, so that a subclass that skips __init__ (a proxy) still has them.
    step_seconds: float = 0.0
    _timing: bool = False

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        always_active: Sequence[int] = (),
        fingerprint: str | None = None,
    ) -> None:
        if weight.dim() != 2:
            raise ValueError(f"weight must be (N, d), got {tuple(weight.shape)}")
        if bias is not None and bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}")
        self.weight = weight.contiguous()
        self.bias = bias
        self.n_vocab, self.d = weight.shape
        ids = sorted({int(i) for i in always_active})
        if ids and not (ids[0] >= 0 and ids[-1] < self.n_vocab):
            raise ValueError(f"always_active ids must be in [0, {self.n_vocab}), got {ids}")
        self.always_active = torch.tensor(ids, dtype=torch.int64, device=weight.device)
        self._fingerprint = fingerprint  # trusted when given; computed on first use otherwise

    @property
    def device(self) -> torch.device:
        return self.weight.device

    @property
    def fingerprint(self) -> str:
        if self._fingerprint is None:
            b = None if self.bias is None else self.bias.detach().float().cpu().numpy()
            self._fingerprint = projection_fingerprint(self.weight.detach().float().cpu().numpy(), b)
        return self._fingerprint

    def options(self) -> dict[str, object]:
        """The method's settings, for the reproducibility signature (override to add yours)."""
        return {}

    def stats(self) -> dict[str, float | None]:
        """What the method counted over its calls so far: active columns per decoder row, the share of rows
        with an exactness certificate, of rows sent to the full projection for being far from their
        centroid, and of rows whose step computed every column because the map could not pay at their row
        count; None where the method keeps no such count (override to report yours)."""
        return {
            "active_columns_per_row": None,
            "certified_fraction": None,
            "far_fraction": None,
            "full_fraction": None,
        }

    def capturable(self, rows: int) -> CapturableStep | None:
        """This method's step for ``rows`` rows as a CUDA graph can capture it (:class:`CapturableStep`), or
        None when it has none (its step reads a count or a certificate back to the host). Override to offer
        one."""
        return None

    def time_steps(self, on: bool = True) -> None:
        """Zero ``step_seconds`` and, while ``on``, add to it the wall time of each call's step: the method's
        own work, not the caller's use of its logits, summed over the threads that call the projection.
        A step a captured graph replays (:meth:`capturable`) does not pass through here and is not counted.
        Never changes an output."""
        self.step_seconds = 0.0
        self._timing = on

    @property
    def timing(self) -> bool:
        """Whether :meth:`time_steps` is on."""
        return self._timing

    def open_sessions(self, rows: int) -> None:
        """Open now what steps of up to ``rows`` rows would open at their first use (an int8 layer's ONNX
        Runtime sessions; nothing here): a decode pool calls it before it forks its workers, which then run
        what they inherit instead of each opening its own."""

    def tally(self) -> dict[str, float]:
        """What this projection has added up so far (``step_seconds``, and a method's counters where it keeps
        them). A worker process that decodes with a copy of the projection sends back the difference over
        its batch, and the caller's projection adds it (:meth:`add_tally`), so :meth:`stats` and
        ``step_seconds`` cover every worker."""
        return {"step_seconds": self.step_seconds}

    def add_tally(self, added: dict[str, float]) -> None:
        """Add what :meth:`tally` measured elsewhere (the difference of two tallies)."""
        with _TIMING_LOCK:
            self.step_seconds += added.get("step_seconds", 0.0)

    def signature(self) -> str:
        """``method:clustered|mode:union|...|fastvocab:0.1.0|model:<fingerprint>`` (sacrebleu-style)."""
        parts = [f"method:{self.name}"] + [f"{k}:{v}" for k, v in sorted(self.options().items())]
        parts += [f"fastvocab:{__version__}", f"model:{self.fingerprint}"]
        return "|".join(parts)

    def __call__(self, h: torch.Tensor) -> ProjectionOutput:
        return self._checked_call(h, self._project)

    def _checked_call(
        self, h: torch.Tensor, step: Callable[[torch.Tensor], ProjectionOutput]
    ) -> ProjectionOutput:
        """``step(h)`` after the input checks, timed when :meth:`time_steps` is on: what ``__call__`` runs,
        open to a projection bound to a batch (whose step takes more than ``h``)."""
        if h.dim() != 2 or h.shape[1] != self.d:
            raise ValueError(f"hidden states must be (rows, {self.d}), got {tuple(h.shape)}")
        if h.device != self.device:
            raise ValueError(f"hidden states on {h.device}, projection on {self.device}")
        h = h.to(self.weight.dtype)
        if not self._timing:
            return step(h)
        t0 = time.perf_counter()
        try:
            return step(h)
        finally:
            seconds = time.perf_counter() - t0
            with _TIMING_LOCK:
                self.step_seconds += seconds

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        raise NotImplementedError
