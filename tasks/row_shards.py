"""Row ranges of Parquet files, planned from the files alone: the driver never holds the texts.

:func:`plan_ranges` is the one planner: it streams a file's rows once and digests each range's
``id<TAB>text<LF>`` lines. The dump and stream shards are planned with it (below), and so are bulk
translation's parts (:mod:`fastvocab.tasks.bulk`); a worker reads its own range (:func:`read_range`) and
checks it against the digest.

A direction's sample is the first ``dump.sentences`` (+ ``dump.stream_sentences``) rows of one Parquet file
(a pair's split, or a language's monolingual file; ``artifacts_schema.corpus``), so shard ``i`` is the row
range ``[start, stop)`` of that file. The driver streams the file once, a batch at a time, to compute each
range's ``sentences_digest`` (the same digest :meth:`~fastvocab.tasks.dump.ShardSpec.plan` takes over the
shard's ``id<TAB>text`` lines), and sends workers a :class:`RowRangeSpec`: path, columns, range and digest,
a few hundred bytes whatever the shard's text. The worker reads its rows itself (:meth:`RowRangeSpec.load`),
checks them against the digest, and decodes the resulting :class:`~fastvocab.tasks.dump.ShardSpec`.

The plan a shard records is the one an in-memory :class:`ShardSpec` of the same rows gives, so shards
written before row-range planning are current under it and resume as they are. Memory on the driver: one
batch of the file plus one small spec per shard.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from fastvocab import switches
from fastvocab.artifacts_schema.corpus import direction_file, mono_file
from fastvocab.artifacts_schema.digest import Digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.tasks.dump import DumpSettings, ShardSpec


@dataclass(frozen=True)
class SampleFile:
    """Where a direction's source sentences are: a Parquet file, its id and text columns, its row count."""

    path: Path
    id_column: str
    text_column: str
    rows: int
    reference_column: str | None = None  # each line's reference translation (null where it has none)


def sample_file(corpus_dir: str | Path, direction: str, split: str) -> SampleFile:
    """The file holding ``direction``'s source sentences of ``split`` (``mono``: the monolingual file).

    Only the Parquet footer is read. ArtifactError naming what is present when the file is missing.
    """
    src, _, tgt = direction.partition("-")
    if split == "mono":
        path, text = mono_file(corpus_dir, src), "text"
    else:
        path, swap = direction_file(corpus_dir, src, tgt, split)
        text = "text2" if swap else "text1"
    try:
        meta = pq.ParquetFile(path).metadata
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt corpus file {path}: {exc}") from exc
    return SampleFile(Path(path).resolve(), "id", text, meta.num_rows)


@dataclass(frozen=True)
class RowRangeSpec:
    """One unit of dump (or stream) work as rows ``[start, stop)`` of a corpus file (no texts)."""

    direction: str
    index: int
    path: str  # the corpus Parquet file, as the workers see it (a shared volume on a cluster)
    id_column: str
    text_column: str
    start: int
    stop: int
    sentences_digest: str  # digest of the rows' "id<TAB>text<LF>" lines, as ShardSpec.plan computes it
    max_states: int | None = None
    # the reference path's input: the rows' reference column and the digest of its "id<TAB>reference<LF>"
    # lines (a missing reference read as "")
    reference_column: str | None = None
    references_digest: str | None = None

    @property
    def sentences(self) -> int:
        return self.stop - self.start

    def plan(self, settings: DumpSettings) -> dict[str, object]:
        """The shard's plan, compared on resume: what :meth:`ShardSpec.plan` gives for the same rows."""
        # ShardSpec.plan stays the one definition of a plan; only its sentences come from the rows here
        plan = ShardSpec(self.direction, self.index, (), (), self.max_states).plan(settings)
        plan.update(sentences=self.sentences, sentences_digest=self.sentences_digest)
        if "references_digest" in plan:
            if self.references_digest is None:
                raise ValueError(f"shard {self.index} of {self.direction} was planned without its references")
            plan["references_digest"] = self.references_digest
        return plan

    def load(self) -> ShardSpec:
        """Read the rows (on the worker) and return the in-memory spec; ArtifactError when the file changed
        since the shard was planned (other rows, or fewer)."""
        ids, texts = self._read(self.text_column, self.sentences_digest)
        refs = None
        if self.reference_column is not None and self.references_digest is not None:
            refs = tuple(self._read(self.reference_column, self.references_digest, allow_nulls=True)[1])
        return ShardSpec(self.direction, self.index, tuple(ids), tuple(texts), self.max_states, refs)

    def _read(self, column: str, planned: str, allow_nulls: bool = False) -> tuple[list, list[str]]:
        ids, texts, digest = read_range(
            Path(self.path), self.id_column, column, self.start, self.stop, allow_nulls=allow_nulls
        )
        if len(ids) != self.sentences or digest != planned:
            raise ArtifactError(
                f"{self.path}: rows {self.start}-{self.stop} of column {column} changed since the "
                f"{self.direction} dump was planned ({len(ids)} rows read, digest {digest}, planned "
                f"{planned}); rerun the stage to plan again"
            )
        return ids, texts


