"""A direction's dump input: every source line the maps should learn from, de-duplicated, none held out.

The maps keep full softmax's outputs only when they are built from a lot of text (misses halve with each
doubling of the dumped sentences on the demo model), so a direction's dump reads more than its pair's train
split. ``dump.sources`` lists, in order:

- ``train``: the direction's train split, each line with its reference translation (the reference path,
  teacher forcing, reads it);
- ``catalogs``: the direction's train split in the catalog corpus (``fastvocab corpus --catalogs``: gettext
  messages and their translations), with its references as ``train``; the catalog corpus's dev and test
  lines are then held out too;
- ``pairs``: the source side of the corpus's other pairs' train splits in the same source language;
- ``mono``: the source language's monolingual file (``<corpus>/mono/<src>.parquet``: Debian descriptions
  with ``fastvocab corpus --mono-debian``, or a user's file with ``--mono``);
- a path: a user's text file (one sentence a line) or Parquet file, folder or glob (column ``text``, else
  ``source``).

:func:`build_sources` writes them into one Parquet file (``artifacts_schema.corpus.SOURCES_SCHEMA``) that
the dump's shards are row ranges of: lines whitespace-normalised, empty lines and repeats (of any earlier
line, from any source) left out, and every line of the direction's dev and test source side dropped and
counted (they are what the maps are measured on). Two streamed passes over the inputs (8-byte line keys,
then the write), so memory holds one batch and 9 bytes a line, whatever the inputs' size. The file records
its inputs' digests and is rebuilt only when they change.
"""

from __future__ import annotations

import array
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.corpus import (
    SOURCES_KEY,
    SOURCES_SCHEMA,
    available_pairs,
    direction_file,
    mono_path,
    read_sources_record,
)
from fastvocab.artifacts_schema.digest import files_digest, footer_digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.kernels.id_sets import unique_ids
from fastvocab.tasks.corpus import first_occurrences, line_key
from fastvocab.tasks.debian_translations import normalise

log = logging.getLogger(__name__)

SOURCES_FORMAT = "fastvocab-dump-sources/1"
READ_ROWS = 65_536  # lines read (and written) at a time


@dataclass(frozen=True)
class SourceInput:
    """One input of a direction's dump: where its lines are and how to read them."""

    name: str  # "train", "pairs:en-fr", "mono", or the user's path as given
    kind: str  # "parquet" (a corpus file or a user's) | "text"
    files: tuple[str, ...]
    text_column: str | None = None  # Parquet
    reference_column: str | None = None  # Parquet, parallel sources only

    def digest(self) -> str:
        paths = [Path(f) for f in self.files]
        # a Parquet footer changes with its content (row counts, statistics): no need to read every row
        return footer_digest(paths) if self.kind == "parquet" else files_digest(*paths)

    def batches(self) -> Iterator[tuple[list[str], list[str | None] | None]]:
        """``(texts, references or None)`` a batch at a time, texts whitespace-normalised."""
        if self.kind == "text":
            yield from _text_batches(Path(self.files[0]))
            return
        assert self.text_column is not None  # Parquet inputs always name their column
        columns = [self.text_column] + ([self.reference_column] if self.reference_column else [])
        for f in self.files:
            try:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=READ_ROWS, columns=columns):
                    texts = [normalise(t) if t else "" for t in batch.column(0).to_pylist()]
                    refs = batch.column(1).to_pylist() if self.reference_column else None
                    yield texts, refs
            except (OSError, pa.ArrowException) as exc:
                raise ArtifactError(f"corrupt Parquet file {f}: {str(exc).splitlines()[0]}") from exc


def _text_batches(path: Path) -> Iterator[tuple[list[str], None]]:
    from fastvocab.tasks.inputs import iter_text_lines

    batch: list[str] = []
    try:
        for line in iter_text_lines(path):
            batch.append(normalise(line))
            if len(batch) == READ_ROWS:
                yield batch, None
                batch = []
    except ValueError as exc:  # invalid UTF-8, named with file and line
        raise ArtifactError(str(exc)) from None
    if batch:
        yield batch, None


