"""Hidden-state shards written by the dump stage (docs/DESIGN-NOTES.md, "Formats").

Columns: ``sent_id int64, step int32, hidden fixed_size_list<float16>[d], topk_ids fixed_size_list<int32>[K]``
(+ optional ``topk_logprobs fixed_size_list<float32>[K]``). Schema metadata: model fingerprint, d, K,
direction, schema version, and the plan the shard was made from (``fastvocab.dump_plan``: its sentences'
digest and the decoding settings, ``beam`` among them for a beam dump), compared on resume. A shard
dumped along beam search's hypotheses holds several rows per ``(sent_id, step)``: nothing reading shards may
treat the pair as a key. Shards live in ``<root>/direction=<src>-<tgt>/part-<i:05d>.parquet`` (hive
partitioning), written atomically. A run that dumps along several beams keeps each beam's shards apart: the
greedy path's (beam 1) at ``<root>/direction=...`` as always, beam ``b``'s under ``<root>/beam=<b>/``, which
is a shard root of its own (:func:`beam_root`); states along the reference translations (teacher forcing,
"beam" :data:`REFERENCE_BEAM`) under ``<root>/reference/``.

Content checksum: beside each shard, ``_part-<i:05d>.parquet.sha256`` holds the SHA-256 of the shard's bytes
in ``sha256sum`` format (``sha256sum -c`` checks it; the ``_`` prefix keeps it out of Parquet datasets). The
plan in the metadata says what a shard was made from; the checksum says its bytes are the ones written, so a
flipped byte anywhere in the file is found on resume and on read, not only a broken footer.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.errors import ArtifactError

HIDDEN_SCHEMA_VERSION = 1
META_KEY = b"fastvocab.hidden_states"
PLAN_KEY = b"fastvocab.dump_plan"
SHARD_GLOB = "part-*.parquet"


@dataclass(frozen=True)
class ShardMeta:
    model_fingerprint: str
    d: int
    k: int
    direction: str
    schema_version: int = HIDDEN_SCHEMA_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, raw: bytes, where: str) -> ShardMeta:
        try:
            return cls(**json.loads(raw))
        except (ValueError, TypeError) as exc:
            raise ArtifactError(f"bad fastvocab metadata in {where}: {exc}") from exc


def hidden_schema(meta: ShardMeta, with_logprobs: bool = False) -> pa.Schema:
    fields = [
        pa.field("sent_id", pa.int64(), nullable=False),
        pa.field("step", pa.int32(), nullable=False),
        pa.field("hidden", pa.list_(pa.float16(), meta.d), nullable=False),
        pa.field("topk_ids", pa.list_(pa.int32(), meta.k), nullable=False),
    ]
    if with_logprobs:
        fields.append(pa.field("topk_logprobs", pa.list_(pa.float32(), meta.k), nullable=False))
    return pa.schema(fields, metadata={META_KEY: meta.to_bytes()})


def shard_table(
    meta: ShardMeta,
    sent_id: np.ndarray,
    step: np.ndarray,
    hidden: np.ndarray,
    topk_ids: np.ndarray,
    topk_logprobs: np.ndarray | None = None,
) -> pa.Table:
    """Build a shard table from arrays: hidden (rows, d), topk_ids (rows, K)."""
    rows = len(sent_id)
    if hidden.shape != (rows, meta.d) or topk_ids.shape != (rows, meta.k):
        raise ValueError(
            f"shape mismatch: hidden {hidden.shape}, topk_ids {topk_ids.shape}, "
            f"expected ({rows}, {meta.d}) and ({rows}, {meta.k})"
        )
    cols = [
        pa.array(np.asarray(sent_id, dtype=np.int64)),
        pa.array(np.asarray(step, dtype=np.int32)),
        pa.FixedSizeListArray.from_arrays(
            pa.array(np.ascontiguousarray(hidden, dtype=np.float16).reshape(-1)), meta.d
        ),
        pa.FixedSizeListArray.from_arrays(
            pa.array(np.ascontiguousarray(topk_ids, dtype=np.int32).reshape(-1)), meta.k
        ),
    ]
    if topk_logprobs is not None:
        cols.append(
            pa.FixedSizeListArray.from_arrays(
                pa.array(np.ascontiguousarray(topk_logprobs, dtype=np.float32).reshape(-1)), meta.k
            )
        )
    schema = hidden_schema(meta, with_logprobs=topk_logprobs is not None)
    return pa.Table.from_arrays(cols, schema=schema)


# The "beam" of states recorded along each line's reference translation (teacher forcing: the decoder fed the
# reference, no search). It is a path through the model like a beam, so it shares the beams' plumbing
# (shard roots, plans, stream files); only its folder has a name of its own.
REFERENCE_BEAM = 0
REFERENCE_DIR = "reference"


def beam_label(beam: int) -> str:
    """How a path is named to people: ``reference``, ``greedy`` or ``beam 4``."""
    return REFERENCE_DIR if beam == REFERENCE_BEAM else "greedy" if beam == 1 else f"beam {beam}"


def beam_root(root: str | Path, beam: int) -> Path:
    """The shard root of the states dumped along ``beam``: ``root`` itself for the greedy path (beam 1, the
    layout of every run before beams), ``<root>/beam=<b>`` for beam search, ``<root>/reference`` for the
    reference path (:data:`REFERENCE_BEAM`)."""
    if beam < 0:
        raise ValueError(f"beam must be >= 1 (or {REFERENCE_BEAM}: the reference path), got {beam}")
    if beam == REFERENCE_BEAM:
        return Path(root) / REFERENCE_DIR
    return Path(root) if beam == 1 else Path(root) / f"beam={beam}"


def beam_roots(root: str | Path) -> dict[int, Path]:
    """Every beam's shard root found under ``root`` (``{1: root}``, ``{b: root/beam=<b>}`` and
    ``{0: root/reference}``), by beam."""
    root = Path(root)
    found = {1: root}
    for sub in root.glob("beam=*"):
        tail = sub.name.removeprefix("beam=")
        if sub.is_dir() and tail.isdigit() and int(tail) > 1:
            found[int(tail)] = sub
    if (root / REFERENCE_DIR).is_dir():
        found[REFERENCE_BEAM] = root / REFERENCE_DIR
    return dict(sorted(found.items()))


def shard_beam(path: str | Path) -> int:
    """The beam a shard was dumped along, from its plan (1: the greedy path, also for a shard without a plan,
    as every shard was before beams)."""
    try:
        raw = (pq.read_schema(path).metadata or {}).get(PLAN_KEY)
        return int(json.loads(raw).get("beam", 1)) if raw is not None else 1
    except (OSError, pa.ArrowException, ValueError, TypeError, AttributeError) as exc:
        raise ArtifactError(f"corrupt hidden-state shard {path}: {exc}") from exc


def direction_dir(root: str | Path, direction: str) -> Path:
    """The hive partition folder of a direction under ``root``."""
    return Path(root) / f"direction={direction}"


def part_name(index: int, suffix: str = ".parquet") -> str:
    return f"part-{index:05d}{suffix}"


def shard_path(root: str | Path, direction: str, index: int) -> Path:
    return direction_dir(root, direction) / part_name(index)


def checksum_path(path: str | Path) -> Path:
    """The shard's checksum file: ``_part-00000.parquet.sha256`` beside ``part-00000.parquet``."""
    path = Path(path)
    return path.with_name(f"_{path.name}.sha256")


