"""Translation outputs: Parquet with ``id, direction, source, translation, method`` (+ optional scores), or
plain text with one output a line; in the pipeline each Parquet file has a JSON sidecar (``<method>.json``)
recording how it was made (signature, provenance digests, speed). ``fastvocab translate`` and the bulk stage
assemble the same two formats from their parts (``bulk_parts.py``), and a dataset output's parts name their
column ``translation`` too. Files written before the column had one name call it ``hypothesis``: readers
take either (:data:`TRANSLATION_COLUMNS`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.errors import ArtifactError

TRANSLATIONS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("direction", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("translation", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
    ]
)
# The translations' column, then its earlier name (still read)
TRANSLATION_COLUMNS = ("translation", "hypothesis")


def translation_column(names: Sequence[str]) -> str | None:
    """The first of :data:`TRANSLATION_COLUMNS` among a table's column ``names``, else None."""
    return next((c for c in TRANSLATION_COLUMNS if c in names), None)


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
                    "translation": list(hypotheses),
                    "method": [method] * n,
                },
                schema=TRANSLATIONS_SCHEMA,
            )
            pq.write_table(table, tmp)
        else:
            tmp.write_text(text_lines(hypotheses), encoding="utf-8")


def text_lines(hypotheses: Sequence[str]) -> str:
    """The text output of ``hypotheses``: one line each, its own line breaks turned into spaces."""
    # A newline inside an output would shift every later line: keep one output per line.
    return "".join(h.replace("\r", " ").replace("\n", " ") + "\n" for h in hypotheses)


def read_hypotheses(path: Path, sources: Sequence[str]) -> list[str]:
    """The hypotheses of a translations Parquet file made for exactly ``sources`` (ArtifactError if not)."""
    try:
        column = translation_column(pq.read_schema(path).names) or TRANSLATION_COLUMNS[0]
        table = pq.read_table(path, columns=["source", column])
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt translations {path}: {exc}") from exc
    if table.column("source").to_pylist() != list(sources):
        raise ArtifactError(f"{path} does not translate the current sample (rerun translate)")
    return table.column(column).to_pylist()


def sidecar_path(path: Path) -> Path:
    """The JSON record beside a translations file: ``full.parquet`` -> ``full.json``."""
    return Path(path).with_suffix(".json")