def resolve_sources(
    corpus_dir: str | Path, direction: str, entries: Sequence[str], catalogs_dir: str | Path | None = None
) -> list[SourceInput]:
    """The inputs ``entries`` name for ``direction`` (see the module docstring); ArtifactError for a missing
    file or an unusable Parquet input."""
    src, _, tgt = direction.partition("-")
    inputs: list[SourceInput] = []
    for entry in entries:
        if entry in ("train", "catalogs"):
            folder = corpus_dir if entry == "train" else _catalogs(catalogs_dir)
            path, swap = direction_file(folder, src, tgt, "train")
            text, ref = ("text2", "text1") if swap else ("text1", "text2")
            inputs.append(SourceInput(entry, "parquet", (str(path),), text, ref))
        elif entry == "pairs":
            for a, b in available_pairs(corpus_dir):
                if src in (a, b) and {a, b} != {src, tgt}:
                    path, swap = direction_file(corpus_dir, src, b if a == src else a, "train")
                    inputs.append(
                        SourceInput(f"pairs:{a}-{b}", "parquet", (str(path),), "text2" if swap else "text1")
                    )
        elif entry == "mono":
            path = mono_path(corpus_dir, src)
            if not path.exists():
                raise ArtifactError(
                    f"dump source 'mono': no monolingual {src} file {path} (fastvocab corpus --mono-debian, "
                    f"or --mono FILE --lang {src})"
                )
            inputs.append(SourceInput("mono", "parquet", (str(path),), "text"))
        else:
            inputs.append(_user_input(entry))
    return inputs


def _catalogs(catalogs_dir: str | Path | None) -> Path:
    if catalogs_dir is None:
        raise ArtifactError(
            "dump source 'catalogs': no catalog corpus folder given (corpus.catalogs.out_dir)"
        )
    return Path(catalogs_dir)


def _user_input(entry: str) -> SourceInput:
    from fastvocab.tasks.bulk import describe_input

    try:
        found = describe_input(entry, id_column=None)
    except FileNotFoundError as exc:
        raise ArtifactError(f"dump source {entry!r}: {exc}") from None
    files = tuple(f.path for f in found.files)
    if found.kind == "text":
        return SourceInput(entry, "text", files)
    return SourceInput(entry, "parquet", files, found.text_column)


def held_out_keys(
    corpus_dir: str | Path, direction: str, more_dirs: Sequence[str | Path] = ()
) -> tuple[np.ndarray, str]:
    """Line keys of the direction's dev and test source side in ``corpus_dir`` and each of ``more_dirs``
    (sorted, unique), and a digest of those files.

    A direction without dev and test files holds nothing out (and says so in the log)."""
    src, _, tgt = direction.partition("-")
    keys: list[int] = []
    files: list[Path] = []
    for folder in (corpus_dir, *more_dirs):
        for split in ("dev", "test"):
            try:
                path, swap = direction_file(folder, src, tgt, split)
            except ArtifactError:
                continue
            files.append(path)
            column = "text2" if swap else "text1"
            for batch in pq.ParquetFile(path).iter_batches(batch_size=READ_ROWS, columns=[column]):
                keys += [line_key(normalise(t)) for t in batch.column(0).to_pylist() if t]
    if not files:
        log.warning("%s: no dev or test split in %s: no line is held out of the dump", direction, corpus_dir)
    return unique_ids(np.asarray(keys, dtype=np.uint64)), footer_digest(files) if files else ""


@dataclass
class SourcesResult:
    """What :func:`build_sources` wrote (or found current)."""

    path: Path
    rows: int
    with_reference: int  # rows that carry a reference translation
    stats: dict[str, dict[str, int]] = field(default_factory=dict)  # per input: lines, empty, ... kept
    skipped: bool = False

    @property
    def held_out(self) -> int:
        return sum(s["held_out"] for s in self.stats.values())