# (path, size, mtime) -> sha256 hex: a shard checked on resume is not hashed again when it is read
_HASHED: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        h = hashlib.sha256()
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        _HASHED[key] = h.hexdigest()
    return _HASHED[key]


def write_shard(table: pa.Table, plan: dict[str, object], path: Path, row_group_size: int) -> Path:
    """Write one shard table atomically, with the plan it was made from in its metadata, then its checksum.

    The old checksum goes first: a kill between the two writes leaves a shard without a checksum, which is
    not current (redone), never a new shard beside an old checksum.
    """
    table = table.replace_schema_metadata(
        {**table.schema.metadata, PLAN_KEY: json.dumps(plan, sort_keys=True)}
    )
    sidecar = checksum_path(path)
    sidecar.unlink(missing_ok=True)
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, row_group_size=row_group_size, compression="zstd")
        sha = file_sha256(tmp)
    with atomic_path(sidecar) as tmp:
        tmp.write_text(f"{sha}  {path.name}\n")
    return path


def checksum_problem(path: Path) -> str | None:
    """Why ``path``'s bytes are not the ones written (None when they are); "no checksum" without a file."""
    sidecar = checksum_path(path)
    try:
        want = sidecar.read_text().split()[0]
    except FileNotFoundError:
        return "no checksum"
    except (OSError, IndexError) as exc:
        return f"unreadable checksum file {sidecar.name} ({exc})"
    if file_sha256(path) != want:
        return f"its SHA-256 does not match {sidecar.name} (the file changed after it was written)"
    return None