def as_shard_spec(spec: ShardSpec | RowRangeSpec) -> ShardSpec:
    """The in-memory spec a worker decodes: a row-range spec is read from its file, a ShardSpec is itself."""
    return spec.load() if isinstance(spec, RowRangeSpec) else spec


def _lines_bytes(ids: pa.Array, texts: pa.Array) -> memoryview:
    """UTF-8 bytes of ``"".join(f"{i}\\t{t}\\n")`` over the rows, built by Arrow (no Python strings)."""
    if len(ids) == 0:
        return memoryview(b"")
    # large_string throughout: 64-bit offsets, and one type whatever the id's and the text's types
    big = pa.large_string()
    lines = pc.binary_join_element_wise(pc.cast(ids, big), pc.cast(texts, big), pa.scalar("\t", big))
    lines = pc.binary_join_element_wise(lines, pa.scalar("", big), pa.scalar("\n", big))  # each ends in LF
    if lines.null_count:
        raise ArtifactError("null text in a Parquet file")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int64)[lines.offset : lines.offset + len(lines) + 1]
    return memoryview(lines.buffers()[2])[int(offsets[0]) : int(offsets[-1])]


def _iter_rows(path: Path, columns: list[str], start: int, stop: int) -> Iterator[tuple[int, pa.RecordBatch]]:
    """``(first row, batch)`` covering rows ``[start, stop)`` of ``path`` (row groups before ``start`` are
    skipped from the footer, batches are cut to the range); one batch in memory at a time."""
    try:
        pf = pq.ParquetFile(path)
        missing = [c for c in columns if c not in pf.schema_arrow.names]
        if missing:
            raise ArtifactError(f"Parquet file {path} lacks columns {missing}")
        groups: list[int] = []  # row groups overlapping the range
        first, offset = 0, 0  # the first one's first row; the running row count
        for g in range(pf.metadata.num_row_groups):
            n = pf.metadata.row_group(g).num_rows
            if offset + n > start and offset < stop:
                first = first if groups else offset
                groups.append(g)
            offset += n
        if not groups:
            return
        row = first
        # one row group at a time: asked for many, Arrow pre-buffers all their column chunks (the whole file)
        batch_rows = switches.READ_BATCH_ROWS.get()  # rows decoded from the file at a time
        for g in groups:
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=columns):
                lo, hi = max(start - row, 0), min(stop - row, batch.num_rows)
                if lo < hi:
                    yield row + lo, batch.slice(lo, hi - lo)
                row += batch.num_rows
                if row >= stop:
                    return
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt Parquet file {path}: {exc}") from exc


@dataclass(frozen=True)
class PlannedRange:
    """Rows ``[start, stop)`` of a Parquet file and the digest of their ``id<TAB>text<LF>`` lines."""

    start: int
    stop: int
    digest: str
    nulls: int = 0  # null texts in the range (read as "" when the planner was asked to allow them)


def _batch_lines(
    batch: pa.RecordBatch, row: int, id_column: str | None, allow_nulls: bool
) -> tuple[pa.Array, pa.Array, int]:
    """(ids, texts, null texts) of a batch read with :func:`_range_columns`' columns, ``row`` its first row's
    id when there is no id column (the rows' numbers then serve as ids); a null text is an ArtifactError
    unless ``allow_nulls`` (then it reads as ``""``)."""
    texts = batch.column(batch.num_columns - 1)
    nulls = texts.null_count
    if nulls and allow_nulls:
        texts = pc.fill_null(texts, "")
    if id_column is None:
        ids: pa.Array = pa.array(np.arange(row, row + batch.num_rows, dtype=np.int64))
    else:
        ids = batch.column(0)
        if ids.null_count:
            raise ArtifactError(f"null id in column {id_column!r}")
    return ids, texts, nulls


