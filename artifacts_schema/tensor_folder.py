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
    folder: str | Path, tensors_file: str, tensors: dict[str, np.ndarray], manifest: Any
) -> Path:
    """Write ``tensors`` to ``folder/tensors_file`` and the dataclass ``manifest`` (its ``tensors_digest``
    set to the file's digest first) to ``folder/manifest.json``, atomically."""
    from safetensors.numpy import save

    data = save(tensors)
    manifest.tensors_digest = digest(data)
    folder = Path(folder)
    with atomic_path(folder) as tmp:
        tmp.mkdir()
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


def read_tensors(
    folder: str | Path, tensors_file: str, expect_digest: str, what: str
) -> dict[str, np.ndarray]:
    """The arrays of ``folder/tensors_file``; ArtifactError when unreadable or not the manifest's digest."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    try:
        data = (Path(folder) / tensors_file).read_bytes()
        if digest(data) != expect_digest:
            raise ArtifactError(
                f"corrupt {what} {folder}: {tensors_file} does not match the digest in its manifest"
            )
        return dict(load(data))
    except (OSError, SafetensorError) as exc:
        raise ArtifactError(f"corrupt {what} tensors in {folder}: {exc}") from exc
