"""Bulk translation of sentences with any output-layer method, plus the file formats it reads and writes.

``translate`` is the unit of work behind ``fastvocab translate`` and the pipeline's translate stage:
validate the languages, tokenize everything once (a line longer than ``max_input_tokens`` is an error, never
silently cut), sort by length so batches waste little padding, decode batch by batch, restore input order.
Empty lines become empty outputs without touching the model.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import beam_search, greedy_search
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
    progress: bool = True,
) -> TranslationResult:
    """Translate ``lines`` (one sentence each): one output per line, in input order, with counts and timing.

    Languages are validated first (``ValueError`` naming the valid codes); empty or whitespace-only lines map
    to ``""`` without decoding; a line longer than ``max_input_tokens`` tokens is a ``ValueError`` naming its
    (1-based) line number. ``beam=1`` is greedy search.
    """
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
    with bar, torch.inference_mode():
        for start in range(0, len(order), batch_size):
            chunk = order[start : start + batch_size]
            batch = adapter.pad([seqs[j] for j in chunk])
            if beam == 1:
                out = greedy_search(adapter, projection, batch, src_lang, tgt_lang, max_len=max_len)
            else:
                out = beam_search(
                    adapter,
                    projection,
                    batch,
                    src_lang,
                    tgt_lang,
                    beam=beam,
                    max_len=max_len,
                    length_penalty=length_penalty,
                )
            tokens += sum(len(s) for s in out)
            for j, text in zip(chunk, adapter.decode_ids(out), strict=True):
                hypotheses[todo[j]] = text
            bar.update(len(chunk))
    seconds = time.perf_counter() - t0
    log.debug("translated %d lines (%d decoded) in %.2fs", len(lines), len(todo), seconds)
    return TranslationResult(hypotheses, tokens, seconds, len(todo))


# --------------------------------------------------------------------------- file formats


def is_parquet(path: str | Path) -> bool:
    """A ``.parquet`` file, or a folder (a Parquet dataset)."""
    path = Path(path)
    return path.suffix == ".parquet" or path.is_dir()


def read_text_lines(path: str | Path) -> list[str]:
    """A UTF-8 text file as lines (no line ends). Invalid UTF-8 is a ``ValueError`` naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    raw = path.read_bytes()
    if raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
        raw = raw[3:]
    parts = raw.split(b"\n")
    if parts and parts[-1] == b"":  # final newline ends the last line, it does not start a new one
        parts.pop()
    lines = []
    for n, part in enumerate(parts, start=1):
        try:
            lines.append(part.decode("utf-8").removesuffix("\r"))
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"{path}: line {n}: invalid UTF-8 (byte 0x{part[exc.start]:02x} at column {exc.start + 1})"
            ) from None
    return lines


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
