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
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from fastvocab import switches
from fastvocab.decoding.settings import DEFAULT_SEARCH, SearchSettings
from fastvocab.decoding.steppers import CapturedStepper, EagerStepper, Stepper, capturable_step
from fastvocab.kernels.base import CapturableStep, Projection, ProjectionOutput
from fastvocab.kernels.rowwise import argmax_rows, topk_rows

log = logging.getLogger(__name__)

# Score given to impossible beams, as in transformers (finite, so sums stay ordered).
_NEG = -1.0e9

_NO_IDS = np.empty(0, dtype=np.int64)
_NO_MASS = np.empty(0, dtype=np.float32)


@dataclass
class StepRecord:
    """Handed to ``step_hook`` after each projection call."""

    row_ids: torch.Tensor  # (rows,) index of the source sentence in the batch for each row
    step: int  # target position (0 = first generated token after the forced prefix)
    hidden: torch.Tensor  # (rows, d) the states given to the projection
    output: ProjectionOutput  # what the projection returned (full: dense logits)


StepHook = Callable[[StepRecord], None]


# Command-line names of beam search's stopping rules (``early_stopping``); "model": the generation config's.
EARLY_STOPPING_RULES: dict[str, bool | str | None] = {
    "model": None,
    "true": True,
    "false": False,
    "never": "never",
}


def parse_early_stopping(text: str) -> bool | str | None:
    """``"true"`` -> True, ``"never"`` -> "never", ``"model"`` -> None, ...; ValueError naming the choices."""
    try:
        return EARLY_STOPPING_RULES[text.lower()]
    except KeyError:
        raise ValueError(f"{text!r}: choose from {', '.join(EARLY_STOPPING_RULES)}") from None


def check_stopping_rule(rule: object) -> None:
    """ValueError unless ``rule`` is one of beam search's stopping rules: True, False or "never"."""
    if rule not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got {rule!r}")


def stopping_rule(adapter, early_stopping: bool | str | None = None) -> bool | str:
    """``early_stopping`` checked, or when None the model's generation config's rule, as ``generate``
    reads it (``adapter.early_stopping``)."""
    rule = getattr(adapter, "early_stopping", False) if early_stopping is None else early_stopping
    check_stopping_rule(rule)
    return rule


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


