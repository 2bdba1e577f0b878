"""The workers that decode :func:`~fastvocab.tasks.translate.translate`'s batches, which a caller may keep.

On CPU the batches are decoded by parallel workers, one per torch thread (:func:`decode_workers`): a decoder
step is many small ops that torch's intra-op threads share poorly, so one batch per thread is faster than
every thread on one batch (measured: docs/decisions/0002-worker-processes.md). On Linux the workers are
forked processes (``parallel``): worker threads of one process take turns at the GIL between those small
ops, which cost the clustered step, with its many more of them, the most (measured: benchmarks/README.md,
"Turning the sets into speed"). The ONNX Runtime engine's step is one call that releases the GIL: from 32
rows a batch its workers are threads (docs/cpu-engine.md, 0010).

Forking a worker and waiting for it to end cost ~35 ms, which at one line a batch is a sixth of a 48-line
run (docs/cpu-engine.md, 0014). ``translate`` makes a :class:`DecodePool` for one call and closes
it after; a caller that translates again and again (a service, a benchmark) keeps one and passes it
(``translate(..., pool=pool)``), as CTranslate2's ``Translator`` keeps its ``inter_threads`` workers from
its construction.
"""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor

import torch

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import decode
from fastvocab.decoding.settings import SearchSettings
from fastvocab.kernels.base import Projection

PARALLEL = ("auto", "processes", "threads")  # how CPU workers run (translate's ``parallel``)

# From this many rows a batch (batch size x beam), the ONNX Runtime engine's workers are threads: its step is
# one call that releases the GIL, and a thread costs no fork. The demo model, 2 workers, 200 en-it test
# lines (benchmarks/results/workers-cpu-2026-11-28-onnx-*.json): at batch 32 threads were 9-19% faster
# greedy and 2-10% at beam 4, full and clustered, float32 and int8; at batch 8 clustered int8 was 21% faster
# as processes (the ops between the calls take turns at the GIL).
ONNX_THREADS_FROM_ROWS = 32

# Up to this many lines a batch, the calling process decodes batches beside its forked workers: one fork
# fewer (~15 ms for a ~900 MB process) and one worker's exit not waited for (~25 ms). A pool keeps a batch
# queued at each fork, which the caller cannot take back, so at the end the caller can wait for up to one
# batch: at batch 32 (~0.3 s a batch) the static engine ran 28-32% slower so
# (docs/cpu-engine.md, 0012).
CALLER_DECODES_UP_TO_BATCH = 1


def decode_workers(adapter: Seq2SeqAdapter, batches: int, threads: int) -> int:
    """How many batches to decode at once: one per thread on CPU (at most one per batch), else 1."""
    if adapter.device.type != "cpu":
        return 1  # an accelerator runs one batch's kernels at a time anyway
    return max(1, min(threads, batches))


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


Batch = list[list[int]]  # a batch's source token ids, one list a sentence
Job = tuple[str, str, SearchSettings, bool]  # what every batch of a call is decoded with (decode_ids's)


def decode_ids(
    adapter: Seq2SeqAdapter,
    projection: Projection,
    seqs: Batch,
    src_lang: str,
    tgt_lang: str,
    search: SearchSettings,
    graphs: bool,
) -> Batch:
    """One batch's output ids: what every kind of worker runs."""
    with torch.inference_mode():  # thread-local: a worker thread must enter it itself
        return decode(adapter, projection, adapter.pad(seqs), src_lang, tgt_lang, search, graphs=graphs)


