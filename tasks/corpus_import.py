"""A user's own text as corpus files: a parallel TSV or Parquet file becomes a pair's train/dev/test files
(through the same de-duplication and document split as the Debian pairs, ``tasks.corpus``), and a
monolingual text file becomes a language's monolingual file (``mono/<lang>.parquet``) for the dump."""

from __future__ import annotations

import array
import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab import switches
from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.corpus import (
    MONO_SCHEMA,
    mono_path,
    read_manifest,
    update_manifest,
    valid_file,
)
from fastvocab.tasks.corpus import (
    MonoResult,
    PairResult,
    Row,
    first_occurrences,
    line_key,
    now_utc,
    split_build,
    up_to_date_pair,
    write_pair,
)
from fastvocab.tasks.debian_translations import CorpusError, check_lang, normalise


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _decoded_lines(path: Path) -> Iterable[tuple[int, str]]:
    """``(line number, text without its line end)``; invalid UTF-8 is an error naming the line."""
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.rstrip(b"\r\n").decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{path}:{n}: invalid UTF-8 at byte {exc.start + 1} of the line") from exc
            yield n, text.removeprefix("\ufeff") if n == 1 else text


def iter_parallel_tsv(path: str | Path) -> Iterator[Row]:
    """Rows of a two-column TSV file, streamed: ``id`` and ``doc_id`` are the line number (no grouping).

    Every line must hold exactly one tab and two non-empty columns; the first bad line is an error.
    """
    path = Path(path)
    empty = True
    for n, text in _decoded_lines(path):
        tabs = text.count("\t")
        if tabs != 1:
            raise CorpusError(f"{path}:{n}: expected two tab-separated columns (one tab), found {tabs} tabs")
        src, tgt = (normalise(col) for col in text.split("\t"))
        if not src or not tgt:
            raise CorpusError(f"{path}:{n}: empty {'first' if not src else 'second'} column")
        empty = False
        yield (n, str(n), src, tgt)
    if empty:
        raise CorpusError(f"{path}: empty file")


