"""Bulk translation of sentences with any output-layer method, plus the file formats it reads and writes.

``translate`` is the unit of work behind ``fastvocab translate`` and the pipeline's translate stage:
validate the languages, tokenize everything once (a line longer than ``max_input_tokens`` is an error, never
silently cut), sort by length so batches waste little padding, decode batch by batch, restore input order.
Empty lines become empty outputs without touching the model.

On CPU the batches are decoded by parallel workers, one per torch thread (``decode_workers``): a decoder
step is many small ops that torch's intra-op threads share poorly. Demo model, 200 en-it test lines, batch
32, 2 threads (AMD EPYC, same outputs; benchmarks/results/engine-cpu-2026-11-23-evening.json): two workers
of one thread against one batch at a time on two threads, greedy full fp32 1.31x, beam 4 1.17x; clustered
int8 1.08x and 1.35x. CTranslate2 offers the same choice (``inter_threads``).
"""

from __future__ import annotations

import itertools
import logging
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from fastvocab.decoding import graphed
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import check_stopping_rule, decode
from fastvocab.kernels import create_projection
from fastvocab.kernels.base import Projection

log = logging.getLogger(__name__)


def make_projection(adapter: Seq2SeqAdapter, method: str = "full", **options: object) -> Projection:
    """Output-layer method ``method`` over the adapter's exact W and b; EOS and language tags always on."""
    return create_projection(
        method,
        adapter.output_weight,
        adapter.output_bias,
        always_active=adapter.always_active_ids(),
        fingerprint=adapter.fingerprint,
        **options,
    )


@dataclass(frozen=True)
class SearchSettings:
    """How sentences are decoded: search, batching and limits (``translate``'s keyword arguments)."""

    beam: int = 1  # 1 = greedy
    batch_size: int = 32
    max_len: int = 128  # max target tokens per sentence
    length_penalty: float = 1.0
    max_input_tokens: int = 256  # longer source lines are an error, never cut
    # beam search's stopping rule: True, False, "never" (decoding.search.beam_search); None: the model's
    early_stopping: bool | str | None = None


