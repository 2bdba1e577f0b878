"""The dump stage: decode unlabelled source sentences with the full projection and record, for every decoder
step, the hidden state ``h`` that entered the projection and the model's top-K token ids (Amer et al. 2.2).

With ``DumpSettings.beam == 1`` the states are those of the greedy path (the paper's setting). With a beam,
the sentences are decoded by full-softmax beam search and every live hypothesis's state is recorded: beam
search visits states the greedy path never reaches, and a map that never saw them misses ids it needs. Such a
shard holds several rows per ``(sent_id, step)``, one per distinct hypothesis, in beam order.

Records stay on the model's device until a batch ends. On CUDA the greedy path runs the captured step
(``DumpSettings.graphs``): :class:`StepRecorder` writes every row of every step into fixed device buffers
inside the CUDA graph, and each row's live steps are cut out at the end. Those are the rows the eager step
hook records, except at a forced EOS at the length limit: the captured search does not project that step.

Work is cut into deterministic shards: shard ``i`` of a direction holds sentences ``[i*S, (i+1)*S)`` of the
configured sample and is written, atomically, to ``<states>/direction=<src>-<tgt>/part-<i:05d>.parquet``
(format: ``artifacts_schema.hidden_states``). Each file carries the plan it was made from, so a shard whose
file exists and matches the current plan is skipped: the stage resumes shard by shard.

:class:`DumpDecoder` is the unit of work: model loaded once in ``__init__`` from the driver's
:class:`~fastvocab.tasks.context.RunContext` (its fingerprint is not recomputed), ``__call__`` maps a batch of
columns (``sent_id``, ``text``, ``src_lang``, ``tgt_lang``) to a batch of state rows, ``decode_shard``
serves a whole shard (written by :func:`run_dump_shard`, counted by ``tasks.stream``). It is a plain class,
not a Ray actor: tests call it directly, and the pipeline hosts one in each
``tasks.workers.DecoderWorker`` actor.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fastvocab import switches
from fastvocab.artifacts_schema.digest import digest
from fastvocab.artifacts_schema.hidden_states import (
    REFERENCE_BEAM,
    ShardMeta,
    shard_is_current,
    shard_path,
    shard_table,
    write_shard,
)
from fastvocab.decoding.settings import SearchSettings, engine_for
from fastvocab.tasks.context import RunContext

if TYPE_CHECKING:
    import torch

    from fastvocab.kernels.base import CapturableStep, ProjectionOutput

log = logging.getLogger(__name__)

_RECORD_COLUMNS = ("row", "step", "hidden", "topk_ids", "topk_logprobs")
# Rows per projection call on the reference path: switches.TEACHER_ROWS on CPU; on CUDA as many rows as keep
# a call's float32 logits within this many bytes, from switches.TEACHER_ROWS to switches.TEACHER_ROWS_CUDA.
TEACHER_LOGITS_BYTES = 1 << 30


def teacher_rows(device: str, n_vocab: int) -> int:
    """Rows a projection call on the reference path, for the device and the vocabulary size."""
    least = switches.TEACHER_ROWS.get()
    if not device.startswith("cuda"):
        return least
    return max(least, min(switches.TEACHER_ROWS_CUDA.get(), TEACHER_LOGITS_BYTES // (4 * n_vocab)))


@dataclass(frozen=True)
class DumpSettings:
    """How states are decoded and recorded; part of every shard's plan."""

    k: int = 5  # top-K ids recorded per state
    max_len: int = SearchSettings.max_len  # max target tokens decoded per sentence
    batch_size: int = 32  # sentences a batch (padding changes float rounding, so it is in the plan)
    # 1: the greedy path; > 1: every live hypothesis of full-softmax beam search; REFERENCE_BEAM (0): the
    # states along each line's reference translation (teacher forcing, one batched decoder pass)
    beam: int = 1
    # greedy only: decode with the captured fixed-shape step (decoding.steppers.GRAPHS: "auto" captures it
    # on CUDA where it can be captured). Fixed shapes keep finished rows in the batch, which changes fp16
    # rounding, so a dump that ran captured says so in its plan.
    graphs: str = "auto"
    # Longer source lines are left out: translate refuses them, so no map needs their states, and a batch
    # padded to a few thousand source tokens takes gigabytes in the encoder's attention.
    max_input_tokens: int = SearchSettings.max_input_tokens

    def __post_init__(self) -> None:
        if (
            min(self.k, self.max_len, self.batch_size, self.max_input_tokens) < 1
            or self.beam < REFERENCE_BEAM
        ):
            raise ValueError(f"dump settings must be >= 1 (beam >= {REFERENCE_BEAM}), got {self}")
        if self.graphs not in ("auto", "on", "off"):  # decoding.steppers.GRAPHS (no torch import here)
            raise ValueError(f"dump graphs must be auto, on or off; got {self.graphs!r}")
        # Beam search extends each hypothesis with its 2 x beam best tokens, so a map must know at least those
        # ids per state. Refused, not k silently raised: k is in every shard's plan and bounds maps.k, so the
        # user should see (and log) the k the states were actually recorded with.
        if self.beam > 1 and self.k < 2 * self.beam:
            raise ValueError(
                f"dump k={self.k} is below 2 x beam = {2 * self.beam}: beam search keeps the 2 x beam best "
                f"tokens of every hypothesis, so record at least k={2 * self.beam} ids per state"
            )