def build_sources(
    corpus_dir: str | Path,
    direction: str,
    entries: Sequence[str],
    out: str | Path,
    *,
    catalogs_dir: str | Path | None = None,
    force: bool = False,
) -> SourcesResult:
    """Write ``direction``'s dump input to ``out`` (atomically), unless a current one is there.
    ``catalogs_dir``: the catalog corpus the source ``catalogs`` reads."""
    out = Path(out)
    if not entries:
        raise ArtifactError(f"{direction}: no dump sources named (dump.sources)")
    inputs = resolve_sources(corpus_dir, direction, entries, catalogs_dir)
    more = [_catalogs(catalogs_dir)] if "catalogs" in entries else []
    held, held_digest = held_out_keys(corpus_dir, direction, more)
    build = {
        "format": SOURCES_FORMAT,
        "direction": direction,
        "inputs": [{**asdict(i), "digest": i.digest()} for i in inputs],
        "held_out_digest": held_digest,
    }
    build = json.loads(json.dumps(build))  # as the footer gives it back (tuples read as lists)
    record = None if force else read_sources_record(out)
    if record is not None and {k: record.get(k) for k in build} == build:
        return SourcesResult(out, record["rows"], record["with_reference"], record["stats"], skipped=True)

    # pass 1: a key per line, in input order (0 for an empty line)
    buf = array.array("Q")
    ends: list[int] = []  # each input's end in the key array
    for inp in inputs:
        for texts, _ in inp.batches():
            buf.extend(line_key(t) if t else 0 for t in texts)
        ends.append(len(buf))
    keys = np.frombuffer(buf, dtype=np.uint64) if len(buf) else np.zeros(0, np.uint64)
    blank = keys == 0
    in_held = np.isin(keys, held) & ~blank
    # a held-out line counts as held out wherever it appears, not as a duplicate of its first copy
    keep = first_occurrences(keys, skip=blank | in_held)
    first_copy = first_occurrences(keys, skip=blank)

    # pass 2: write the kept lines
    stats: dict[str, dict[str, int]] = {}
    rows = with_ref = 0
    start = 0
    record = {**build, "rows": 0, "with_reference": 0, "stats": stats}
    with atomic_path(out) as tmp:
        schema = SOURCES_SCHEMA
        # the record holds the final counts, so it goes into the footer's key-value metadata at the end
        writer = pq.ParquetWriter(tmp, schema)
        try:
            pos = 0
            for inp, end in zip(inputs, ends, strict=True):
                sl = slice(start, end)
                stats[inp.name] = {
                    "lines": end - start,
                    "empty": int(blank[sl].sum()),
                    "held_out": int(in_held[sl].sum()),
                    "duplicates": int((~blank[sl] & ~in_held[sl] & ~first_copy[sl]).sum()),
                    "kept": int(keep[sl].sum()),
                }
                for texts, refs in inp.batches():
                    mask = keep[pos : pos + len(texts)]
                    pos += len(texts)
                    idx = np.flatnonzero(mask)
                    if not len(idx):
                        continue
                    out_refs = [None] * len(idx) if refs is None else [refs[i] or None for i in idx]
                    with_ref += sum(r is not None for r in out_refs)
                    table = pa.table(
                        [
                            pa.array(np.arange(rows, rows + len(idx), dtype=np.int64)),
                            pa.array([texts[i] for i in idx], pa.string()),
                            pa.array(out_refs, pa.string()),
                            pa.array([inp.name] * len(idx), pa.string()),
                        ],
                        schema=schema,
                    )
                    writer.write_table(table)
                    rows += len(idx)
                start = end
            record.update(rows=rows, with_reference=with_ref)
            writer.add_key_value_metadata({SOURCES_KEY.decode(): json.dumps(record)})
        finally:
            writer.close()
    if rows == 0:
        out.unlink(missing_ok=True)
        raise ArtifactError(
            f"{direction}: the dump sources {list(entries)} hold no line outside dev and test"
        )
    log.info(
        "%s: %d source lines (%d with a reference) from %s; %d dev/test lines held out",
        direction,
        rows,
        with_ref,
        ", ".join(i.name for i in inputs),
        sum(s["held_out"] for s in stats.values()),
    )
    return SourcesResult(out, rows, with_ref, stats)
