"""Translation in parts (``fastvocab translate``, the bulk stage): a Parquet dataset of parts, one per
planned row range of the input.

``<dataset>/part-NNNNN.parquet`` holds ``id`` (int64, or string when the input's ids are strings), ``source``
and ``translation``, one row per input line in input order. Its schema metadata records

- ``fastvocab.plan``: the part's plan as JSON (the input range and its digest, the model fingerprint, the
  method's signature and dtype, the search settings, the direction): a rerun reuses a part only when the plan
  it would write now is this one;
- ``fastvocab.translations_digest``: the digest of the ``translation`` column, so a damaged part is redone;
- ``fastvocab.method`` / ``fastvocab.signature`` / ``fastvocab.direction``: for readers of the dataset.

Parts are written atomically (temporary name, then rename), so a killed writer leaves a whole part or none;
the same part written twice (a retried range) is the same bytes. ``_manifest.json`` appears last, when every
part is done: a dataset without it is unfinished. A text or single-file output is assembled from the parts
in input order, atomically, and the parts folder then removed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.digest import text_digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.jsonfile import write_json
from fastvocab.artifacts_schema.translations import TRANSLATIONS_SCHEMA, text_lines

# lines a part: the unit of work, of resume, and of the progress kept after a kill (``fastvocab translate
# --chunk-lines``, the bulk stage's ``chunk_lines``)
PART_LINES = 10_000
PLAN_KEY = b"fastvocab.plan"
DIGEST_KEY = b"fastvocab.translations_digest"
METHOD_KEY = b"fastvocab.method"
SIGNATURE_KEY = b"fastvocab.signature"
DIRECTION_KEY = b"fastvocab.direction"
MANIFEST = "_manifest.json"
ID_TYPES = {"int": pa.int64(), "string": pa.string()}


def part_schema(id_type: str) -> pa.Schema:
    """``id`` (int64 or string), ``source``, ``translation``."""
    return pa.schema(
        [
            pa.field("id", ID_TYPES[id_type], nullable=False),
            pa.field("source", pa.string(), nullable=False),
            pa.field("translation", pa.string(), nullable=False),
        ]
    )


def part_file(folder: str | Path, index: int) -> Path:
    return Path(folder) / f"part-{index:05d}.parquet"


def plan_text(plan: dict[str, object]) -> str:
    """The canonical JSON of a plan: what a part records and a rerun compares."""
    return json.dumps(plan, sort_keys=True, separators=(",", ":"), default=str)


def write_bulk_part(
    path: Path,
    ids: Sequence[object],
    sources: Sequence[str],
    translations: Sequence[str],
    *,
    plan: dict[str, object],
    id_type: str,
    method: str,
    signature: str,
    direction: str,
) -> None:
    """One finished range, atomically, with its plan and the digest of its translations."""
    meta = {
        PLAN_KEY: plan_text(plan).encode(),
        DIGEST_KEY: text_digest(translations).encode(),
        METHOD_KEY: method.encode(),
        SIGNATURE_KEY: signature.encode(),
        DIRECTION_KEY: direction.encode(),
    }
    schema = part_schema(id_type).with_metadata(meta)
    columns = [
        _array(ids, ID_TYPES[id_type]),
        _array(sources, pa.string()),
        _array(translations, pa.string()),
    ]
    table = pa.Table.from_arrays(columns, schema=schema)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _array(values: Sequence[object], type: pa.DataType) -> pa.Array:
    """``values`` as an Arrow array built from its buffers: ``pa.array`` imports pandas to ask whether they
    are a pandas object, a second or more of a one-line translate on a small machine."""
    if type == pa.int64():
        data = np.fromiter(values, dtype=np.int64, count=len(values))
        return pa.Array.from_buffers(type, len(values), [None, pa.py_buffer(data)])
    encoded = [str(v).encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in encoded], out=offsets[1:])
    if offsets[-1] >= 2**31:  # beyond 32-bit offsets: the ordinary path
        return pa.array(list(values), type)
    buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))]
    return pa.Array.from_buffers(type, len(encoded), buffers)


def _read(path: Path, columns: list[str] | None = None) -> pa.Table:
    # ParquetFile, not pq.read_table: the dataset reader imports pandas (see _array)
    with pq.ParquetFile(path) as f:
        return f.read(columns=columns)


def part_status(path: Path, plan: dict[str, object]) -> str:
    """``current`` (made with exactly ``plan``, translations matching their digest), ``missing``, ``stale``
    (another plan: redo it) or ``corrupt: <why>`` (unreadable, or its translations changed: redo it)."""
    if not path.exists():
        return "missing"
    try:
        meta = pq.read_schema(path).metadata or {}
        if meta.get(PLAN_KEY) != plan_text(plan).encode():
            return "stale"
        translations = _read(path, ["translation"]).column(0).to_pylist()
    except (OSError, pa.ArrowException) as exc:
        return f"corrupt: {str(exc).splitlines()[0][:200]}"
    if text_digest(translations).encode() != meta.get(DIGEST_KEY):
        return "corrupt: its translations do not match their digest"
    return "current"


def part_counts(path: Path) -> tuple[int, int]:
    """(non-empty sources, of them translated empty) of a finished part: a resumed job counts the lines an
    earlier run translated as its own counts count the lines it translates."""
    t = _read(path, ["source", "translation"])
    sources, translations = t.column(0).to_pylist(), t.column(1).to_pylist()
    non_empty = [h for s, h in zip(sources, translations, strict=True) if s.strip()]
    return len(non_empty), sum(1 for h in non_empty if not h.strip())


def read_part_table(path: Path) -> pa.Table:
    try:
        return _read(path)
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt translation part {path}: {exc}") from exc


def stale_parts(folder: Path, count: int) -> list[Path]:
    """Part files beyond a plan of ``count`` parts (left by an earlier plan of the same output)."""
    if not folder.is_dir():
        return []
    return sorted(
        p
        for p in folder.glob("part-*.parquet")
        if p.stem.removeprefix("part-").isdigit() and int(p.stem.removeprefix("part-")) >= count
    )


def write_manifest(folder: Path, record: dict[str, object]) -> None:
    write_json(folder / MANIFEST, record)


def assemble(
    output: Path, parts: Iterable[Path], *, lines: int, direction: str, method: str, id_type: str
) -> None:
    """Concatenate the parts in order into ``output``, atomically, one part in memory at a time: text (one
    translation a line) unless it ends in ``.parquet`` (``id, direction, source, hypothesis, method``, the
    translations schema with the input's id type). ArtifactError when the parts do not hold ``lines`` rows."""
    written = 0
    with atomic_path(output) as tmp:
        if output.suffix == ".parquet":
            schema = TRANSLATIONS_SCHEMA.set(0, pa.field("id", ID_TYPES[id_type], nullable=False))
            with pq.ParquetWriter(tmp, schema) as writer:
                for path in parts:
                    t = read_part_table(path)
                    n = t.num_rows
                    written += n
                    columns = [
                        t.column("id"),
                        pa.array([direction] * n, pa.string()),
                        t.column("source"),
                        t.column("translation"),
                        pa.array([method] * n, pa.string()),
                    ]
                    writer.write_table(pa.Table.from_arrays(columns, schema=schema))
        else:
            with tmp.open("w", encoding="utf-8") as f:
                for path in parts:
                    hyps = read_part_table(path).column("translation").to_pylist()
                    written += len(hyps)
                    f.write(text_lines(hyps))
        if written != lines:
            raise ArtifactError(f"{output}: the parts hold {written} lines, the input has {lines}")


def remove_parts_folder(folder: Path) -> None:
    shutil.rmtree(folder, ignore_errors=True)