@dataclass
class TranslationResult:
    hypotheses: list[str]  # one per input line, in input order
    target_tokens: int  # generated tokens (EOS excluded), for tokens/s
    seconds: float  # decoding time (tokenization included, model load excluded)
    sentences: int  # non-empty lines actually decoded

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
    *,
    beam: int = 1,
    batch_size: int = 32,
    max_len: int = 128,
    length_penalty: float = 1.0,
    max_input_tokens: int = 256,
    early_stopping: bool | str | None = None,
    progress: bool = True,
    workers: int | None = None,
    graphs: bool = False,
) -> TranslationResult:
    """Translate ``lines`` (one sentence each): one output per line, in input order, with counts and timing.

    Languages are validated first (``ValueError`` naming the valid codes); empty or whitespace-only lines map
    to ``""`` without decoding; a line longer than ``max_input_tokens`` tokens is a ``ValueError`` naming its
    (1-based) line number. ``beam=1`` is greedy search. ``workers``: batches decoded at once, sharing
    ``torch.get_num_threads()`` threads (None: :func:`decode_workers`); the outputs do not depend on it.
    ``early_stopping``: beam search's stopping rule (True, False, "never"); None takes the model's generation
    config, as ``generate`` does. ``graphs``: each batch decoded with its whole step in CUDA graphs
    (:func:`fastvocab.decoding.graphed.decode`; the same outputs; not yet a CLI option: the GPU campaign
    measures it first).
    """
    if early_stopping is not None:
        check_stopping_rule(early_stopping)
    adapter.check_language(src_lang)
    adapter.check_language(tgt_lang)
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
            raise ValueError(
                f"line {i + 1} has {len(ids)} tokens, more than max_input_tokens={max_input_tokens} "
                "(split it, or raise the limit)"
            )
    # Longest first: padding stays small within a batch, and memory peaks show up at once, not at the end.
    order = sorted(range(len(todo)), key=lambda j: -len(seqs[j]))
    hypotheses = [""] * len(lines)
    tokens = 0
    from tqdm.auto import tqdm

    bar = tqdm(
        total=len(todo),
        unit="sent",
        desc=f"{src_lang}-{tgt_lang}",
        disable=not progress or not sys.stderr.isatty(),
        file=sys.stderr,
    )
    chunks = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    threads = torch.get_num_threads()
    workers = decode_workers(adapter, len(chunks), threads) if workers is None else max(1, workers)
    intra = max(1, threads // workers)

    def run(chunk: list[int]) -> list[list[int]]:
        with torch.inference_mode():  # thread-local: a worker thread must enter it itself
            return (graphed.decode if graphs else decode)(
                adapter,
                projection,
                adapter.pad([seqs[j] for j in chunk]),
                src_lang,
                tgt_lang,
                beam=beam,
                max_len=max_len,
                length_penalty=length_penalty,
                early_stopping=early_stopping,
            )

    # Tokenizer calls stay on this thread; the workers only decode ids. map() yields in submission order.
    # Each worker thread takes its share of the threads once (OpenMP's thread count is per thread).
    pool = (
        ThreadPoolExecutor(workers, initializer=torch.set_num_threads, initargs=(intra,))
        if workers > 1
        else None
    )
    outputs = pool.map(run, chunks) if pool else map(run, chunks)
    try:
        with bar:
            for chunk, out in zip(chunks, outputs, strict=True):
                tokens += sum(len(s) for s in out)
                for j, text in zip(chunk, adapter.decode_ids(out), strict=True):
                    hypotheses[todo[j]] = text
                bar.update(len(chunk))
    finally:
        if pool:
            pool.shutdown(cancel_futures=True)  # after an error, batches not yet started are dropped
            torch.set_num_threads(threads)  # MKL's thread count is process-wide: a worker's setting leaks
    seconds = time.perf_counter() - t0
    log.debug("translated %d lines (%d decoded) in %.2fs", len(lines), len(todo), seconds)
    return TranslationResult(hypotheses, tokens, seconds, len(todo))


def decode_workers(adapter: Seq2SeqAdapter, batches: int, threads: int) -> int:
    """How many batches to decode at once: one per thread on CPU (at most one per batch), else 1."""
    if adapter.device.type != "cpu":
        return 1  # an accelerator runs one batch's kernels at a time anyway
    return max(1, min(threads, batches))


# --------------------------------------------------------------------------- long inputs, in chunks

CHUNK_LINES = 10_000  # lines a chunk: the unit of memory, of progress kept after a kill, and of resume


def translate_text_file(
    adapter: Seq2SeqAdapter,
    projection: Projection,
    input_path: str | Path,
    output: str | Path,
    src_lang: str,
    tgt_lang: str,
    *,
    search: SearchSettings,
    setting: str,
    method: str,
    chunk_lines: int = CHUNK_LINES,
    progress: bool = True,
) -> TranslationResult:
    """Translate a text file of any length in chunks of ``chunk_lines`` lines, in bounded memory.

    Each finished chunk is written as a part beside ``output`` (``artifacts_schema.translations``); a rerun
    after a kill skips the parts whose plan (``setting``: what else decides the output, e.g. the projection's
    signature and dtype; the search settings; the chunk's lines) matches, and redoes a corrupt one. The output
    appears, atomically, only when every chunk is done (``method`` names the method in a Parquet output). The
    input must have been validated (UTF-8) before; the hypotheses are not returned (they are in ``output``).
    """
    from tqdm.auto import tqdm

    from fastvocab.artifacts_schema.digest import text_digest
    from fastvocab.artifacts_schema.translations import (
        assemble_parts,
        part_path,
        parts_dir,
        read_part,
        write_part,
    )

    if chunk_lines < 1:
        raise ValueError(f"chunk_lines must be >= 1, got {chunk_lines}")
    parts = parts_dir(output)
    total = sum(1 for _ in iter_text_lines(input_path))
    paths, plans = [], []
    tokens, sentences, seconds, reused = 0, 0, 0.0, 0
    bar = tqdm(
        total=total,
        unit="line",
        desc=f"{src_lang}-{tgt_lang}",
        disable=not progress or not sys.stderr.isatty(),
        file=sys.stderr,
    )
    lines = iter_text_lines(input_path)
    with bar:
        for index, start in enumerate(range(0, total, chunk_lines)):
            chunk = list(itertools.islice(lines, chunk_lines))
            plan = f"{setting}|{search}|{src_lang}-{tgt_lang}|lines {start}+{len(chunk)}|{text_digest(chunk)}"
            path = part_path(parts, index)
            paths.append(path)
            plans.append(plan)
            if path.exists() and read_part(path, plan) is not None:
                reused += 1
            else:
                res = translate(
                    adapter, projection, chunk, src_lang, tgt_lang, **asdict(search), progress=False
                )
                write_part(path, range(start, start + len(chunk)), chunk, res.hypotheses, plan)
                tokens, sentences, seconds = (
                    tokens + res.target_tokens,
                    sentences + res.sentences,
                    seconds + res.seconds,
                )
            bar.update(len(chunk))
    if reused:
        log.info("%s: %d of %d chunks were done by an earlier run", output, reused, len(paths))
    if not paths:  # an empty input: one empty part, so the output is assembled the same way
        paths.append(part_path(parts, 0))
        plans.append("empty")
        write_part(paths[0], [], [], [], "empty")
    assemble_parts(output, paths, plans, direction=f"{src_lang}-{tgt_lang}", method=method)
    return TranslationResult([], tokens, seconds, sentences)


# --------------------------------------------------------------------------- file formats


def is_parquet(path: str | Path) -> bool:
    """A ``.parquet`` file, or a folder (a Parquet dataset)."""
    path = Path(path)
    return path.suffix == ".parquet" or path.is_dir()


def iter_text_lines(path: str | Path) -> Iterator[str]:
    """A UTF-8 text file's lines (no line ends), streamed. Invalid UTF-8 is a ``ValueError`` naming file and
    line (raised when the iteration reaches it)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
                raw = raw[3:]
            part = raw.removesuffix(b"\n")  # the final newline ends the last line, it starts none
            try:
                yield part.decode("utf-8").removesuffix("\r")
            except UnicodeDecodeError as exc:
                byte, column = part[exc.start], exc.start + 1
                raise ValueError(
                    f"{path}: line {n}: invalid UTF-8 (byte 0x{byte:02x} at column {column})"
                ) from None


def read_text_lines(path: str | Path) -> list[str]:
    """A UTF-8 text file as lines (no line ends); see :func:`iter_text_lines`."""
    return list(iter_text_lines(path))


def read_parquet_column(
    path: str | Path, column: str, id_column: str | None = None
) -> tuple[list[str], list[int] | None]:
    """A string column of a Parquet file or dataset folder, and the ``id_column`` when present.

    Nulls read as empty strings (they translate to empty outputs).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input not found: {path}")
    try:
        schema = pq.read_schema(path) if path.is_file() else pq.ParquetDataset(path).schema
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"cannot read Parquet {path}: {exc}") from exc
    if column not in schema.names:
        raise ValueError(f"{path} has no column {column!r} (columns: {', '.join(schema.names)})")
    columns = [column] + ([id_column] if id_column and id_column in schema.names else [])
    try:
        table = pq.read_table(path, columns=columns)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"cannot read Parquet {path}: {exc}") from exc
    if not pa.types.is_string(table.schema.field(column).type) and not pa.types.is_large_string(
        table.schema.field(column).type
    ):
        raise ValueError(f"column {column!r} of {path} is {table.schema.field(column).type}, not a string")
    texts = [t if t is not None else "" for t in table.column(column).to_pylist()]
    ids = None
    if len(columns) == 2:
        ids = table.column(id_column).to_pylist()
        if any(i is None for i in ids):
            raise ValueError(f"column {id_column!r} of {path} has nulls")
        try:
            ids = [int(i) for i in ids]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"column {id_column!r} of {path} is not an integer id: {exc}") from exc
    return texts, ids