class BeamState:
    """Beam search's state for ``n`` sentences x ``k`` beams and its step (:meth:`advance`): the candidates,
    the pool of finished hypotheses and the stopping rule, as ``generate`` runs them. Used by
    :func:`beam_search`: with the eager stepper it drops done sentences at its host reads (:meth:`keep`);
    with fixed shapes nothing is read back to the host, so sentences stay and a done sentence's finished
    hypotheses stay frozen.

    ``host``: the eager search on CPU, where a host read is free: the step runs in numpy on the tensors'
    memory (:meth:`_advance_host`), merges finished candidates into the pool only at steps that have some,
    and checks the stopping rule only once the pool took one (``pooled``). Otherwise the step is tensor ops
    that read nothing back (an accelerator, CUDA graphs), merging and checking every step to the same result.
    """

    def __init__(
        self,
        n: int,
        k: int,
        max_len: int,
        prefix_len: int,
        length_penalty: float,
        rule: bool | str,
        eos: int,
        device: torch.device,
        host: bool = False,
    ) -> None:
        check_stopping_rule(rule)
        if host and device.type != "cpu":
            raise ValueError(f"a beam state on the host needs CPU tensors, got {device}")
        self.k, self.max_len, self.rule, self.eos, self.lp = k, max_len, rule, eos, length_penalty
        self.host = host
        # Whether the pool may hold a finished hypothesis, as the host knows it: lazily, from the first merge.
        self.pooled = not host
        self.run_scores = torch.full((n, k), _NEG, device=device)  # cumulative log-prob of the live beams
        self.run_scores[:, 0] = 0.0  # identical beams at the start: only the first one may expand
        self.run_seqs = torch.full((n, k, max_len), eos, dtype=torch.long, device=device)  # (n, k, T)
        self.fin_scores = torch.full((n, k), _NEG, device=device)  # normalised scores of finished hyps
        self.fin_seqs = torch.full((n, k, max_len), eos, dtype=torch.long, device=device)
        self.fin_any = torch.zeros((n, k), dtype=torch.bool, device=device)  # the slot holds a real one
        # Sentences done (found since the last host read, in beam_search): finished hypotheses frozen, as
        # generate adds none to a done sentence either.
        self.done = torch.zeros(n, dtype=torch.bool, device=device)
        self.step = torch.zeros(1, dtype=torch.long, device=device)  # the column of the sequences
        self.top_k_mask = torch.arange(2 * k, device=device) < k  # only the best k candidates may finish
        self.first_row = torch.arange(n, device=device)[:, None] * k  # (n, 1) each sentence's first row
        # (generated tokens incl. the forced tag) ** length_penalty by step: generate's length normalisation
        self.denoms = torch.tensor(
            [float(prefix_len + s) ** length_penalty for s in range(max_len)], device=device
        )
        self.never_len = float(prefix_len + max_len - 1) ** length_penalty  # "never": judged at the limit
        self._views: dict[str, np.ndarray] = {}
        if host:
            never = rule == "never" and length_penalty > 0  # "never" judges the best live beam at the limit
            self._rule_code = compiled_step().rule_code(rule is True, never)
            self._view_all()

    @property
    def n(self) -> int:
        return self.run_scores.shape[0]

    def tensors(self) -> tuple[torch.Tensor, ...]:
        """What :meth:`advance` changes in place (to save and restore around a CUDA graph's warm-up)."""
        return (self.run_scores, self.run_seqs, self.fin_scores, self.fin_seqs, self.fin_any, self.done,
                self.step)  # fmt: skip

    def advance(
        self, row_vals: torch.Tensor, row_toks: torch.Tensor, final: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One step from each row's best continuations ``row_vals`` / ``row_toks`` (n*k, kk): log-probs
        and vocabulary ids. Returns the tokens (n, k) the live beams continue with and the row (n, k) of
        the previous step each continues. ``final``: the length limit, where every candidate finishes and
        every sentence is done. Updates the state in place (same tensors: a CUDA graph can capture it)."""
        if self.host:
            return self._advance_host(row_vals, row_toks, final)
        n, k, k2, t = self.n, self.k, 2 * self.k, self.max_len
        kk = row_vals.shape[1]
        total = (row_vals.view(n, k, kk) + self.run_scores[:, :, None]).view(n, k * kk)
        cand_scores, flat = torch.topk(total, min(k2, k * kk), dim=-1)  # (n, k2)
        cand_beam = flat // kk  # which live beam each candidate extends
        cand_toks = row_toks.view(n, k * kk).gather(1, flat)  # (n, k2)
        cand_seqs = self.run_seqs.gather(1, cand_beam[:, :, None].expand(-1, -1, t))  # (n, k2, T), a copy
        cand_seqs.index_copy_(2, self.step, cand_toks[:, :, None])
        done_cand = torch.ones_like(cand_toks, dtype=torch.bool) if final else cand_toks == self.eos

        # Finished candidates among the best k enter the pool of finished hypotheses.
        top_k = self.top_k_mask if cand_toks.shape[1] == k2 else self.top_k_mask[: cand_toks.shape[1]]
        new_fin = done_cand & top_k & ~self.done[:, None]
        denom = self.denoms.index_select(0, self.step)  # (1,)
        norm = torch.add(cand_scores / denom, ~new_fin, alpha=_NEG)
        m_scores, sel = torch.topk(torch.cat([self.fin_scores, norm], dim=1), k, dim=1)
        m_seqs = torch.cat([self.fin_seqs, cand_seqs], dim=1)
        self.fin_seqs.copy_(m_seqs.gather(1, sel[:, :, None].expand(-1, -1, t)))
        self.fin_any.copy_(torch.cat([self.fin_any, new_fin], dim=1).gather(1, sel))
        self.fin_scores.copy_(m_scores)

        # The best k unfinished candidates live on (finished ones pushed to the bottom, as in generate).
        live, pick = torch.topk(torch.add(cand_scores, done_cand, alpha=_NEG), k, dim=1)
        self.run_scores.copy_(live)
        torch.gather(cand_seqs, 1, pick[:, :, None].expand(-1, -1, t), out=self.run_seqs)
        if final:
            self.done.fill_(True)
        else:
            # Done when all k slots hold finished hypotheses and (unless the rule is True) the best live
            # beam, normalised at its current length (or at the limit: "never"), is no better than the worst.
            now = self.fin_any.all(dim=1)
            if self.rule is not True:
                best = self.run_scores[:, 0] / (
                    self.never_len if self.rule == "never" and self.lp > 0 else denom
                )
                now &= best <= self.fin_scores.min(dim=1).values
            self.done.logical_or_(now)
        self.step.add_(1)
        rows = self.first_row + cand_beam.gather(1, pick)  # (n, k)
        return cand_toks.gather(1, pick), rows

    def _advance_host(
        self, row_vals: torch.Tensor, row_toks: torch.Tensor, final: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`advance` compiled, on the state's CPU memory (``host_beam_step.advance``): the same float32
        sums, divisions and comparisons as the tensor step, in one call where numpy took ~15 operations and
        torch ~30. Among equal scores the lower index comes first (``torch.topk`` promises no order)."""
        v = self._views
        toks = np.empty((self.n, self.k), dtype=np.int64)
        rows = np.empty((self.n, self.k), dtype=np.int64)
        self.pooled = compiled_step().advance(
            row_vals.numpy(), row_toks.numpy(), v["run_scores"], v["run_seqs"], v["fin_scores"],
            v["fin_seqs"], v["fin_any"], v["done"], v["step"], v["denoms"], self.eos, final, self.pooled,
            self._rule_code, np.float32(self.never_len), toks, rows,
        )  # fmt: skip
        return torch.from_numpy(toks), torch.from_numpy(rows)

    def _view_all(self) -> None:
        """numpy views of the state's tensors (the same memory), for :meth:`_advance_host`."""
        names = ("run_scores", "run_seqs", "fin_scores", "fin_seqs", "fin_any", "done", "step", "denoms")
        self._views = {name: getattr(self, name).numpy() for name in names}

    def keep(self, index: torch.Tensor) -> None:
        """Keep the sentences ``index`` (n',) only, in that order (beam_search drops the done ones)."""
        for name in ("run_scores", "run_seqs", "fin_scores", "fin_seqs", "fin_any", "done"):
            setattr(self, name, getattr(self, name)[index])
        self.first_row = self.first_row[: index.shape[0]]
        if self.host:
            self._view_all()


def row_candidates(
    out: ProjectionOutput,
    banned: torch.Tensor | None,
    k: int,
    first: bool = False,
    topk: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]] = topk_rows,
    spend: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's best ``2k`` continuations (log-probs, vocabulary ids) from a projection's output, the
    ``banned`` ids at -inf after the log-softmax (as generate's processors): a sentence's best ``2k`` over
    its ``k`` rows lie within them. ``first``: the rows are one per sentence (the first step), copied to its
    ``k`` beams. ``topk``: the per-row top-k (the CPU's blocked one; ``torch.topk`` gives the same values).
    ``spend``: nothing reads ``out`` after (:meth:`ProjectionOutput.search_scores`).

    On CPU (float32, one id per column), the normaliser, the banned ids and the top-k are one compiled call
    (``host_beam_step.row_candidates``) that reads the logits and writes nothing over them."""
    if topk is topk_rows and _host_can(out):
        return _host_candidates(out, banned, k, first)
    logp = out.search_scores(banned, log_probs=True, spend=spend)  # (rows, C)
    vals, cols = topk(logp, min(2 * k, logp.shape[1]))
    toks = out.to_vocab_ids(cols)
    if first:
        return vals.repeat_interleave(k, 0), toks.repeat_interleave(k, 0)
    return vals, toks


def compiled_step():
    """``fastvocab.decoding.host_beam_step``, imported on first use: numba takes ~0.4 s to import, and only
    beam search on CPU needs it."""
    from fastvocab.decoding import host_beam_step

    return host_beam_step


_PREPARED = False
_PREPARING = threading.Lock()


def prepare_compiled_step() -> None:
    """Load beam search's compiled CPU functions (``host_beam_step.warm``) once per process, before the
    first beam search on CPU, so that the processes a decode pool forks after it inherit them. Where numba's
    cache holds no machine code for them (the first run on a machine, or after their source changed), one
    line on standard error says that the next ~10 s are spent compiling them, and where they are then kept;
    where numba can cache nothing, that every process compiles them. A warm cache loads them in under a
    second, silently."""
    global _PREPARED
    if _PREPARED:
        return
    with _PREPARING:
        if _PREPARED:
            return
        step = compiled_step()
        state, folder = step.cache_state()
        if state == step.COLD:
            print(
                f"compiling the beam search's CPU kernels (once per machine, ~10 s; cached in {folder})",
                file=sys.stderr,
                flush=True,
            )
        elif state == step.UNCACHED:
            print(
                "compiling the beam search's CPU kernels (~10 s; numba has no writable cache folder here, so "
                "every process compiles them: set NUMBA_CACHE_DIR to keep them)",
                file=sys.stderr,
                flush=True,
            )
        step.warm()
        _PREPARED = True


def _host_can(out: ProjectionOutput) -> bool:
    logits = out.logits
    return (
        switches.COMPILED_CANDIDATES.get() and logits.device.type == "cpu" and logits.dtype == torch.float32
        and (out.ids is None or out.ids.dim() == 1) and not logits.requires_grad
    )  # fmt: skip


def _host_candidates(
    out: ProjectionOutput, banned: torch.Tensor | None, k: int, first: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`row_candidates` as one compiled call on the output's CPU memory."""
    rows, cols = out.logits.shape
    m, copies = min(2 * k, cols), k if first else 1
    vals = np.empty((rows * copies, m), dtype=np.float32)
    toks = np.empty((rows * copies, m), dtype=np.int64)
    ids = _NO_IDS if out.ids is None else out.ids.numpy()
    mass = _NO_MASS if out.log_inactive_mass is None else out.log_inactive_mass.float().numpy()
    banned_ids = _NO_IDS if banned is None else np.sort(banned.numpy())
    compiled_step().row_candidates(out.logits.numpy(), ids, mass, banned_ids, m, copies, vals, toks)
    return torch.from_numpy(vals), torch.from_numpy(toks)


def forced_candidates(rows: int, token: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """generate's ``forced_eos_token_id`` at the length limit: ``token`` gets log-prob 0, all else -inf."""
    return torch.zeros((rows, 1), device=device), torch.full(
        (rows, 1), token, dtype=torch.long, device=device
    )


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