def shard_status(path: Path, meta: ShardMeta, plan: dict[str, object]) -> str:
    """``current``, ``missing``, ``stale`` (another model, plan or no checksum) or ``corrupt: <why>``."""
    if not path.exists():
        return "missing"
    problem = checksum_problem(path)
    if problem == "no checksum":
        return "stale"  # written before checksums, or killed before its checksum: redone to be sure
    if problem is not None:
        return f"corrupt: {problem}"
    try:
        return "current" if _meta_and_plan_match(path, meta, plan) else "stale"
    except ArtifactError as exc:
        return f"corrupt: {exc}"


def shard_is_current(path: Path, meta: ShardMeta, plan: dict[str, object]) -> bool:
    """True when ``path`` exists, its bytes match its checksum, and it was written for this model and plan.

    A file that exists but is corrupt raises ArtifactError (one line naming it): a worker does not silently
    overwrite it; the dump stage on the driver (:func:`shard_status`) removes a corrupt shard of its own
    plan, says so, and has it redone.
    """
    status = shard_status(path, meta, plan)
    if status.startswith("corrupt: "):
        reason = status.removeprefix("corrupt: ")
        raise ArtifactError(reason if str(path) in reason else f"corrupt hidden-state shard {path}: {reason}")
    return status == "current"


def remove_shard(path: Path) -> None:
    """Remove a shard and its checksum."""
    path.unlink(missing_ok=True)
    checksum_path(path).unlink(missing_ok=True)


def _meta_and_plan_match(path: Path, meta: ShardMeta, plan: dict[str, object]) -> bool:
    found = read_shard_meta(path)
    if found != meta:
        return False
    try:
        raw = (pq.read_schema(path).metadata or {}).get(PLAN_KEY)
        return raw is not None and json.loads(raw) == plan
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise ArtifactError(f"corrupt hidden-state shard {path}: {exc}") from exc


def stale_shards(root: Path, direction: str, planned: int) -> list[Path]:
    """Shard files of a direction beyond the current plan (left by a run with a larger sample)."""
    keep = {part_name(i) for i in range(planned)}
    return [p for p in sorted(direction_dir(root, direction).glob(SHARD_GLOB)) if p.name not in keep]


def verify_checksums(files: list[Path]) -> None:
    """Raise ArtifactError naming the first shard whose bytes do not match its checksum file.

    Shards without a checksum file (written by other tools, or before checksums) are accepted as they are.
    """
    for f in files:
        problem = checksum_problem(f)
        if problem is not None and problem != "no checksum":
            raise ArtifactError(f"corrupt hidden-state shard {f}: {problem}; rerun the dump stage to redo it")


