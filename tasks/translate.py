"""Bulk translation of sentences with any output-layer method.

``translate`` is the unit of work behind ``fastvocab translate`` and the pipeline's translate stage:
validate the languages, tokenize everything once (a line longer than ``max_input_tokens`` is an error, never
silently cut), sort by length so batches waste little padding, decode batch by batch, restore input order.
Empty lines become empty outputs without touching the model.

On CPU the batches are decoded by parallel workers, one per torch thread (``decode_workers``): a decoder
step is many small ops that torch's intra-op threads share poorly, so one batch per thread is faster than
every thread on one batch (measured: docs/decisions/0002-worker-processes.md). On Linux the workers are
forked processes (``parallel``): worker threads of one process take turns at the GIL between those
small ops, which cost the clustered step, with its many more of them, the most (measured:
benchmarks/README.md, "Turning the sets into speed"). The ONNX Runtime engine's step is one call that
releases the GIL: from 32 rows a batch its workers are threads (docs/decisions/0010-batches-by-length.md).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.packed_encoder import length_runs
from fastvocab.decoding.search import check_stopping_rule, decode
from fastvocab.decoding.settings import DEFAULT_SEARCH, SearchSettings
from fastvocab.decoding.steppers import use_graphs
from fastvocab.kernels.base import Projection

log = logging.getLogger(__name__)

PARALLEL = ("auto", "processes", "threads")  # how CPU workers run (translate's ``parallel``)


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
    parallel: str = "auto",
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
    (:func:`fastvocab.decoding.steppers.use_graphs`). ``workers``: batches decoded at once, sharing
    ``torch.get_num_threads()`` threads (None: :func:`decode_workers`); the outputs do not depend on it.
    ``on_lines(n)`` is called as each batch of ``n`` lines is done (a caller's own progress bar).
    ``parallel``: how more than one worker runs: "processes" (forked copies of this process, which share its
    model and projection memory, and at one line a batch this process beside them; what they count, the
    projection's :meth:`~fastvocab.kernels.base.Projection.tally`, is added back to ``projection``),
    "threads", or "auto": processes on Linux, else threads (fork is unsafe on macOS, absent on Windows).
    """
    if search.early_stopping is not None:
        check_stopping_rule(search.early_stopping)
    captured = use_graphs(search.graphs, adapter, projection)
    adapter.check_language(src_lang)
    adapter.check_language(tgt_lang)
    if parallel not in PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
    beam, batch_size, max_len, max_input_tokens = (
        search.beam, search.batch_size, search.max_len, search.max_input_tokens,
    )  # fmt: skip
    if beam < 1 or batch_size < 1 or max_len < 1 or max_input_tokens < 1:
        raise ValueError(
            f"beam, batch_size, max_len and max_input_tokens must be >= 1 "
            f"(got {beam}, {batch_size}, {max_len}, {max_input_tokens})"
        )
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
    threads = torch.get_num_threads()
    workers = decode_workers(adapter, len(chunks), threads) if workers is None else max(1, workers)
    intra = max(1, threads // workers)

    def run(chunk: list[int]) -> list[list[int]]:
        with torch.inference_mode():  # thread-local: a worker thread must enter it itself
            batch = adapter.pad([seqs[j] for j in chunk])
            return decode(adapter, projection, batch, src_lang, tgt_lang, search, graphs=captured)

    # Tokenizer calls stay here; the workers only decode ids. map() yields in submission order. Each worker
    # takes its share of the threads once (OpenMP's thread count is per thread).
    kind = worker_kind(parallel, workers, adapter.engine, search.batch_size * search.beam)
    pool: ProcessPoolExecutor | ThreadPoolExecutor | None = None
    outputs: Iterable[list[list[int]]]
    if kind == "processes":
        # fork: the workers start as copies of this process (nothing pickled but batches and their ids).
        fork = multiprocessing.get_context("fork")
        adapter.open_sessions()  # inherited by the workers, not opened by each
        if batch_size <= CALLER_DECODES_UP_TO_BATCH:  # this process is one of them
            pool = ProcessPoolExecutor(workers - 1, fork, _start_forked_worker, (run, projection, intra))
            outputs = _shared_with_forks(pool, chunks, run, projection, intra)
        else:
            pool = ProcessPoolExecutor(workers, fork, _start_forked_worker, (run, projection, intra))
            outputs = _added_to(projection, pool.map(_decode_in_forked_worker, chunks))
    elif kind == "threads":
        pool = ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(intra,))
        outputs = pool.map(run, chunks)
    else:
        outputs = map(run, chunks)
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
        if pool:
            pool.shutdown(cancel_futures=True)  # after an error, batches not yet started are dropped
        if kind != "one":
            torch.set_num_threads(threads)  # MKL's thread count is process-wide: a worker's setting leaks
    seconds = time.perf_counter() - t0
    log.debug("translated %d lines (%d decoded) in %.2fs", len(lines), len(todo), seconds)
    empty = sum(1 for i in todo if not hypotheses[i].strip())
    return TranslationResult(hypotheses, tokens, seconds, len(todo), empty, sorted(cut))


