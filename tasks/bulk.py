"""A bulk job's input in row-range parts: described from its files and cut into ranges, each range translated
by a worker that reads it itself and writes one part (``artifacts_schema.bulk_parts``). The one resumable
path of ``fastvocab translate`` (any input, in this process or on Ray) and of the pipeline's ``bulk``
stage.

The driver never holds the texts. A Parquet input (a file, a folder of files, hive-partitioned or not, or a
glob) is described from its footers and cut into ranges by the row-range planner
(:func:`fastvocab.tasks.row_shards.plan_ranges`), which streams each file once to digest every range's
``id<TAB>text`` lines. A text input is streamed once for the same digests and each range's byte offset.
A :class:`BulkRange` is a few hundred bytes whatever its text; the
:class:`~fastvocab.tasks.translate_job.TranslateWorker` that gets it reads its rows, checks them against the
digest, translates them with :func:`fastvocab.tasks.translate.translate` and writes the part. A part records
its plan (:meth:`~fastvocab.tasks.translate_job.TranslateJob.range_plan`), so a rerun after any kill redoes
only the parts that are missing, of another plan, or damaged. Plain functions and classes: the pipeline hosts
the worker in Ray actors (``pipeline/bulk_driver.py``), or runs it in-process.
"""

from __future__ import annotations

import glob
import logging
from dataclasses import dataclass
from pathlib import Path

from fastvocab.artifacts_schema.bulk_parts import PART_LINES
from fastvocab.artifacts_schema.digest import Digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.tasks.inputs import iter_text_records

log = logging.getLogger(__name__)

# Text columns a Parquet input is read from without --input-column, in this order (``text``: the corpus's
# monolingual schema; ``source``: fastvocab translate's own default before the bulk path existed).
DEFAULT_TEXT_COLUMNS = ("text", "source")
DEFAULT_ID_COLUMN = "id"
CUT_LINES_SHOWN = 5  # line numbers of outputs cut at max_len that a warning names


class InputError(ArtifactError):
    """The input cannot be translated as asked (one line naming it and what to change). An ArtifactError,
    so that raised on a Ray worker it reaches the driver, and the CLI, as itself."""


@dataclass(frozen=True)
class InputFile:
    path: str  # as the workers see it (a shared volume on a cluster)
    rows: int
    first_row: int  # the input's row number of this file's first row (ids of an input without ids)


@dataclass(frozen=True)
class BulkInput:
    """What is to be translated: one text file, or Parquet files read in path order."""

    name: str  # as the user gave it, for messages
    kind: str  # "text" | "parquet"
    files: tuple[InputFile, ...]
    text_column: str | None = None  # Parquet
    id_column: str | None = None  # Parquet; None: the row numbers are the ids
    id_type: str = "int"  # "int" | "string"
    nulls: int = 0  # null texts (read as empty lines), counted when planned

    @property
    def rows(self) -> int:
        return sum(f.rows for f in self.files)


def is_parquet_input(path: str | Path) -> bool:
    """A ``.parquet`` file, a folder (a Parquet dataset) or a glob pattern (of Parquet files)."""
    text = str(path)
    return text.endswith(".parquet") or Path(path).is_dir() or glob.has_magic(text)


def parquet_files(path: str | Path) -> list[Path]:
    """The files of a Parquet input in path order: the file itself, every ``*.parquet`` under a folder (any
    depth, so hive partitions ``key=value/`` too; names starting with ``.`` or ``_`` are not data), or what a
    glob matches (``**`` included; a matched folder counts as its files). InputError when there are none."""
    text = str(path)
    if glob.has_magic(text):
        matches = [Path(m) for m in sorted(glob.glob(text, recursive=True))]
    else:
        matches = [Path(path)]
    files: list[Path] = []
    for m in matches:
        if m.is_dir():
            files += sorted(
                f
                for f in m.rglob("*.parquet")
                if not any(part.startswith((".", "_")) for part in f.relative_to(m).parts)
            )
        elif m.is_file():
            files.append(m)
        else:
            raise FileNotFoundError(f"input not found: {m}")
    if not files:
        raise InputError(f"{path}: no Parquet files there")
    return files