def read_shard_meta(path: str | Path) -> ShardMeta:
    """Read and validate one shard's schema; raises ArtifactError naming the file when it is bad."""
    path = Path(path)
    try:
        schema = pq.read_schema(path)
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt hidden-state shard {path}: {exc}") from exc
    raw = (schema.metadata or {}).get(META_KEY)
    if raw is None:
        raise ArtifactError(f"{path} is not a fastvocab hidden-state shard (no metadata)")
    meta = ShardMeta.from_bytes(raw, str(path))
    if meta.schema_version != HIDDEN_SCHEMA_VERSION:
        raise ArtifactError(
            f"{path} has hidden-state schema version {meta.schema_version}, expected {HIDDEN_SCHEMA_VERSION}"
        )
    expected = hidden_schema(meta, with_logprobs="topk_logprobs" in schema.names)
    if not schema.remove_metadata().equals(expected.remove_metadata()):
        raise ArtifactError(f"{path} does not match the hidden-state schema: {schema.remove_metadata()}")
    return meta


def validate_direction(
    root: str | Path, direction: str, fingerprint: str | None = None, verify: bool = True
) -> list[Path]:
    """Validate every shard of a direction (with ``verify``, their checksums too); return their paths
    (sorted). Raises ArtifactError."""
    files = sorted(direction_dir(root, direction).glob(SHARD_GLOB))
    if not files:
        raise ArtifactError(f"no hidden-state shards for {direction} under {root}")
    if verify:
        verify_checksums(files)
    metas = {read_shard_meta(f) for f in files}
    if len(metas) != 1:
        raise ArtifactError(f"shards of {direction} under {root} disagree on their metadata: {metas}")
    (meta,) = metas
    if meta.direction != direction:
        raise ArtifactError(f"shards under {direction_dir(root, direction)} say direction {meta.direction}")
    if fingerprint is not None and meta.model_fingerprint != fingerprint:
        raise ArtifactError(
            f"shards of {direction} were dumped from model {meta.model_fingerprint}, not {fingerprint}"
        )
    return files


def validate_beams(
    root: str | Path, direction: str, fingerprint: str | None = None, beams: Sequence[int] | None = None
) -> dict[int, list[Path]]:
    """The validated shards of ``direction`` along every beam found under ``root`` (:func:`beam_roots`), or
    along ``beams`` only, by beam: a beam named in ``beams`` without shards is an error, one found but not
    named is left out. Raises ArtifactError (also when no beam has shards)."""
    roots = beam_roots(root)
    wanted = sorted(set(beams)) if beams is not None else list(roots)
    found: dict[int, list[Path]] = {}
    for b in wanted:
        sub = roots.get(b, beam_root(root, b))
        if beams is None and not direction_dir(sub, direction).is_dir():
            continue
        found[b] = validate_direction(sub, direction, fingerprint=fingerprint)
    if not found:
        raise ArtifactError(f"no hidden-state shards for {direction} under {root}")
    return found


def shard_rows(files: list[Path]) -> list[int]:
    """Rows of each shard, from the Parquet footers (no data read)."""
    return [pq.ParquetFile(f).metadata.num_rows for f in files]


def iter_batches(files: list[Path], columns: list[str] | None = None, batch_size: int = 65536):
    """Stream record batches from shard files (never loads the whole direction)."""
    for f in files:
        try:
            pf = pq.ParquetFile(f)
            yield from pf.iter_batches(batch_size=batch_size, columns=columns)
        except (OSError, pa.ArrowException) as exc:
            raise ArtifactError(f"corrupt hidden-state shard {f}: {exc}") from exc


def fixed_list_to_numpy(col: pa.Array | pa.ChunkedArray, width: int, dtype) -> np.ndarray:
    """(rows, width) numpy view of a fixed_size_list column."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    return col.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False).reshape(-1, width)
