"""The input files a translation or an evaluation reads: UTF-8 text (one sentence a line) or Parquet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def is_parquet(path: str | Path) -> bool:
    """A ``.parquet`` file, or a folder (a Parquet dataset)."""
    path = Path(path)
    return path.suffix == ".parquet" or path.is_dir()


def iter_text_lines(path: str | Path) -> Iterator[str]:
    """A UTF-8 text file's lines (no line ends), streamed. Invalid UTF-8 is a ``ValueError`` naming file and
    line (raised when the iteration reaches it)."""
    for line, _ in iter_text_records(path):
        yield line


def iter_text_records(path: str | Path, offset: int = 0, first_line: int = 1) -> Iterator[tuple[str, int]]:
    """``(line, byte offset after it)`` for each line of a UTF-8 text file from byte ``offset`` on (a line
    start), which is line ``first_line`` (1-based, for messages). A byte-order mark at the file's start is
    skipped; invalid UTF-8 is a ``ValueError`` naming file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    with path.open("rb") as f:
        f.seek(offset)
        for n, raw in enumerate(f, start=first_line):
            offset += len(raw)
            if n == 1 and raw.startswith(b"\xef\xbb\xbf"):  # UTF-8 byte-order mark
                raw = raw[3:]
            part = raw.removesuffix(b"\n")  # the final newline ends the last line, it starts none
            try:
                yield part.decode("utf-8").removesuffix("\r"), offset
            except UnicodeDecodeError as exc:
                byte, column = part[exc.start], exc.start + 1
                raise ValueError(
                    f"{path}: line {n}: invalid UTF-8 (byte 0x{byte:02x} at column {column})"
                ) from None


def read_text_lines(path: str | Path) -> list[str]:
    """A UTF-8 text file as lines (no line ends); see :func:`iter_text_lines`."""
    return list(iter_text_lines(path))


def parquet_names(path: str | Path) -> list[str]:
    """The column names of a Parquet file or dataset folder (``ValueError`` when unreadable)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"input not found: {path}")
    try:
        schema = pq.read_schema(path) if path.is_file() else pq.ParquetDataset(path).schema
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"cannot read Parquet {path}: {exc}") from exc
    return list(schema.names)


def read_parquet_column(
    path: str | Path, column: str, id_column: str | None = None
) -> tuple[list[str], list[int] | None]:
    """A string column of a Parquet file or dataset folder, and the ``id_column`` when present.

    Nulls read as empty strings (they translate to empty outputs).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    names = parquet_names(path)
    if column not in names:
        raise ValueError(f"{path} has no column {column!r} (columns: {', '.join(names)})")
    columns = [column] + ([id_column] if id_column and id_column in names else [])
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