@dataclass(frozen=True)
class ShardSpec:
    """One unit of dump (or stream) work: a contiguous slice of a direction's sample."""

    direction: str
    index: int
    sent_ids: tuple[int, ...]
    texts: tuple[str, ...]
    max_states: int | None = None  # keep at most this many rows (the first ones, in sentence order)
    # each sentence's reference translation ("" where it has none), for the reference path
    references: tuple[str, ...] | None = None

    @property
    def src_lang(self) -> str:
        return self.direction.split("-", 1)[0]

    @property
    def tgt_lang(self) -> str:
        return self.direction.split("-", 1)[1]

    def plan(self, settings: DumpSettings) -> dict[str, object]:
        """What the shard's content depends on besides the model: compared on resume."""
        lines = "".join(f"{i}\t{t}\n" for i, t in zip(self.sent_ids, self.texts, strict=True))
        plan: dict[str, object] = {
            "direction": self.direction,
            "index": self.index,
            "sentences": len(self.sent_ids),
            "sentences_digest": digest(lines),
            "max_states": self.max_states,
            "k": settings.k,
            "max_len": settings.max_len,
            "batch_size": settings.batch_size,
        }
        # Only a beam dump names its beam: greedy plans (and so the bytes of greedy shards, and their resume
        # against shards written before the beam setting existed) stay as they were.
        if settings.beam != 1:
            plan["beam"] = settings.beam
        if settings.graphs == "on":  # (the decoder's settings say "on" only where it runs captured)
            plan["graphs"] = "on"
        # as the beam: only a limit other than translate's default is named, so shards written before the
        # limit existed stay current (a shard holding a longer line was one few machines could decode)
        if settings.max_input_tokens != SearchSettings.max_input_tokens:
            plan["max_input_tokens"] = settings.max_input_tokens
        if settings.beam == REFERENCE_BEAM:
            refs = self.references or ("",) * len(self.sent_ids)
            lines = "".join(f"{i}\t{t}\n" for i, t in zip(self.sent_ids, refs, strict=True))
            plan["references_digest"] = digest(lines)
        return plan


