"""Greedy and beam search over any output-layer method (``fastvocab.kernels.base.Projection``).

The search never touches the model's ``lm_head``: each step it asks the adapter for ``h`` (rows, d), calls
``projection(h)`` (a projection that depends on the source sentence, a lexical shortlist, is bound to the
batch first and also gets each row's sentence: ``_bind``) and works with what comes back, a dense (rows, N)
block for the full projection or a subset of columns with their vocabulary ids (shared (C,) or per row
(rows, C)) for candidate-set methods. Column positions are always mapped back with
``ProjectionOutput.to_vocab_ids``.

Semantics follow Hugging Face ``generate`` so the full projection reproduces it token for token:

- the forced prefix (``adapter.start_tokens``: decoder start + target-language tag) is fed first; this equals
  ``forced_bos_token_id``, which gives the tag probability 1,
- ``max_len`` counts decoding steps after the prefix (EOS included): ``generate(max_new_tokens=max_len +
  len(prefix) - 1)``,
- beam search keeps ``2 * beam`` candidates per step, scores finished hypotheses ``sum(log p) / length**lp``
  where ``length`` counts every generated token (forced tag and EOS included, decoder start excluded), and
  stops a sentence when ``beam`` hypotheses are finished and the best live one, normalised at its current
  length, cannot beat the worst of them (``generate``'s default ``early_stopping=False`` heuristic).

Each search is written once against a ``Stepper`` (``fastvocab.decoding.steppers``), which advances the
decoder. With the eager one, finished rows (greedy) leave the batch every step on CPU and in buckets on an
accelerator (``switches.COMPACT_FRACTION``; every step whenever a ``step_hook`` is given), finished sentences
(beam) at the next host read, so the cost of a step shrinks as sentences end. The search reads its stop
decision back to the host every step on CPU and every ``switches.SYNC_EVERY`` steps on an accelerator
(``_sync_every``); in between, the per-step work (top-k, finished pool, beam reorder) stays on the device and
waits for nothing. With the captured one (fixed shapes) nothing leaves the batch, one whole step (the choice,
the reorder, the decoder step) runs without a host read, in CUDA graphs on CUDA, and the projection is its
capturable step (``Projection.capturable``); a static union that outgrows its capacity sends the batch to the
eager search, where such a step gets the full logits (a column is never dropped silently).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fastvocab import switches
from fastvocab.decoding.beam_candidates import forced_candidates, row_candidates
from fastvocab.decoding.beam_kernels import prepare_compiled_step
from fastvocab.decoding.beam_state import BeamState
from fastvocab.decoding.settings import DEFAULT_SEARCH, SearchSettings
from fastvocab.decoding.steppers import CapturedStepper, EagerStepper, Stepper, capturable_step
from fastvocab.decoding.stopping import check_stopping_rule, parse_early_stopping, stopping_rule
from fastvocab.kernels.base import CapturableStep, Projection, ProjectionOutput
from fastvocab.kernels.rowwise import argmax_rows

# The searches, and what the rooms above import from here though it lives in the modules it imports.
__all__ = [
    "BeamState",
    "ProjectionLike",
    "StepHook",
    "StepRecord",
    "beam_search",
    "check_stopping_rule",
    "decode",
    "forced_candidates",
    "greedy_search",
    "parse_early_stopping",
    "prepare_compiled_step",
    "row_candidates",
    "stopping_rule",
]

log = logging.getLogger(__name__)


@dataclass
class StepRecord:
    """Handed to ``step_hook`` after each projection call."""

    row_ids: torch.Tensor  # (rows,) index of the source sentence in the batch for each row
    step: int  # target position (0 = first generated token after the forced prefix)
    hidden: torch.Tensor  # (rows, d) the states given to the projection
    output: ProjectionOutput  # what the projection returned (full: dense logits)


StepHook = Callable[[StepRecord], None]


def _sync_every(device: torch.device, step_hook: StepHook | None) -> int:
    if step_hook is not None:
        return 1
    return (switches.CPU_SYNC_EVERY if device.type == "cpu" else switches.SYNC_EVERY).get()


def _banned_ids(adapter, device: torch.device) -> torch.Tensor | None:
    ids = adapter.suppressed_ids() if hasattr(adapter, "suppressed_ids") else []
    return torch.tensor(ids, dtype=torch.int64, device=device) if ids else None


Project = Callable[[torch.Tensor, torch.Tensor], ProjectionOutput]
# What the searches take: a projection, or any h (rows, d) -> ProjectionOutput (StaticUnion.project, ...).
ProjectionLike = Projection | Callable[[torch.Tensor], ProjectionOutput]


def _bind(projection: ProjectionLike, batch: dict) -> Project:
    """``(h, row_ids) -> output`` for this batch; ``row_ids`` (rows,) is the source sentence of each row.

    A projection whose candidates depend on the source (a lexical shortlist) has ``for_batch(input_ids,
    attention_mask)``: it is bound here to the batch's sources, a fresh object per batch, and told at every
    step which sentence each row decodes. Every other projection only sees ``h``.
    """
    for_batch = getattr(projection, "for_batch", None)
    if for_batch is None:
        return lambda h, row_ids: projection(h)
    return for_batch(batch["input_ids"], batch.get("attention_mask"))


def _strip(seq: list[int], eos_id: int) -> list[int]:
    return seq[: seq.index(eos_id)] if eos_id in seq else seq


def _check(adapter, src_lang: str, tgt_lang: str, max_len: int) -> None:
    adapter.check_language(src_lang)
    adapter.check_language(tgt_lang)
    if max_len < 1:
        raise ValueError(f"max_len must be >= 1, got {max_len}")


def _projector(
    projection: ProjectionLike, batch: dict, stepper: Stepper, rows: int
) -> tuple[Project, CapturableStep | None]:
    """How the search projects ``h``: bound to the batch (:func:`_bind`) for the eager stepper; for the
    captured one, the projection's capturable step for ``rows`` rows (``Projection.capturable``), also
    returned (its overflow flag, its fallback), or a ValueError when it has none."""
    if not stepper.fixed:
        return _bind(projection, batch), None
    step = capturable_step(projection, rows)
    if step is None:
        raise ValueError(
            f"{type(projection).__name__} has no capturable output: the captured step runs the full "
            "projection or union-mode clustered"
        )
    return (lambda h, row_ids: step(h)), step


def _overflowed(
    captured: CapturableStep | None, what: str
) -> Callable[[torch.Tensor], ProjectionOutput] | None:
    """The eager step to decode the batch again with when a captured step's output lacked columns (a static
    union outgrew its capacity: never serve a choice made without all its columns), else None."""
    if captured is None or captured.overflow is None or not bool(captured.overflow):
        return None
    assert captured.fallback is not None  # a step that can overflow names its fallback
    log.info("captured %s search: a union outgrew its static capacity; batch decoded again eagerly", what)
    return captured.fallback


def _overflow_flag(captured: CapturableStep | None, device: torch.device) -> torch.Tensor:
    """The captured step's overflow flag, or a flag that stays False (a step that cannot overflow)."""
    if captured is not None and captured.overflow is not None:
        return captured.overflow
    return torch.zeros((), dtype=torch.bool, device=device)


