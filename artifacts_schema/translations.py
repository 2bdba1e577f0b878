"""Translation outputs: Parquet with ``id, direction, source, hypothesis, method`` (+ optional scores), or
plain text with one output a line; in the pipeline each Parquet file has a JSON sidecar (``<method>.json``)
recording how it was made (signature, provenance digests, speed). ``fastvocab translate`` and the bulk stage
assemble the same two formats from their parts (``bulk_parts.py``).
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
            tmp.write_text(text_lines(hypotheses), encoding="utf-8")


def text_lines(hypotheses: Sequence[str]) -> str:
    """The text output of ``hypotheses``: one line each, its own line breaks turned into spaces."""
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
