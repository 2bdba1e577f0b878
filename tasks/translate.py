"""Bulk translation of sentences with any output-layer method.

``translate`` is the unit of work behind ``fastvocab translate`` and the pipeline's translate stage:
validate the languages, tokenize everything once (a line longer than ``max_input_tokens`` is an error, never
silently cut), sort by length so batches waste little padding, decode batch by batch, restore input order.
Empty lines become empty outputs without touching the model.

The batches are decoded by a :class:`~fastvocab.tasks.decode_pool.DecodePool` (on CPU several at once,
one per torch thread, in forked processes on Linux): one made for the call, or the caller's own, kept
between calls.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.packed_encoder import length_runs
from fastvocab.decoding.search import check_stopping_rule, prepare_compiled_step
from fastvocab.decoding.settings import DEFAULT_SEARCH, SearchSettings
from fastvocab.decoding.steppers import use_graphs
from fastvocab.kernels.base import Projection
from fastvocab.tasks.decode_pool import DecodePool

log = logging.getLogger(__name__)


class LineTooLongError(ValueError):
    """A source line longer than ``max_input_tokens``; ``line`` is 1-based within the lines translated, so a
    caller that translates a file in parts says where it is in the file (:meth:`at`)."""

    def __init__(self, line: int, tokens: int, limit: int) -> None:
        self.line, self.tokens, self.limit = line, tokens, limit
        super().__init__(self.at(None, 0))

    def at(self, path: object | None, first_line: int, flag: str = "max_input_tokens") -> str:
        """The message for the line's place in a file: ``first_line`` lines precede those translated."""
        where = f"{path}: " if path is not None else ""
        return (
            f"{where}line {first_line + self.line} has {self.tokens} tokens, more than {flag}={self.limit} "
            "(split it, or raise the limit)"
        )


@dataclass
class TranslationResult:
    hypotheses: list[str]  # one per input line, in input order
    target_tokens: int  # generated tokens (EOS excluded), for tokens/s
    seconds: float  # decoding time (tokenization included, model load excluded)
    sentences: int  # non-empty lines actually decoded
    empty_outputs: int = 0  # non-empty lines whose translation is empty
    cut: list[int] = field(default_factory=list)  # 0-based lines whose output reached max_len: maybe cut

    @property
    def sentences_per_second(self) -> float:
        return self.sentences / self.seconds if self.seconds > 0 else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.target_tokens / self.seconds if self.seconds > 0 else 0.0