# A sentence starts a new batch where it is shorter than this share of the batch's longest (sources of more
# than SPLIT_ABOVE_TOKENS tokens only). Every row of a batch attends over the longest source's padded length
# at every step, and the batch lasts as long as its longest output: on the en-it test split one line of 229
# tokens led a batch whose other lines had at most ~120, and that batch outlasted the other six together,
# holding up the worker that had it (docs/decisions/0010-batches-by-length.md).
SPLIT_SHARE = 0.5
SPLIT_ABOVE_TOKENS = 32


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Batches of at most ``batch_size`` positions of ``lengths`` (source lengths, longest first), in order:
    a batch also ends before a source shorter than ``SPLIT_SHARE`` of its longest, when that one has more
    than ``SPLIT_ABOVE_TOKENS`` tokens."""
    return length_runs(lengths, SPLIT_SHARE, SPLIT_ABOVE_TOKENS, batch_size)


# From this many rows a batch (batch size x beam), the ONNX Runtime engine's workers are threads: its step is
# one call that releases the GIL, and a thread costs no fork. The demo model, 2 workers, 200 en-it test
# lines (benchmarks/results/workers-cpu-2026-11-28-onnx-*.json): at batch 32 threads were 9-19% faster
# greedy and 2-10% at beam 4, full and clustered, float32 and int8; at batch 8 clustered int8 was 21% faster
# as processes (the ops between the calls take turns at the GIL).
ONNX_THREADS_FROM_ROWS = 32


def worker_kind(parallel: str, workers: int, engine: str = "static", rows: int = 1) -> str:
    """How ``workers`` CPU workers run under translate's ``parallel``: "processes", "threads" or "one".
    ``auto``: forked processes on Linux (threads elsewhere: fork is unsafe on macOS, absent on Windows),
    except threads for the ``onnx`` engine from ``ONNX_THREADS_FROM_ROWS`` rows a batch (``rows``)."""
    if workers <= 1:
        return "one"
    if parallel == "auto":
        if engine == "onnx" and rows >= ONNX_THREADS_FROM_ROWS:
            return "threads"
        return "processes" if sys.platform.startswith("linux") else "threads"
    return parallel


# Up to this many lines a batch, the calling process decodes batches beside its forked workers: one fork
# fewer (~15 ms for a ~900 MB process) and one worker's exit not waited for (~25 ms), which at one line a
# batch is a tenth of a 48-line run. A pool keeps a batch queued at each fork, which the caller cannot take
# back, so at the end the caller can wait for up to one batch: at batch 32 (~0.3 s a batch) the static
# engine ran 28-32% slower so (docs/decisions/0012-one-line-batches.md).
CALLER_DECODES_UP_TO_BATCH = 1

# A forked worker's decode function and projection (set once in each worker process by its initializer).
_FORKED: dict[str, object] = {}


def _start_forked_worker(
    run: Callable[[list[int]], list[list[int]]], projection: Projection, threads: int
) -> None:
    # The parent stops its workers: Ctrl-C reaches the whole process group, and the handlers a caller
    # installed are for the caller alone. A worker would outlive a killed parent, blocked on the pool's
    # queue, whose write end it holds itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    torch.set_num_threads(threads)
    _FORKED.update(run=run, projection=projection)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that forked it ends (prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _decode_in_forked_worker(chunk: list[int]) -> tuple[list[list[int]], dict[str, float]]:
    """One batch's ids, and what the worker's copy of the projection counted over it."""
    run, projection = _FORKED["run"], _FORKED["projection"]
    before = projection.tally()  # type: ignore[attr-defined]
    out = run(chunk)  # type: ignore[operator]
    after = projection.tally()  # type: ignore[attr-defined]
    return out, {key: after[key] - before[key] for key in after}


def _added_to(
    projection: Projection, results: Iterable[tuple[list[list[int]], dict[str, float]]]
) -> Iterator[list[list[int]]]:
    for out, added in results:
        projection.add_tally(added)
        yield out


def _shared_with_forks(
    pool: ProcessPoolExecutor,
    chunks: list[list[int]],
    run: Callable[[list[int]], list[list[int]]],
    projection: Projection,
    threads: int,
) -> Iterator[list[list[int]]]:
    """Each chunk's ids, in order: the forked workers take chunks from the front, and this process, while
    the next chunk in order is not back, decodes chunks from the back that no worker has started (a
    submitted chunk can be cancelled until the pool hands it to a worker). What the workers' projections
    counted is added to ``projection``; this process counts in it directly."""
    futures = [pool.submit(_decode_in_forked_worker, chunk) for chunk in chunks]
    here: dict[int, list[list[int]]] = {}
    back = len(chunks) - 1
    torch.set_num_threads(threads)  # this worker's share (translate sets the count back)
    for i, future in enumerate(futures):
        while i <= back and not future.done() and futures[back].cancel():
            here[back] = run(chunks[back])
            back -= 1
        if i in here:
            yield here.pop(i)
            continue
        out, added = future.result()
        projection.add_tally(added)
        yield out


def decode_workers(adapter: Seq2SeqAdapter, batches: int, threads: int) -> int:
    """How many batches to decode at once: one per thread on CPU (at most one per batch), else 1."""
    if adapter.device.type != "cpu":
        return 1  # an accelerator runs one batch's kernels at a time anyway
    return max(1, min(threads, batches))