def describe_input(
    path: str | Path, text_column: str | None = None, id_column: str | None = DEFAULT_ID_COLUMN
) -> BulkInput:
    """The input from its footers (Parquet) or its name (text; its lines are counted when planned).

    Parquet: ``text_column`` None takes the first of :data:`DEFAULT_TEXT_COLUMNS` that every file has, else
    an InputError names the columns found and ``--input-column``; the text column must be a string. The id
    column is used when every file has it, and must be integer or string (the same type in every file).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not is_parquet_input(path):
        if not Path(path).is_file():
            raise FileNotFoundError(f"input file not found: {path}")
        return BulkInput(str(path), "text", (InputFile(str(Path(path).resolve()), 0, 0),))
    schemas, rows = [], []
    for f in parquet_files(path):
        try:
            meta = pq.ParquetFile(f).metadata
            schemas.append(meta.schema.to_arrow_schema())
        except (OSError, pa.ArrowException) as exc:
            raise InputError(f"cannot read Parquet {f}: {str(exc).splitlines()[0]}") from exc
        rows.append((f, meta.num_rows))
    common = [n for n in schemas[0].names if all(n in s.names for s in schemas)]
    if text_column is None:
        text_column = next((c for c in DEFAULT_TEXT_COLUMNS if c in common), None)
        if text_column is None:
            raise InputError(
                f"{path} has no text column {' or '.join(map(repr, DEFAULT_TEXT_COLUMNS))} "
                f"(columns: {', '.join(common) or 'none in common'}); name one with --input-column"
            )
    elif text_column not in common:
        raise InputError(
            f"{path} has no column {text_column!r} (columns: {', '.join(common) or 'none in common'}); "
            "name the text column with --input-column"
        )
    for s, (f, _) in zip(schemas, rows, strict=True):
        t = s.field(text_column).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise InputError(f"column {text_column!r} of {f} is {t}, not a string")
    id_type = "int"
    if id_column is not None and id_column in common:
        types = {str(s.field(id_column).type) for s in schemas}
        t = schemas[0].field(id_column).type
        if len(types) > 1:
            raise InputError(f"column {id_column!r} of {path} has several types: {', '.join(sorted(types))}")
        if pa.types.is_integer(t):
            id_type = "int"
        elif pa.types.is_string(t) or pa.types.is_large_string(t):
            id_type = "string"
        else:
            raise InputError(f"column {id_column!r} of {path} is {t}: an id must be an integer or a string")
    else:
        id_column = None
    files, first = [], 0
    for f, n in rows:
        files.append(InputFile(str(f.resolve()), n, first))
        first += n
    return BulkInput(str(path), "parquet", tuple(files), text_column, id_column, id_type)


@dataclass(frozen=True)
class BulkRange:
    """Lines ``[start, stop)`` of one input file, and the digest of their ``id<TAB>text<LF>`` lines."""

    index: int  # the part's number
    kind: str  # "text" | "parquet"
    path: str
    start: int  # first row (line) in the file, 0-based
    stop: int
    first_row: int  # the input's row number of ``start`` (the ids of an input without ids; messages)
    digest: str
    text_column: str | None = None
    id_column: str | None = None
    offset: int = 0  # text: byte offset of line ``start``
    nulls: int = 0

    @property
    def lines(self) -> int:
        return self.stop - self.start

    def load(self) -> tuple[list, list[str]]:
        """(ids, texts) of the range, read on the worker; ArtifactError when the input changed since."""
        if self.kind == "text":
            ids, texts, digest = _read_text_range(self)
        else:
            from fastvocab.tasks.row_shards import read_range

            ids, texts, digest = read_range(
                Path(self.path),
                self.id_column,
                self.text_column or "",
                self.start,
                self.stop,
                allow_nulls=True,
                first_id=self.first_row - self.start,
            )
        if len(ids) != self.lines or digest != self.digest:
            raise ArtifactError(
                f"{self.path}: rows {self.start}-{self.stop} changed since the job was planned "
                f"({len(ids)} rows read, digest {digest}, planned {self.digest}); rerun to plan again"
            )
        return ids, texts


def rows_up_to(inp: BulkInput, limit: int) -> int:
    """The input's rows, counted up to ``limit`` at most: a Parquet input's from its footers, a text
    file's by reading its first ``limit`` lines (kilobytes, not the file), counted as :func:`plan_input`
    counts them."""
    if inp.kind != "text":
        return min(inp.rows, limit)
    import itertools

    with open(inp.files[0].path, "rb") as f:
        return sum(1 for _ in itertools.islice(f, limit))


def _line_bytes(i: int, text: str) -> bytes:
    return f"{i}\t{text}\n".encode()


def _read_text_range(r: BulkRange) -> tuple[list[int], list[str], str]:
    texts: list[str] = []
    d = Digest()
    if r.lines:
        for line, _ in iter_text_records(r.path, r.offset, r.start + 1):
            d.update(_line_bytes(r.start + len(texts), line))
            texts.append(line)
            if len(texts) == r.lines:
                break
    return list(range(r.start, r.start + len(texts))), texts, d.value


def plan_input(inp: BulkInput, lines_per_part: int = PART_LINES) -> tuple[BulkInput, list[BulkRange]]:
    """Cut the input into ranges of ``lines_per_part`` lines (a Parquet range never spans two files), each
    with its digest; returns the input with its row and null counts filled in. Streams every file once:
    memory holds one batch (or line), never the input."""
    if lines_per_part < 1:
        raise InputError(f"lines per part must be >= 1, got {lines_per_part}")
    ranges: list[BulkRange] = []
    if inp.kind == "text":
        path = inp.files[0].path
        d, start, offset, n = Digest(), 0, 0, 0
        for n, (line, end) in enumerate(iter_text_records(path), start=1):
            d.update(_line_bytes(n - 1, line))
            if n - start == lines_per_part:
                ranges.append(BulkRange(len(ranges), "text", path, start, n, start, d.value, offset=offset))
                d, start, offset = Digest(), n, end
        if n > start:
            ranges.append(BulkRange(len(ranges), "text", path, start, n, start, d.value, offset=offset))
        planned = BulkInput(inp.name, "text", (InputFile(path, n, 0),))
        return planned, ranges
    from fastvocab.tasks.row_shards import plan_ranges

    nulls = 0
    for f in inp.files:
        for r in plan_ranges(
            Path(f.path),
            inp.id_column,
            inp.text_column or "",
            0,
            f.rows,
            lines_per_part,
            allow_nulls=True,
            first_id=f.first_row,
        ):
            ranges.append(
                BulkRange(
                    len(ranges),
                    "parquet",
                    f.path,
                    r.start,
                    r.stop,
                    f.first_row + r.start,
                    r.digest,
                    inp.text_column,
                    inp.id_column,
                    nulls=r.nulls,
                )
            )
            nulls += r.nulls
    return BulkInput(
        inp.name, inp.kind, inp.files, inp.text_column, inp.id_column, inp.id_type, nulls
    ), ranges


def input_digest(ranges: list[BulkRange]) -> str:
    """One digest for the whole input as planned (its ranges' digests in order)."""
    d = Digest()
    for r in ranges:
        d.update(f"{r.start}:{r.stop}:{r.digest};")
    return d.value
