"""The folder every offline artifact is stored as (a cluster map, a method index): one safetensors file of
named arrays and a JSON manifest that records the file's digest.

Both appear together or not at all (written into a temporary folder that is then renamed), and reading checks
the manifest's schema version and the tensors' digest, so a half-written, corrupt or older folder is an
:class:`ArtifactError` naming the folder and what to do, never a wrong result.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.digest import digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.jsonfile import require_json, write_json

MANIFEST_FILE = "manifest.json"

M = TypeVar("M")


def write_tensor_folder(
    folder: str | Path,
    tensors_file: str,
    tensors: dict[str, np.ndarray],
    manifest: Any,
    *,
    compress: bool = False,
) -> Path:
    """Write ``tensors`` to ``folder/tensors_file`` (with ``compress``, its compressed form) and the dataclass
    ``manifest`` (its ``tensors_digest`` set to the safetensors bytes' digest first) to
    ``folder/manifest.json``, atomically."""
    from safetensors.numpy import save

    data = save(tensors)
    manifest.tensors_digest = digest(data)
    folder = Path(folder)
    with atomic_path(folder) as tmp:
        tmp.mkdir()
        if compress:
            (tmp / (tensors_file + COMPRESSED_SUFFIX)).write_bytes(_compressed(data))
        else:
            (tmp / tensors_file).write_bytes(data)
        write_json(tmp / MANIFEST_FILE, asdict(manifest))
    return folder


def read_manifest(
    folder: str | Path, what: str, cls: type[M], version: int | tuple[int, ...], rebuild_hint: str
) -> M:
    """The manifest of a ``what`` ("cluster map") folder as ``cls``; ArtifactError when it is missing,
    corrupt or of another schema version than ``version`` (the newest, or every version still read, newest
    last; then naming ``rebuild_hint``)."""
    path = Path(folder) / MANIFEST_FILE
    data = require_json(path, f"{what} manifest", f"no {what} at {folder} (missing {MANIFEST_FILE})")
    found = data.get("schema_version")
    versions = version if isinstance(version, tuple) else (version,)
    if found not in versions:
        names = [str(v) for v in versions]
        readable = f"version {names[0]}"
        if len(names) > 1:
            readable = f"versions {', '.join(names[:-1])} and {names[-1]}"
        raise ArtifactError(
            f"{what} {folder} has schema version {found}, this fastvocab reads {readable}: {rebuild_hint}"
        )
    try:
        return cls(**data)
    except TypeError as exc:
        raise ArtifactError(f"corrupt {what} manifest {path}: {exc}") from exc


# A shipped artifact (one committed beside a model) may hold its tensors zstd-compressed as
# ``<tensors_file>.zst``: an 8-byte little-endian length of the safetensors bytes, then their zstd frame.
# The manifest's digest is that of the safetensors bytes either way, so a compressed folder reads as the
# plain one it was made from. Sorted ids and small counts compress 3-4x; the repository carries less.
COMPRESSED_SUFFIX = ".zst"
_ZSTD_LEVEL = 19


def _compressed(data: bytes) -> bytes:
    import pyarrow as pa

    packed = pa.Codec("zstd", compression_level=_ZSTD_LEVEL).compress(data, asbytes=True)
    return len(data).to_bytes(8, "little") + packed


def _tensor_bytes(folder: Path, tensors_file: str) -> bytes:
    """The safetensors bytes of ``folder/tensors_file``, or of its compressed form when only that exists."""
    plain = folder / tensors_file
    packed = plain.with_name(plain.name + COMPRESSED_SUFFIX)
    if plain.exists() or not packed.exists():
        return plain.read_bytes()
    import pyarrow as pa

    raw = packed.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    try:
        return pa.Codec("zstd").decompress(raw[8:], decompressed_size=size, asbytes=True)
    except (pa.ArrowException, OSError) as exc:
        raise OSError(f"cannot decompress {packed.name}: {exc}") from exc


def read_tensors(
    folder: str | Path, tensors_file: str, expect_digest: str, what: str
) -> dict[str, np.ndarray]:
    """The arrays of ``folder/tensors_file`` (or its compressed form); ArtifactError when unreadable or not
    the manifest's digest."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        data = _tensor_bytes(Path(folder), tensors_file)
        if digest(data) != expect_digest:
            raise ArtifactError(
                f"corrupt {what} {folder}: {tensors_file} does not match the digest in its manifest"
            )
        return dict(load(data))
    except (OSError, SafetensorError) as exc:
        raise ArtifactError(f"corrupt {what} tensors in {folder}: {exc}") from exc
