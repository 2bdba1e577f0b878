"""Translation outputs: Parquet with ``id, direction, source, hypothesis, method`` (+ optional scores)."""

from __future__ import annotations

import pyarrow as pa

TRANSLATIONS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("direction", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("hypothesis", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
    ]
)