def _step_state(captured: CapturableStep | None) -> tuple[torch.Tensor, ...]:
    """What the captured projection step changes in place (``CapturableStep.state``)."""
    return () if captured is None else captured.state


def _start(
    adapter, stepper: Stepper | None, step_hook: StepHook | None, batch: dict
) -> tuple[Stepper, int, torch.device, int, torch.Tensor | None, int | None] | None:
    """What both searches start from: (the stepper they run, the batch's rows, the model's device, EOS, the
    ids never emitted, the EOS forced at the length limit or None); None for an empty batch. The stepper
    given, or None for the eager one; a step hook needs the eager one."""
    stepper = EagerStepper(adapter) if stepper is None else stepper
    if stepper.fixed and step_hook is not None:
        raise ValueError("a step hook records the live rows of every step: it needs the eager stepper")
    n = batch["input_ids"].shape[0]
    if n == 0:
        return None
    device, forced_eos = adapter.device, getattr(adapter, "forced_eos_id", None)
    return stepper, n, device, adapter.eos_id, _banned_ids(adapter, device), forced_eos


@torch.inference_mode()
def greedy_search(
    adapter,
    projection: ProjectionLike,
    batch: dict,
    src_lang: str,
    tgt_lang: str,
    max_len: int = SearchSettings.max_len,
    step_hook: StepHook | None = None,
    stepper: Stepper | None = None,
) -> list[list[int]]:
    """Greedy decoding of a batch (from ``adapter.encode_texts``); token lists exclude prefix and EOS.

    ``stepper``: how the decoder advances (None: :class:`~fastvocab.decoding.steppers.EagerStepper`;
    :class:`~fastvocab.decoding.steppers.CapturedStepper`: fixed shapes, the step in a CUDA graph, the same
    outputs)."""
    _check(adapter, src_lang, tgt_lang, max_len)
    start = _start(adapter, stepper, step_hook, batch)
    if start is None:
        return []
    stepper, n, device, eos, banned, forced_eos = start
    fixed = stepper.fixed
    project, captured = _projector(projection, batch, stepper, rows=n)
    h, _ = stepper.start(batch, tgt_lang, max_len)
    if n == 1 and not fixed and step_hook is None and device.type == "cpu":
        return [_greedy_one_row(stepper, project, h, banned, eos, forced_eos, max_len)]
    alive = torch.arange(n, device=device)  # (rows,) source index of each row still in the batch
    finished = torch.zeros(n, dtype=torch.bool, device=device)  # (rows,) row has emitted EOS
    out_tokens = torch.full((n, max_len), eos, dtype=torch.long, device=device)
    column = torch.zeros(
        1, dtype=torch.long, device=device
    )  # fixed shapes: this step's column, on the device
    # Fixed shapes: torch's argmax (the CPU's numpy one makes a new tensor, not one a graph holds).
    argmax = argmax_rows if not fixed else (lambda scores: scores.argmax(dim=1, keepdim=True))
    # With a hook every step compacts, so records hold exactly the live rows (the dump relies on it).
    fraction = switches.COMPACT_FRACTION.get()
    if fraction is None:
        fraction = 0.0 if device.type == "cpu" else 0.25
    if step_hook is not None:
        fraction = 0.0
    check_every = _sync_every(device, step_hook)

    def choose(h: torch.Tensor, step: int, final: bool = False) -> torch.Tensor:
        """This step's tokens (rows,), written to ``out_tokens``; nothing read back with fixed shapes."""
        forced = forced_eos if final else None  # generate's forced_eos_token_id at the length limit
        # Eagerly the projection runs at a forced step too: its counters and the step hook see every step.
        if forced is not None and fixed:
            tokens = torch.full_like(alive, forced)
        else:
            out = project(h, alive)
            if step_hook is not None:
                step_hook(StepRecord(row_ids=alive, step=step, hidden=h, output=out))
            if forced is not None:
                tokens = torch.full_like(alive, forced)
            else:
                # (rows, C); argmax(logits) == argmax(log-probs)
                scores = out.search_scores(banned, log_probs=False, spend=step_hook is None)
                tokens = out.to_vocab_ids(argmax(scores))[:, 0]  # (rows,)
        # A finished row still in the batch keeps emitting EOS: out_tokens holds EOS there already.
        tokens = tokens.masked_fill(finished, eos)
        if fixed:
            out_tokens.index_copy_(1, column, tokens[:, None])
            column.add_(1)
        else:
            out_tokens[alive, step] = tokens
        finished.logical_or_(tokens == eos)
        return tokens

    last = max_len - 1  # the step whose token is never fed back
    overflow = _overflow_flag(captured, device)

    def body() -> None:  # a whole fixed-shape step (the step number lives on the device: column)
        stepper.step(choose(h, -1))

    held = (out_tokens, finished, column, overflow, *_step_state(captured))
    run = stepper.compile(body, held) if fixed and last > 0 else body
    for step in range(last):
        if fixed:
            run()  # the choice and the decoder step, in one graph when captured
            if (step + 1) % check_every == 0 and bool(finished.all() | overflow):  # the host read
                break
            continue
        tokens = choose(h, step)
        if (step + 1) % check_every == 0:
            done = int(finished.sum())  # the one host sync of the step
            if done == finished.shape[0]:
                break
            # Finished rows leave in buckets: a reorder copies the whole cache, a finished row costs a row.
            if done > 0 and done >= fraction * finished.shape[0]:
                keep = (~finished).nonzero()[:, 0]  # (rows',)
                alive, tokens, finished = alive[keep], tokens[keep], finished[keep]
                stepper.reorder(keep)
        h = stepper.step(tokens)
    else:
        choose(h, last, final=True)
    fallback = _overflowed(captured, "greedy")
    if fallback is not None:
        return greedy_search(adapter, fallback, batch, src_lang, tgt_lang, max_len=max_len)
    return [_strip(row, eos) for row in out_tokens.tolist()]


