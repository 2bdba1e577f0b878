"""Translation outputs: Parquet with ``id, direction, source, hypothesis, method`` (+ optional scores), or
plain text with one output a line; in the pipeline each Parquet file has a JSON sidecar (``<method>.json``)
recording how it was made (signature, provenance digests, speed).

A long input is translated in chunks (``fastvocab translate``): each finished chunk is a *part*,
``<output>.parts/part-NNNNN.parquet`` (``PART_SCHEMA``), whose schema metadata holds the chunk's plan (the
settings and the digest of its source lines) and the digest of its hypotheses. A rerun after a kill reuses the
parts whose plan matches and whose content checks; the output itself is assembled from the parts at the end,
atomically, and the parts folder removed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.digest import text_digest
from fastvocab.artifacts_schema.errors import ArtifactError

TRANSLATIONS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("direction", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("hypothesis", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
    ]
)


def write_translations(
    path: str | Path,
    hypotheses: Sequence[str],
    *,
    sources: Sequence[str],
    ids: Sequence[int] | None,
    direction: str,
    method: str,
) -> None:
    """Write outputs atomically: Parquet (``TRANSLATIONS_SCHEMA``) for ``.parquet``, else one line each."""
    path = Path(path)
    with atomic_path(path) as tmp:
        if path.suffix == ".parquet":
            n = len(hypotheses)
            table = pa.Table.from_pydict(
                {
                    "id": list(ids) if ids is not None else list(range(n)),
                    "direction": [direction] * n,
                    "source": list(sources),
                    "hypothesis": list(hypotheses),
                    "method": [method] * n,
                },
                schema=TRANSLATIONS_SCHEMA,
            )
            pq.write_table(table, tmp)
        else:
            tmp.write_text(_text_lines(hypotheses), encoding="utf-8")


def _text_lines(hypotheses: Sequence[str]) -> str:
    # A newline inside an output would shift every later line: keep one output per line.
    return "".join(h.replace("\r", " ").replace("\n", " ") + "\n" for h in hypotheses)


def read_hypotheses(path: Path, sources: Sequence[str]) -> list[str]:
    """The hypotheses of a translations Parquet file made for exactly ``sources`` (ArtifactError if not)."""
    try:
        table = pq.read_table(path, columns=["source", "hypothesis"])
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt translations {path}: {exc}") from exc
    if table.column("source").to_pylist() != list(sources):
        raise ArtifactError(f"{path} does not translate the current sample (rerun translate)")
    return table.column("hypothesis").to_pylist()


def sidecar_path(path: Path) -> Path:
    """The JSON record beside a translations file: ``full.parquet`` -> ``full.json``."""
    return Path(path).with_suffix(".json")


# ------------------------------------------------------------------------------------------ chunked outputs

PART_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("hypothesis", pa.string(), nullable=False),
    ]
)
PLAN_KEY = b"fastvocab.plan"
HYPOTHESES_KEY = b"fastvocab.hypotheses_digest"


def parts_dir(output: str | Path) -> Path:
    """Where the finished chunks of ``output`` wait until the whole input is translated."""
    output = Path(output)
    return output.with_name(output.name + ".parts")


def part_path(parts: Path, index: int) -> Path:
    return parts / f"part-{index:05d}.parquet"


def write_part(
    path: Path, ids: Sequence[int], sources: Sequence[str], hypotheses: Sequence[str], plan: str
) -> None:
    """One finished chunk, atomically, with its plan and the digest of its hypotheses."""
    meta = {PLAN_KEY: plan.encode(), HYPOTHESES_KEY: text_digest(hypotheses).encode()}
    table = pa.table([list(ids), list(sources), list(hypotheses)], schema=PART_SCHEMA.with_metadata(meta))
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def read_part(path: Path, plan: str) -> pa.Table | None:
    """A part made with exactly ``plan`` whose hypotheses match their digest; None otherwise (redo it)."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException):
        return None
    meta = table.schema.metadata or {}
    if meta.get(PLAN_KEY) != plan.encode() or not table.schema.equals(PART_SCHEMA, check_metadata=False):
        return None
    if text_digest(table.column("hypothesis").to_pylist()).encode() != meta.get(HYPOTHESES_KEY):
        return None
    return table


def _part_tables(paths: Sequence[Path], plans: Sequence[str]) -> Iterator[pa.Table]:
    for path, plan in zip(paths, plans, strict=True):
        table = read_part(path, plan)
        if table is None:
            raise ArtifactError(f"translation part {path} changed or is corrupt since it was written (rerun)")
        yield table


def assemble_parts(
    output: str | Path, paths: Sequence[Path], plans: Sequence[str], *, direction: str, method: str
) -> None:
    """Concatenate the parts, in order, into ``output`` (format as :func:`write_translations`), atomically,
    one part in memory at a time; then remove the parts folder."""
    output = Path(output)
    with atomic_path(output) as tmp:
        if output.suffix == ".parquet":
            with pq.ParquetWriter(tmp, TRANSLATIONS_SCHEMA) as writer:
                for table in _part_tables(paths, plans):
                    n = table.num_rows
                    columns = {
                        "id": table.column("id"),
                        "direction": pa.array([direction] * n, pa.string()),
                        "source": table.column("source"),
                        "hypothesis": table.column("hypothesis"),
                        "method": pa.array([method] * n, pa.string()),
                    }
                    writer.write_table(pa.Table.from_pydict(columns, schema=TRANSLATIONS_SCHEMA))
        else:
            with tmp.open("w", encoding="utf-8") as f:
                for table in _part_tables(paths, plans):
                    f.write(_text_lines(table.column("hypothesis").to_pylist()))
    if paths:
        shutil.rmtree(paths[0].parent, ignore_errors=True)
