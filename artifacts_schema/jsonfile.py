"""JSON records and manifests: written atomically with sorted keys, read with one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

from fastvocab.artifacts_schema.atomic import write_text_atomic
from fastvocab.artifacts_schema.errors import ArtifactError


def write_json(path: str | Path, record: dict[str, object]) -> None:
    """Write ``record`` (sorted keys, indented) atomically."""
    write_text_atomic(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path, what: str = "record") -> dict | None:
    """The JSON object at ``path``; None when the file is absent, ArtifactError naming it when unreadable."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
    except ValueError as exc:
        raise ArtifactError(f"corrupt {what} {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"corrupt {what} {path}: not a JSON object")
    return data


def require_json(path: str | Path, what: str, missing: str) -> dict:
    """Like :func:`read_json`, but a missing file is an ArtifactError with the message ``missing``."""
    data = read_json(path, what)
    if data is None:
        raise ArtifactError(missing)
    return data