class DecodePool:
    """Up to ``workers`` workers that decode batches with ``adapter`` and ``projection``, kept between calls.

    ``workers``: batches decoded at once, sharing ``torch.get_num_threads()`` threads (None: one a thread on
    CPU, :func:`decode_workers`); a call with fewer batches uses fewer. ``parallel``: "processes" (forked
    copies of this process, which share its model and projection memory; at one line a batch this process
    decodes beside them; what they count, the projection's
    :meth:`~fastvocab.kernels.base.Projection.tally`, is added back to ``projection``), "threads", or
    "auto": processes on Linux, else threads (fork is unsafe on macOS, absent on Windows), and threads for
    the ``onnx`` engine from ``ONNX_THREADS_FROM_ROWS`` rows a batch.

    A forked worker holds ``adapter`` and ``projection`` as they were at its fork: after changing either
    (``quantize_int8``, another map), close the pool and make another. The workers start at the first call
    that needs them and last until :meth:`close` (or the ``with`` block's end); a call whose batches need
    another kind or count of workers replaces them. One call at a time: threads that translate at once each
    keep a pool of their own.
    """

    def __init__(
        self,
        adapter: Seq2SeqAdapter,
        projection: Projection,
        workers: int | None = None,
        parallel: str = "auto",
    ) -> None:
        if parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {', '.join(PARALLEL)}, got {parallel!r}")
        self.adapter, self.projection, self.parallel = adapter, projection, parallel
        self.workers = workers
        self._executor: Executor | None = None
        self._shape: tuple[str, int, int] | None = None  # the executor's kind, worker count, threads each
        self._forker: threading.Thread | None = None  # the thread that forked the workers

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the workers (batches not yet started are dropped)."""
        if self._executor is not None:
            self._executor.shutdown(cancel_futures=True)
        self._executor = self._shape = self._forker = None

    def outputs(
        self,
        batches: Sequence[Batch],
        src_lang: str,
        tgt_lang: str,
        search: SearchSettings,
        graphs: bool = False,
    ) -> Generator[Batch, None, None]:
        """Each batch's output ids, in order, as the workers finish them."""
        threads = torch.get_num_threads()
        cap = decode_workers(self.adapter, len(batches), threads)
        workers = cap if self.workers is None else max(1, min(self.workers, len(batches)))
        rows = search.batch_size * search.beam
        kind = worker_kind(self.parallel, workers, self.adapter.engine, rows)
        args: Job = (src_lang, tgt_lang, search, graphs)
        if kind == "one":
            yield from (decode_ids(self.adapter, self.projection, b, *args) for b in batches)
            return
        intra = max(1, threads // workers)
        try:
            if kind == "threads":
                pool = self._ready("threads", workers, intra)
                yield from pool.map(lambda b: decode_ids(self.adapter, self.projection, b, *args), batches)
            elif search.batch_size <= CALLER_DECODES_UP_TO_BATCH:  # this process is one of them
                pool = self._ready("processes", workers - 1, intra, rows)
                yield from self._shared_with_forks(pool, batches, args, intra)
            else:
                pool = self._ready("processes", workers, intra, rows)
                yield from self._from_forks(pool, batches, args)
        finally:
            torch.set_num_threads(threads)  # MKL's thread count is process-wide: a worker's setting leaks

    def _ready(self, kind: str, workers: int, intra: int, rows: int = 1) -> Executor:
        """The executor of ``workers`` workers of ``kind``, ``intra`` threads each: the kept one, or anew.
        ``rows``: the most rows a step of the job has (a batch times its beam)."""
        forker_gone = self._forker is not None and not self._forker.is_alive()  # its forks were killed
        if self._executor is None or self._shape != (kind, workers, intra) or forker_gone:
            self.close()
            if kind == "threads":
                per_thread = torch.set_num_threads
                self._executor = ThreadPoolExecutor(workers, initializer=per_thread, initargs=(intra,))
            else:
                # fork: the workers start as copies of this process (nothing pickled but batches and ids).
                self.adapter.open_sessions()  # inherited by the workers, not opened by each
                self.projection.open_sessions(rows)  # the same for the sessions its steps of many rows run
                fork = multiprocessing.get_context("fork")
                inherited = (self.adapter, self.projection, intra)
                self._executor = ProcessPoolExecutor(workers, fork, _start_forked_worker, inherited)
                self._forker = threading.current_thread()
            self._shape = (kind, workers, intra)
        return self._executor

    def _from_forks(self, pool: Executor, batches: Sequence[Batch], args: Job) -> Iterator[Batch]:
        futures = self._submit(pool, batches, args)
        try:
            for future in futures:
                yield self._added(future)
        finally:
            _cancel(futures)

    def _shared_with_forks(
        self, pool: Executor, batches: Sequence[Batch], args: Job, threads: int
    ) -> Iterator[Batch]:
        """Each batch's ids, in order: the forked workers take batches from the front, and this process,
        while the next batch in order is not back, decodes batches from the back that no worker has started
        (a submitted batch can be cancelled until the pool hands it to a worker). This process counts in
        ``projection`` directly."""
        futures = self._submit(pool, batches, args)
        here: dict[int, Batch] = {}
        back = len(batches) - 1
        torch.set_num_threads(threads)  # this worker's share (outputs() sets the count back)
        try:
            for i, future in enumerate(futures):
                while i <= back and not future.done() and futures[back].cancel():
                    here[back] = decode_ids(self.adapter, self.projection, batches[back], *args)
                    back -= 1
                yield here.pop(i) if i in here else self._added(future)
        finally:
            _cancel(futures)

    def _submit(self, pool: Executor, batches: Sequence[Batch], args: Job) -> list[Future]:
        """Every batch to the forked workers, with the caller's current ``time_steps`` setting."""
        return [pool.submit(_decode_in_forked_worker, b, *args, self.projection.timing) for b in batches]

    def _added(self, future: Future) -> Batch:
        out, added = future.result()
        self.projection.add_tally(added)
        return out


def _cancel(futures: list[Future]) -> None:
    """After an error or an abandoned call, drop the batches no worker has started: a kept pool's next call
    does not wait behind them."""
    for f in futures:
        f.cancel()


# A forked worker's model and projection (set once in each worker process by its initializer).
_FORKED: dict[str, object] = {}


def _start_forked_worker(adapter: Seq2SeqAdapter, projection: Projection, threads: int) -> None:
    # The parent stops its workers: Ctrl-C reaches the whole process group, and the handlers a caller
    # installed are for the caller alone. A worker would outlive a killed parent, blocked on the pool's
    # queue, whose write end it holds itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    torch.set_num_threads(threads)
    _FORKED.update(adapter=adapter, projection=projection)


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that forked it ends (prctl PR_SET_PDEATHSIG)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _decode_in_forked_worker(
    seqs: Batch, src_lang: str, tgt_lang: str, search: SearchSettings, graphs: bool, timing: bool
) -> tuple[Batch, dict[str, float]]:
    """One batch's ids, and what the worker's copy of the projection counted over it (timing its steps as
    the caller's projection does now, which may have changed since the fork)."""
    adapter, projection = _FORKED["adapter"], _FORKED["projection"]
    if projection.timing != timing:  # type: ignore[attr-defined]
        projection.time_steps(timing)  # type: ignore[attr-defined]
    before = projection.tally()  # type: ignore[attr-defined]
    out = decode_ids(adapter, projection, seqs, src_lang, tgt_lang, search, graphs)  # type: ignore[arg-type]
    after = projection.tally()  # type: ignore[attr-defined]
    return out, {key: after[key] - before[key] for key in after}