def plan_shards(
    direction: str,
    sent_ids: list[int],
    texts: list[str],
    shard_sentences: int,
    max_states: int | None = None,
    first_index: int = 0,
) -> list[ShardSpec]:
    """Cut a direction's sample into shards of ``shard_sentences``; a state cap is split evenly over them."""
    if len(sent_ids) != len(texts):
        raise ValueError(f"{len(sent_ids)} ids for {len(texts)} texts")
    n_shards = -(-len(texts) // shard_sentences)
    cap = None if max_states is None else -(-max_states // max(n_shards, 1))
    return [
        ShardSpec(
            direction,
            first_index + i,
            tuple(int(x) for x in sent_ids[i * shard_sentences : (i + 1) * shard_sentences]),
            tuple(texts[i * shard_sentences : (i + 1) * shard_sentences]),
            cap,
        )
        for i in range(n_shards)
    ]


class DumpDecoder:
    """Greedy (or beam) decoding with the full projection, recording every step's ``h`` and top-K ids.

    ``__call__`` takes ``{"sent_id": (n,), "text": (n,), "src_lang": (n,), "tgt_lang": (n,)}`` and returns
    ``{"sent_id", "step", "hidden" (rows, d) fp16, "topk_ids" (rows, K) int32, "topk_logprobs" (rows, K)}``,
    rows ordered by (input row, step), and with a beam by hypothesis (best first) within a step. Rows of
    different directions may be mixed in one batch.
    """

    def __init__(self, ctx: RunContext, settings: DumpSettings) -> None:
        from fastvocab.kernels import create_projection

        self.ctx = ctx
        self.settings = settings
        self.k, self.max_len, self.batch_size = settings.k, settings.max_len, settings.batch_size
        self.beam = settings.beam
        engine = engine_for(ctx.engine, settings.graphs, ctx.torch_threads)  # one batch at a time
        self.adapter = replace(ctx, engine=engine).load_adapter()
        self.projection = create_projection(
            "full", self.adapter.output_weight, self.adapter.output_bias, fingerprint=ctx.model.fingerprint
        )
        self.fingerprint: str = ctx.model.fingerprint
        self.d: int = ctx.model.d
        self.n_vocab: int = ctx.model.n_vocab
        if self.k > self.n_vocab:
            raise ValueError(f"dump k={self.k} exceeds the vocabulary size {self.n_vocab}")
        self.settings = replace(settings, graphs="on" if self._captures(settings) else "off")

    def _captures(self, settings: DumpSettings) -> bool:
        """Whether greedy batches decode with the captured step (``settings.graphs`` resolved here)."""
        from fastvocab.decoding.steppers import use_graphs

        if settings.beam != 1:
            if settings.graphs == "on":
                raise ValueError("dump graphs='on' records the greedy path only (beam 1)")
            return False
        return use_graphs(settings.graphs, self.adapter, self.projection)

    def along(self, beam: int) -> DumpDecoder:
        """This decoder decoding along ``beam`` instead (the same model and projection, not loaded again)."""
        if beam == self.beam:
            return self
        other = copy.copy(self)
        graphs = self.settings.graphs if beam == 1 else "off"  # the captured recording is greedy's
        other.settings = replace(self.settings, beam=beam, graphs=graphs)  # checks k >= 2 x beam
        other.beam = beam
        return other

    def shard_meta(self, direction: str) -> ShardMeta:
        return ShardMeta(model_fingerprint=self.fingerprint, d=self.d, k=self.k, direction=direction)

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        sent_ids = np.asarray(batch["sent_id"], dtype=np.int64)
        texts = [str(t) for t in batch["text"]]
        src = [str(x) for x in batch["src_lang"]]
        tgt = [str(x) for x in batch["tgt_lang"]]
        refs = None
        if self.beam == REFERENCE_BEAM:
            if "reference" not in batch:
                raise ValueError("the reference path needs a 'reference' column")
            refs = ["" if r is None else str(r) for r in batch["reference"]]
        parts: list[dict[str, np.ndarray]] = []
        # One search per direction in the batch (the forced target tag is per call).
        for pair in sorted(set(zip(src, tgt, strict=True))):
            rows = np.array([i for i, p in enumerate(zip(src, tgt, strict=True)) if p == pair])
            if refs is not None:  # a line without a reference has no reference path
                rows = rows[[bool(refs[i].strip()) for i in rows]] if len(rows) else rows
            for lo in range(0, len(rows), self.batch_size):
                sel = rows[lo : lo + self.batch_size]
                sel_refs = None if refs is None else [refs[i] for i in sel]
                part = _host_columns(self.records([texts[i] for i in sel], pair[0], pair[1], sel_refs))
                part["row"] = sel[part["row"]]
                parts.append(part)
        if not parts:
            return self._empty()
        row = np.concatenate([p["row"] for p in parts])
        step = np.concatenate([p["step"] for p in parts])
        order = np.lexsort((step, row))  # by input row, then step; stable: hypotheses keep beam order
        return {
            "sent_id": sent_ids[row[order]],
            "step": step[order].astype(np.int32),
            "hidden": np.concatenate([p["hidden"] for p in parts])[order],
            "topk_ids": np.concatenate([p["topk_ids"] for p in parts])[order],
            "topk_logprobs": np.concatenate([p["topk_logprobs"] for p in parts])[order],
        }

    def records(
        self, texts: list[str], src_lang: str, tgt_lang: str, references: list[str] | None = None
    ) -> dict[str, torch.Tensor]:
        """One batch of one direction (at most ``batch_size`` lines; ``references`` on the reference path)
        decoded: the ``_RECORD_COLUMNS`` on the model's device, ``row`` indexing ``texts``, by row then step
        within a search's output order."""
        if self.beam == REFERENCE_BEAM:
            if references is None:
                raise ValueError("the reference path needs each line's reference")
            return self._teacher(texts, references, src_lang, tgt_lang)
        if self.settings.graphs == "on":
            return self._captured(texts, src_lang, tgt_lang)
        return self._decode(texts, src_lang, tgt_lang)

    def _empty(self) -> dict[str, np.ndarray]:
        return {
            "sent_id": np.zeros(0, np.int64),
            "step": np.zeros(0, np.int32),
            "hidden": np.zeros((0, self.d), np.float16),
            "topk_ids": np.zeros((0, self.k), np.int32),
            "topk_logprobs": np.zeros((0, self.k), np.float32),
        }

    def _record(
        self,
        rec: dict[str, list[torch.Tensor]],
        row_ids: torch.Tensor,
        steps: torch.Tensor,
        hidden: torch.Tensor,
        output: ProjectionOutput,
    ) -> None:
        """Append the rows' states and top-K of the projection's ``output`` to ``rec``, on the model's device:
        the batch's records are read back once, at its end (:func:`_host_columns`), not every step."""
        import torch

        from fastvocab.kernels.rowwise import topk_rows

        # The output's log-probs are computed once and shared with beam search's own candidates.
        logp, cols = topk_rows(output.log_probs(), min(self.k, output.logits.shape[1]))
        ids = output.to_vocab_ids(cols)  # (rows, K) best first
        if self.beam > 1:
            keep = distinct_hypotheses(row_ids, hidden)
            row_ids, steps, hidden, logp, ids = (
                row_ids[keep],
                steps[keep],
                hidden[keep],
                logp[keep],
                ids[keep],
            )
        rec["row"].append(row_ids)
        rec["step"].append(steps.to(torch.int32))
        rec["hidden"].append(hidden.to(torch.float16))  # (rows, d)
        rec["topk_ids"].append(ids.to(torch.int32))
        rec["topk_logprobs"].append(logp.float())

    def _teacher(
        self, texts: list[str], references: list[str], src_lang: str, tgt_lang: str
    ) -> dict[str, torch.Tensor]:
        """The reference path: the states of one batched decoder pass along each reference translation."""
        import torch

        rec: dict[str, list[torch.Tensor]] = {k: [] for k in _RECORD_COLUMNS}
        state = self.adapter.encode(self.adapter.encode_texts(texts, src_lang, tgt_lang))
        targets = self.adapter.tokenize_targets(references, tgt_lang)
        hidden, rows, steps = self.adapter.teacher_forced(state, tgt_lang, targets, self.max_len)
        step = teacher_rows(str(hidden.device), self.n_vocab)
        with torch.inference_mode():
            # the (rows, N) logits in blocks: cache-sized on CPU, bounded in memory on a GPU
            for lo in range(0, len(hidden), step):
                h = hidden[lo : lo + step]
                part = slice(lo, lo + step)
                self._record(rec, rows[part], steps[part], h, self.projection(h))
        return _device_columns(rec)

    def _decode(self, texts: list[str], src_lang: str, tgt_lang: str) -> dict[str, torch.Tensor]:
        import torch

        from fastvocab.decoding.search import decode

        rec: dict[str, list[torch.Tensor]] = {k: [] for k in _RECORD_COLUMNS}

        def hook(r) -> None:
            steps = torch.full((len(r.row_ids),), r.step, dtype=torch.int32, device=r.row_ids.device)
            self._record(rec, r.row_ids, steps, r.hidden, r.output)  # (rows,), (rows, d)

        batch = self.adapter.encode_texts(texts, src_lang, tgt_lang)
        search = SearchSettings(beam=self.beam, max_len=self.max_len)
        decode(self.adapter, self.projection, batch, src_lang, tgt_lang, search, step_hook=hook)
        return _device_columns(rec)

    def _captured(self, texts: list[str], src_lang: str, tgt_lang: str) -> dict[str, torch.Tensor]:
        """The greedy path with the captured fixed-shape step: the step records every row into buffers on the
        device (inside the CUDA graph), and each row's live steps are cut out once the batch ends."""
        from fastvocab.decoding.search import decode

        batch = self.adapter.encode_texts(texts, src_lang, tgt_lang)
        recorder = StepRecorder(
            self.projection, len(texts), self.max_len, self.k, self.d, self.adapter.device
        )
        search = SearchSettings(max_len=self.max_len)
        tokens = decode(self.adapter, recorder, batch, src_lang, tgt_lang, search, graphs=True)
        return recorder.live_rows(tokens)

    def length_order(self, spec: ShardSpec) -> list[int]:
        """The shard's lines, shortest first: batches of similar lengths waste fewer padded positions and
        fewer steps of rows that finished early. The reference path's length is the reference's (a search's
        is unknown until it ends)."""
        refs = spec.references
        lengths = spec.texts if refs is None or self.beam != REFERENCE_BEAM else refs
        return sorted(range(len(spec.texts)), key=lambda i: (len(lengths[i]), i))

    def within_limit(self, spec: ShardSpec, order: list[int]) -> list[int]:
        """``order`` less the lines of more than ``max_input_tokens`` source tokens. Every line is tokenized
        (tens of milliseconds a shard of 2,000, against seconds of decoding): a length in characters does
        not bound the tokens (a language tag, EOS and a word-start piece are added, and a byte-fallback
        tokenizer spends up to four tokens on a character)."""
        limit = self.settings.max_input_tokens
        ids = self.adapter.tokenize(list(spec.texts), spec.src_lang, spec.tgt_lang)
        out = {i for i, t in enumerate(ids) if len(t) > limit}
        if out:
            log.info(
                "%s shard %d: %d line(s) of more than %d source tokens left out (translate refuses them)",
                spec.direction, spec.index, len(out), limit,
            )  # fmt: skip
        return [i for i in order if i not in out]

    def decode_shard(self, spec: ShardSpec) -> dict[str, np.ndarray]:
        """All state rows of a shard, capped at ``spec.max_states``.

        Sentences are decoded in order of length (less padding, fewer wasted steps) and rows come back in
        sentence order. Padding can change float rounding, so the batch size is part of the shard's plan. With
        a beam a sentence has several rows per step, so the same cap covers fewer sentences.
        """
        refs = spec.references
        order = self.within_limit(spec, self.length_order(spec))
        n = len(order)
        batch = {
            "sent_id": np.arange(n, dtype=np.int64),  # positions, mapped back below
            "text": np.array([spec.texts[i] for i in order], dtype=object),
            "src_lang": np.array([spec.src_lang] * n, dtype=object),
            "tgt_lang": np.array([spec.tgt_lang] * n, dtype=object),
        }
        if self.beam == REFERENCE_BEAM:
            batch["reference"] = np.array([(refs or ("",) * n)[i] for i in order], dtype=object)
        cols = self(batch)
        pos = np.asarray(order, dtype=np.int64)[cols["sent_id"]]  # input position in the shard
        resort = np.lexsort((cols["step"], pos))
        cols = {k: v[resort] for k, v in cols.items()}
        cols["sent_id"] = np.asarray(spec.sent_ids, dtype=np.int64)[pos[resort]]
        if spec.max_states is not None and len(cols["sent_id"]) > spec.max_states:
            cols = {k: v[: spec.max_states] for k, v in cols.items()}
        return cols


def _device_columns(rec: dict[str, list[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """A batch's per-step records, concatenated on the device."""
    import torch

    return {k: torch.cat(v) for k, v in rec.items()}


def _host_columns(rec: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """A batch's records read back to the host, one copy per column."""
    return {k: v.cpu().numpy() for k, v in rec.items()}


class StepRecorder:
    """The full projection as the captured greedy step calls it, recording each call's ``h`` and top-K into
    fixed buffers (step, row, ...) on the device: nothing is read back to the host until the batch ends.

    Finished rows stay in a fixed-shape batch and are recorded too; :meth:`live_rows` keeps, as the eager
    dump's step hook does, each row's steps up to and including the one that emitted EOS.
    """

    def __init__(self, projection, rows: int, max_len: int, k: int, d: int, device) -> None:
        import torch

        self.projection, self.k = projection, k
        self.hidden = torch.zeros((max_len, rows, d), dtype=torch.float16, device=device)
        self.ids = torch.zeros((max_len, rows, k), dtype=torch.int32, device=device)
        self.logp = torch.zeros((max_len, rows, k), dtype=torch.float32, device=device)
        self.calls = torch.zeros(1, dtype=torch.long, device=device)  # the next step's slot, on the device

    def __call__(self, h: torch.Tensor) -> ProjectionOutput:
        from fastvocab.kernels.rowwise import topk_rows

        out = self.projection(h)
        logp, cols = topk_rows(out.log_probs(), self.k)
        self.hidden.index_copy_(0, self.calls, h.to(self.hidden.dtype)[None])
        self.ids.index_copy_(0, self.calls, out.to_vocab_ids(cols).to(self.ids.dtype)[None])
        self.logp.index_copy_(0, self.calls, logp.float()[None])
        self.calls.add_(1)
        return out

    def capturable(self, rows: int) -> CapturableStep:
        from fastvocab.kernels.base import CapturableStep

        return CapturableStep(self, state=(self.calls,))

    def live_rows(self, tokens: list[list[int]]) -> dict[str, torch.Tensor]:
        """The recorded rows (by row, then step) of the steps each row was live: a row that emitted EOS at
        step t was live at steps 0..t."""
        import torch

        steps = int(self.calls)  # the one host read
        device = self.hidden.device
        live = torch.tensor([len(t) + 1 for t in tokens], device=device).clamp(max=steps)  # (rows,)
        grid = torch.arange(steps, device=device)
        mask = grid[None, :] < live[:, None]  # (rows, steps)
        rows = torch.arange(len(tokens), device=device)[:, None].expand_as(mask)[mask]
        return {
            "row": rows,
            "step": grid[None, :].expand_as(mask)[mask].to(torch.int32),
            "hidden": self.hidden[:steps].transpose(0, 1)[mask],
            "topk_ids": self.ids[:steps].transpose(0, 1)[mask],
            "topk_logprobs": self.logp[:steps].transpose(0, 1)[mask],
        }


def distinct_hypotheses(row_ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """Boolean mask (rows,) that drops a row equal to the row before it in the same sentence.

    Beam search starts every sentence with ``beam`` copies of the same prefix (only the first one expands) and
    keeps a sentence's hypotheses adjacent: a copy adds no state the map lacks, only weight in k-means.
    """
    import torch

    keep = torch.ones(len(row_ids), dtype=torch.bool, device=row_ids.device)
    if len(row_ids) > 1:
        same = (row_ids[1:] == row_ids[:-1]) & (hidden[1:] == hidden[:-1]).all(dim=1)
        keep[1:] = ~same
    return keep


def run_dump_shard(
    decoder: DumpDecoder, spec: ShardSpec, states_root: Path, row_group_size: int = 50_000
) -> dict[str, object]:
    """Decode and write one shard (unless current); returns its metrics for the driver to log."""
    path = shard_path(states_root, spec.direction, spec.index)
    meta = decoder.shard_meta(spec.direction)
    plan = spec.plan(decoder.settings)
    if shard_is_current(path, meta, plan):
        return {"direction": spec.direction, "index": spec.index, "skipped": True, "path": str(path)}
    t0 = time.perf_counter()
    cols = decoder.decode_shard(spec)
    seconds = time.perf_counter() - t0
    table = shard_table(
        meta, cols["sent_id"], cols["step"], cols["hidden"], cols["topk_ids"], cols.get("topk_logprobs")
    )
    write_shard(table, plan, path, row_group_size)
    rows = len(cols["sent_id"])
    log.info("dumped %s shard %d: %d states in %.1f s", spec.direction, spec.index, rows, seconds)
    return {
        "direction": spec.direction,
        "index": spec.index,
        "skipped": False,
        "path": str(path),
        "sentences": len(spec.sent_ids),
        "states": rows,
        "seconds": seconds,
        "states_per_s": rows / seconds if seconds > 0 else float("nan"),
    }