def iter_parallel_parquet(
    path: str | Path, src_col: str, tgt_col: str, doc_col: str | None = None
) -> Iterator[Row]:
    """Rows of a Parquet file's two text columns, streamed batch by batch: ``id`` is the row index,
    ``doc_id`` the ``doc_col`` value (documents are kept whole in one split) or the row index."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise CorpusError(f"{path}: not a readable Parquet file ({exc})") from exc
    schema = pf.schema_arrow
    columns = [src_col, tgt_col] + ([doc_col] if doc_col else [])
    for col in columns:
        if col not in schema.names:
            raise CorpusError(f"{path}: no column {col!r} (columns: {', '.join(schema.names)})")
    for col in (src_col, tgt_col):
        if not (
            pa.types.is_string(schema.field(col).type) or pa.types.is_large_string(schema.field(col).type)
        ):
            raise CorpusError(f"{path}: column {col!r} is {schema.field(col).type}, not text")
    i = -1
    for batch in pf.iter_batches(columns=columns):
        data = batch.to_pydict()
        docs = data[doc_col] if doc_col else [None] * batch.num_rows
        for s, t, d in zip(data[src_col], data[tgt_col], docs, strict=True):
            i += 1
            s, t = normalise(s or ""), normalise(t or "")
            if not s or not t:
                raise CorpusError(f"{path}: row {i}: empty or null {src_col if not s else tgt_col!r}")
            if doc_col and d is None:
                raise CorpusError(f"{path}: row {i}: null {doc_col!r}")
            yield (i, str(d) if doc_col else str(i), s, t)
    if i < 0:
        raise CorpusError(f"{path}: no rows")


@dataclass(frozen=True)
class ParallelFile:
    """A user's parallel file: ``fmt`` "tsv" (source, target and optional document columns, tab-separated)
    or "parquet" (its ``src_col`` and ``tgt_col``, both required, and optional ``doc_col``)."""

    path: str | Path
    fmt: str
    src_col: str | None = None
    tgt_col: str | None = None
    doc_col: str | None = None


def import_parallel(
    out_dir: str | Path,
    parallel: ParallelFile,
    src_lang: str,
    tgt_lang: str,
    *,
    pivot: str = "en",
    dev_size: int = 1000,
    test_size: int = 1000,
    seed: int = 0,
    force: bool = False,
) -> PairResult:
    """Import a user's parallel file (``parallel``) as one pair, split like the Debian pairs.

    The pair is stored pivot first (``--src-lang it --tgt-lang en`` lands in ``en-it`` with the columns
    swapped); readers swap back for the it -> en direction.
    """
    out_dir, path = Path(out_dir), Path(parallel.path)
    fmt, src_col, tgt_col, doc_col = parallel.fmt, parallel.src_col, parallel.tgt_col, parallel.doc_col
    src_lang, tgt_lang = check_lang(src_lang), check_lang(tgt_lang)
    if src_lang == tgt_lang:
        raise CorpusError(f"source and target language are both {src_lang!r}")
    if fmt == "parquet" and not (src_col and tgt_col):
        raise CorpusError("a Parquet import needs --src-col and --tgt-col")
    if fmt not in ("tsv", "parquet"):
        raise ValueError(f"unknown parallel format {fmt!r}; valid: parquet, tsv")
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    swap = tgt_lang == pivot
    lang1, lang2 = (tgt_lang, src_lang) if swap else (src_lang, tgt_lang)
    columns = {"src_col": src_col, "tgt_col": tgt_col, "doc_col": doc_col} if fmt == "parquet" else {}
    build = {"source": fmt, "sha256": _sha256(path), "swapped": swap, **columns}
    build.update(split_build(dev_size, test_size, seed))
    if not force and (result := up_to_date_pair(out_dir, lang1, lang2, build)):
        return result

    def rows() -> Iterator[Row]:
        if fmt == "tsv":
            read = iter_parallel_tsv(path)
        else:
            read = iter_parallel_parquet(path, src_col or "", tgt_col or "", doc_col)
        return ((i, d, t, s) for i, d, s, t in read) if swap else read

    source = {"kind": fmt, "path": str(path.resolve()), "src_lang": src_lang, "tgt_lang": tgt_lang, **columns}
    return write_pair(out_dir, lang1, lang2, rows, build=build, source=source, stats={})


def _mono_first_lines(path: Path, stats: dict[str, int]) -> np.ndarray:
    """Pass 1 of the monolingual import: a bool per line, True for the first copy of each non-empty line."""
    buf = array.array("Q")  # 8 bytes a line, over-allocating little as it grows
    for _, raw in _decoded_lines(path):
        text = normalise(raw)
        buf.append(line_key(text) if text else 0)
    keys = np.frombuffer(buf, dtype=np.uint64)
    blank = keys == 0  # an empty line; a text whose key is 0 (p = 2^-64) would be taken for one
    keep = first_occurrences(keys, skip=blank)
    stats.update(lines=len(keys), empty=int(blank.sum()), duplicates_removed=int((~blank).sum() - keep.sum()))
    return keep


def import_mono(out_dir: str | Path, path: str | Path, lang: str, *, force: bool = False) -> MonoResult:
    """Import a monolingual text file (one sentence a line) into ``<out_dir>/mono/<lang>.parquet``.

    Lines are whitespace-normalised; empty lines and repeated sentences are left out; ``id`` is the line
    number. Two streaming passes over the file (find first occurrences, then write), so memory holds one
    batch of lines plus 9 bytes a line, whatever the file's size.
    """
    out_dir, path = Path(out_dir), Path(path)
    lang = check_lang(lang)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    build = {"source": "text", "sha256": _sha256(path)}
    target = mono_path(out_dir, lang)
    record = read_manifest(out_dir)["mono"].get(lang)
    if (
        not force
        and record
        and record.get("build") == build
        and valid_file(target, MONO_SCHEMA, record.get("count", -1))
    ):
        return MonoResult(lang, record["count"], record.get("stats", {}), skipped=True)
    stats: dict[str, int] = {}
    keep = _mono_first_lines(path, stats)
    count = int(keep.sum())
    if not count:
        raise CorpusError(f"{path}: no non-empty lines")
    batch_rows = switches.CORPUS_BATCH_ROWS.get()
    with atomic_path(target) as tmp, pq.ParquetWriter(tmp, MONO_SCHEMA) as writer:
        ids: list[int] = []
        texts: list[str] = []
        for n, raw in _decoded_lines(path):
            if keep[n - 1]:
                ids.append(n)
                texts.append(normalise(raw))
                if len(ids) == batch_rows:
                    writer.write_table(pa.table([ids, texts], schema=MONO_SCHEMA))
                    ids, texts = [], []
        if ids:
            writer.write_table(pa.table([ids, texts], schema=MONO_SCHEMA))
    source = {"kind": "text", "path": str(path.resolve())}
    update_manifest(
        out_dir,
        "mono",
        lang,
        {"build": build, "source": source, "count": count, "stats": stats, "created": now_utc()},
    )
    return MonoResult(lang, count, stats)