def translate(
    adapter: Seq2SeqAdapter,
    projection: Projection,
    lines: Sequence[str],
    src_lang: str,
    tgt_lang: str,
    search: SearchSettings = DEFAULT_SEARCH,
    *,
    progress: bool = True,
    workers: int | None = None,
    on_lines: Callable[[int], None] | None = None,
    pool: DecodePool | None = None,
) -> TranslationResult:
    """Translate ``lines`` (one sentence each): one output per line, in input order, with counts and timing.

    Languages are validated first (``ValueError`` naming the valid codes); empty or whitespace-only lines map
    to ``""`` without decoding; a line longer than ``search.max_input_tokens`` tokens is a ``ValueError``
    naming its (1-based) line number. ``search``: how the lines are decoded (``beam=1`` is greedy search).
    ``search.early_stopping``: beam search's stopping rule (True, False, "never"); None takes the model's
    generation config, as ``generate`` does. ``search.graphs``: "on" decodes each batch with the captured
    stepper (the whole step in CUDA graphs on CUDA, the same fixed-shape step eagerly on CPU; the same
    outputs; the static engine and a projection with a capturable step required), "off" with the eager one,
    "auto" with the captured one on CUDA where the step can be captured, else eagerly
    (:func:`fastvocab.decoding.steppers.use_graphs`). ``workers``: how many batches are decoded at once
    (:class:`~fastvocab.tasks.decode_pool.DecodePool`: forked processes on Linux); the outputs do not depend
    on it. ``pool``: a pool the caller keeps between calls (made over the same ``adapter`` and
    ``projection``; its ``workers`` and ``parallel`` then apply), instead of one made for this call: its
    workers are started once, not at every call. ``on_lines(n)`` is called as each batch of ``n``
    lines is done (a caller's own progress bar).
    """
    if search.early_stopping is not None:
        check_stopping_rule(search.early_stopping)
    captured = use_graphs(search.graphs, adapter, projection)
    adapter.check_language(src_lang)
    adapter.check_language(tgt_lang)
    beam, batch_size, max_len, max_input_tokens = (
        search.beam, search.batch_size, search.max_len, search.max_input_tokens,
    )  # fmt: skip
    if beam < 1 or batch_size < 1 or max_len < 1 or max_input_tokens < 1:
        raise ValueError(
            f"beam, batch_size, max_len and max_input_tokens must be >= 1 "
            f"(got {beam}, {batch_size}, {max_len}, {max_input_tokens})"
        )
    if beam > 1 and adapter.device.type == "cpu":
        # before the pool forks: its processes inherit the compiled step rather than each compiling it
        prepare_compiled_step()
    if pool is None:
        own = pool = DecodePool(adapter, projection, workers)
    else:
        own = None
        if pool.adapter is not adapter or pool.projection is not projection:
            raise ValueError("pool was made for another adapter or projection")
        if workers is not None:
            raise ValueError("pass workers to the pool, not with it")
    t0 = time.perf_counter()
    todo = [i for i, line in enumerate(lines) if line.strip()]
    seqs = adapter.tokenize([lines[i] for i in todo], src_lang, tgt_lang)
    for i, ids in zip(todo, seqs, strict=True):
        if len(ids) > max_input_tokens:
            raise LineTooLongError(i + 1, len(ids), max_input_tokens)
    # Longest first: padding stays small within a batch, and memory peaks show up at once, not at the end.
    order = sorted(range(len(todo)), key=lambda j: -len(seqs[j]))
    hypotheses = [""] * len(lines)
    tokens = 0
    cut: list[int] = []  # an output of max_len tokens has no EOS: the limit, not the model, ended it
    from tqdm.auto import tqdm

    bar = tqdm(
        total=len(todo),
        unit="sent",
        desc=f"{src_lang}-{tgt_lang}",
        disable=not progress or not sys.stderr.isatty(),
        file=sys.stderr,
    )
    chunks = length_batches([len(seqs[j]) for j in order], batch_size)
    chunks = [[order[i] for i in chunk] for chunk in chunks]
    # Tokenizer calls stay here; the workers only decode ids, and the pool yields them in batch order.
    batches = [[seqs[j] for j in chunk] for chunk in chunks]
    outputs = pool.outputs(batches, src_lang, tgt_lang, search, captured)
    try:
        with bar:
            for chunk, out in zip(chunks, outputs, strict=True):
                tokens += sum(len(s) for s in out)
                cut += [todo[j] for j, s in zip(chunk, out, strict=True) if len(s) >= max_len]
                for j, text in zip(chunk, adapter.decode_ids(out), strict=True):
                    hypotheses[todo[j]] = text
                bar.update(len(chunk))
                if on_lines is not None:
                    on_lines(len(chunk))
    finally:
        outputs.close()  # batches not yet started are dropped (after an error)
        if own is not None:
            own.close()
    seconds = time.perf_counter() - t0
    log.debug("translated %d lines (%d decoded) in %.2fs", len(lines), len(todo), seconds)
    empty = sum(1 for i in todo if not hypotheses[i].strip())
    return TranslationResult(hypotheses, tokens, seconds, len(todo), empty, sorted(cut))


# A sentence starts a new batch where it is shorter than this share of the batch's longest (sources of more
# than SPLIT_ABOVE_TOKENS tokens only). Every row of a batch attends over the longest source's padded length
# at every step, and the batch lasts as long as its longest output: on the en-it test split one line of 229
# tokens led a batch whose other lines had at most ~120, and that batch outlasted the other six together,
# holding up the worker that had it (docs/cpu-engine.md, 0010).
SPLIT_SHARE = 0.5
SPLIT_ABOVE_TOKENS = 32


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of at most ``batch_size`` positions of ``lengths`` (source lengths, longest first), in order:
    a batch also ends before a source shorter than ``SPLIT_SHARE`` of its longest, when that one has more
    than ``SPLIT_ABOVE_TOKENS`` tokens."""
    return length_runs(lengths, SPLIT_SHARE, SPLIT_ABOVE_TOKENS, batch_size)