def _range_columns(id_column: str | None, text_column: str) -> list[str]:
    return [text_column] if id_column is None else [id_column, text_column]


def plan_ranges(
    path: Path,
    id_column: str | None,
    text_column: str,
    start: int,
    stop: int,
    size: int,
    *,
    allow_nulls: bool = False,
    first_id: int = 0,
) -> list[PlannedRange]:
    """Cut rows ``[start, stop)`` of a Parquet file into ranges of ``size`` rows, each with the digest of its
    ``id<TAB>text<LF>`` lines (ids: the id column, cast to text, or, when ``id_column`` is None, the row
    numbers counted from ``first_id`` at row 0) and its count of null texts (an ArtifactError unless
    ``allow_nulls``; they then digest as ``""``).

    The one row-range planner: the dump's shards and bulk translation's parts are both planned here. Streams
    the rows once: memory holds one batch of the file, never the rows.
    """
    if size < 1:
        raise ValueError(f"rows per range must be >= 1, got {size}")
    n = max(stop - start, 0)
    n_ranges = -(-n // size)
    digests = [Digest() for _ in range(n_ranges)]
    nulls = [0] * n_ranges
    for row, batch in _iter_rows(path, _range_columns(id_column, text_column), start, stop):
        # a batch may straddle range borders: digest each range's piece of it
        pos = 0
        while pos < batch.num_rows:
            k = (row + pos - start) // size
            take = min(start + (k + 1) * size - (row + pos), batch.num_rows - pos)
            piece = batch.slice(pos, take)
            ids, texts, null = _batch_lines(piece, first_id + row + pos, id_column, allow_nulls)
            digests[k].update(_lines_bytes(ids, texts))
            nulls[k] += null
            pos += take
    return [
        PlannedRange(start + i * size, min(start + (i + 1) * size, stop), digests[i].value, nulls[i])
        for i in range(n_ranges)
    ]


def read_range(
    path: Path,
    id_column: str | None,
    text_column: str,
    start: int,
    stop: int,
    *,
    allow_nulls: bool = False,
    first_id: int = 0,
) -> tuple[list, list[str], str]:
    """(ids, texts, digest) of rows ``[start, stop)`` (fewer when the file is shorter), the digest as
    :func:`plan_ranges` computes it: what a worker reads and checks against its plan."""
    ids: list = []
    texts: list[str] = []
    d = Digest()
    for row, batch in _iter_rows(path, _range_columns(id_column, text_column), start, stop):
        id_array, text_array, _ = _batch_lines(batch, first_id + row, id_column, allow_nulls)
        d.update(_lines_bytes(id_array, text_array))
        ids += id_array.to_pylist()
        texts += text_array.to_pylist()
    return ids, texts, d.value


def plan_row_shards(
    source: SampleFile,
    direction: str,
    start: int,
    stop: int,
    shard_sentences: int,
    max_states: int | None = None,
    *,
    references: bool = False,
) -> list[RowRangeSpec]:
    """Cut rows ``[start, stop)`` of ``source`` into shards of ``shard_sentences`` rows, numbered from 0; a
    state cap is split evenly over them (as :func:`~fastvocab.tasks.dump.plan_shards` does). With
    ``references`` (and a source that has them), each shard also carries its references' digest: the
    reference path's plan.

    Streams the rows once (twice with references) to digest each shard's lines (:func:`plan_ranges`): memory
    holds one batch, never the sample.
    """
    if shard_sentences < 1:
        raise ValueError(f"shard_sentences must be >= 1, got {shard_sentences}")
    stop = min(stop, source.rows)
    ranges = plan_ranges(source.path, source.id_column, source.text_column, start, stop, shard_sentences)
    ref_column = source.reference_column if references else None
    ref_digests: list[str | None] = [None] * len(ranges)
    if ref_column is not None:
        ref_ranges = plan_ranges(
            source.path, source.id_column, ref_column, start, stop, shard_sentences, allow_nulls=True
        )
        ref_digests = [r.digest for r in ref_ranges]
    cap = None if max_states is None else -(-max_states // max(len(ranges), 1))
    return [
        RowRangeSpec(
            direction,
            i,
            str(source.path),
            source.id_column,
            source.text_column,
            r.start,
            r.stop,
            r.digest,
            cap,
            ref_column,
            ref_digest,
        )
        for i, (r, ref_digest) in enumerate(zip(ranges, ref_digests, strict=True))
    ]