def _greedy_one_row(
    stepper: Stepper,
    project: Project,
    h: torch.Tensor,
    banned: torch.Tensor | None,
    eos: int,
    forced_eos: int | None,
    max_len: int,
) -> list[int]:
    """:func:`greedy_search`'s loop for a batch of one sentence on CPU, its choice read as a Python int: at
    one row each tensor op of the batch's bookkeeping (finished rows, the output grid, the count of the done)
    costs about as much as its work. The same tokens, the projection called at the same steps."""
    row = torch.zeros(1, dtype=torch.long)
    tokens: list[int] = []
    for step in range(max_len):
        out = project(h, row)  # at a forced step too, as the batched loop: counters see every step
        if step == max_len - 1 and forced_eos is not None:
            token = forced_eos
        else:
            token = int(out.to_vocab_ids(argmax_rows(out.search_scores(banned, log_probs=False, spend=True))))
        if token == eos:
            break
        tokens.append(token)
        if step < max_len - 1:
            h = stepper.step(torch.tensor([token]))
    return tokens


@torch.inference_mode()
def beam_search(
    adapter,
    projection: ProjectionLike,
    batch: dict,
    src_lang: str,
    tgt_lang: str,
    search: SearchSettings = DEFAULT_SEARCH,
    *,
    step_hook: StepHook | None = None,
    stepper: Stepper | None = None,
) -> list[list[int]]:
    """Batched beam search with ``search``'s ``beam``, ``max_len``, ``length_penalty`` and
    ``early_stopping``; returns the best hypothesis per sentence (prefix and EOS excluded).

    ``early_stopping`` as in ``generate``: ``True`` ends a sentence as soon as ``beam`` hypotheses are
    finished (set in the M2M100/NLLB checkpoints' generation configs); ``False`` is the heuristic described
    in the module docstring; ``"never"`` is that heuristic with the best live beam normalised at the maximum
    length when ``length_penalty > 0`` (canonical beam search); None: the model's generation config's rule
    (``adapter.early_stopping``), as ``generate`` reads it. ``stepper`` as in :func:`greedy_search`: with
    fixed shapes, done sentences stay in the batch (their finished hypotheses frozen) until all are done.
    """
    beam, max_len, length_penalty = search.beam, search.max_len, search.length_penalty
    early_stopping = stopping_rule(adapter, search.early_stopping)
    _check(adapter, src_lang, tgt_lang, max_len)
    if beam < 1:
        raise ValueError(f"beam must be >= 1, got {beam}")
    start = _start(adapter, stepper, step_hook, batch)
    if start is None:
        return []
    stepper, n, device, eos, banned, forced_eos = start
    fixed = stepper.fixed
    if device.type == "cpu":  # the compiled step: loaded, or compiled with a line saying so
        prepare_compiled_step()
    k = beam  # live beams; 2k candidates kept per step (room for k live ones after EOS)

    project, captured = _projector(projection, batch, stepper, rows=n * k)
    # k rows per sentence only after the prefix: it is the same for every beam.
    h, prefix_len = stepper.start(batch, tgt_lang, max_len, group=k)  # (n*k, d)

    sent = torch.arange(n, device=device)  # (nb,) source index of each live sentence
    row_ids = sent.repeat_interleave(k)  # (nb*k,): k rows per live sentence, in order
    beams = BeamState(
        n,
        k,
        max_len,
        prefix_len,
        length_penalty,
        early_stopping,
        eos,
        device,
        host=not fixed and device.type == "cpu",
    )
    results: list[list[int]] = [[] for _ in range(n)]
    sync_every = _sync_every(device, step_hook)

    def choose(h: torch.Tensor, step: int, final: bool = False, first: bool = False):
        """This step's tokens (nb, k) and the row (nb, k) each continues; nothing read back with fixed
        shapes. ``first``: a sentence's k rows are the same state: project one and copy its candidates (as
        CTranslate2 does)."""
        forced = forced_eos if final else None  # generate's forced_eos_token_id at the length limit
        # Eagerly the projection runs at a forced step too: its counters and the step hook see every step.
        if forced is None or not fixed:
            out = project(h[::k].contiguous() if first else h, sent if first else row_ids)
            if step_hook is not None:
                step_hook(StepRecord(row_ids=row_ids, step=step, hidden=h, output=out))
        if forced is not None:
            row_vals, row_toks = forced_candidates(sent.shape[0] * k, forced, device)
        else:
            row_vals, row_toks = row_candidates(out, banned, k, first, spend=step_hook is None)
        return beams.advance(row_vals, row_toks, final=final)  # (nb, k) each

    def feed(tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        stepper.reorder(rows.reshape(-1), group=k)  # k rows per sentence, sentences in order
        return stepper.step(tokens.reshape(-1))

    def collect() -> None:
        """The best finished hypothesis of each done sentence (frozen since it was done)."""
        idx = beams.done.nonzero()[:, 0].tolist()
        best = beams.fin_seqs[idx, 0].tolist()
        for i, seq in zip(idx, best, strict=True):
            results[int(sent[i])] = _strip(seq, eos)

    last = max_len - 1  # the step whose tokens are never fed back
    overflow = _overflow_flag(captured, device)

    def body() -> None:  # a whole fixed-shape step (the step number lives on the device: beams.step)
        feed(*choose(h, -1))

    held = (*beams.tensors(), overflow, *_step_state(captured))
    run = stepper.compile(body, held) if fixed and last > 0 else body
    # A step hook sees every row of the first step, as the dump has always recorded them.
    first_step = k > 1 and step_hook is None
    for step in range(last):
        if fixed:
            if step == 0 and first_step:
                feed(*choose(h, step, first=True))  # eagerly: n rows scored, not n*k
            else:
                run()  # the choice, the reorder and the decoder step, in graphs when captured
            if (step + 1) % sync_every == 0 and bool(beams.done.all() | overflow):  # the host read
                break
            continue
        tokens, rows = choose(h, step, first=step == 0 and first_step)
        if (step + 1) % sync_every == 0 and beams.pooled and bool(beams.done.any()):  # the host read
            collect()
            if bool(beams.done.all()):
                break
            keep = (~beams.done).nonzero()[:, 0]  # (nb',)
            rows, tokens, sent = rows[keep], tokens[keep], sent[keep]
            row_ids = sent.repeat_interleave(k)
            beams.keep(keep)
        h = feed(tokens, rows)
    else:
        choose(h, last, final=True, first=last == 0 and first_step and forced_eos is None)
    fallback = _overflowed(captured, "beam")
    if fallback is not None:
        return beam_search(adapter, fallback, batch, src_lang, tgt_lang, search)
    collect()
    return results


def decode(
    adapter,
    projection: ProjectionLike,
    batch: dict,
    src_lang: str,
    tgt_lang: str,
    search: SearchSettings = DEFAULT_SEARCH,
    *,
    step_hook: StepHook | None = None,
    graphs: bool = False,
) -> list[list[int]]:
    """Greedy search for ``search.beam == 1``, else beam search (translation, the dump and the benchmarks),
    with ``search``'s ``beam``, ``max_len``, ``length_penalty`` and ``early_stopping`` (a batch is given, and
    whether its steps are captured: its other fields are the caller's).

    ``search.early_stopping``: beam search's stopping rule (:func:`beam_search`); None takes the model's
    generation config (``adapter.early_stopping``), as ``generate`` does. ``graphs``: the captured stepper
    (the whole step in CUDA graphs on CUDA, eagerly elsewhere; the same outputs; it needs the static engine
    and a projection with a capturable step, and takes no ``step_hook``), else the eager one
    (``translate`` chooses it from ``search.graphs``: :func:`~fastvocab.decoding.steppers.use_graphs`).
    """
    stepper: Stepper = CapturedStepper(adapter) if graphs else EagerStepper(adapter)
    if search.beam == 1:
        return greedy_search(
            adapter, projection, batch, src_lang, tgt_lang, max_len=search.max_len, step_hook=step_hook,
            stepper=stepper,
        )  # fmt: skip
    return beam_search(
        adapter, projection, batch, src_lang, tgt_lang, search, step_hook=step_hook, stepper=stepper
    )
