"""Model fingerprints remembered per model folder, so a model's ``W`` and ``b`` are hashed once and not on
every load (``Seq2SeqAdapter.fingerprint``).

A fingerprint is kept in one JSON file (:func:`fingerprint_cache`) under a key of the folder's weight and
config files by name, size and mtime: it is the folder's until one of them changes. Best effort: a cache
that cannot be read or written is as if empty.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastvocab import switches

log = logging.getLogger(__name__)


def fingerprint_cache() -> Path:
    """Where model fingerprints are remembered: ``fingerprints.json`` in ``switches.cache_root``."""
    return switches.cache_root() / "fingerprints.json"


def _files_key(folder: Path) -> str | None:
    """The model folder's weight and config files by name, size and mtime: a fingerprint remembered under
    this key is the folder's until one of them changes."""
    try:
        files = sorted(
            f
            for f in folder.resolve().iterdir()
            if f.suffix in (".safetensors", ".bin", ".json") and f.is_file()
        )
        stats = [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    except OSError:
        return None
    return (
        f"{folder.resolve()}|" + ";".join(f"{n}:{size}:{mtime}" for n, size, mtime in stats)
        if stats
        else None
    )


def _read_fingerprints() -> dict[str, str]:
    import json

    try:
        found = json.loads(fingerprint_cache().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def cached_fingerprint(folder: Path) -> str | None:
    # hashing W is a full read of the output layer each run (a tenth of a second on the demo model, more
    # on larger ones), and a one-line translate needs the fingerprint only to name its parts
    key = _files_key(folder)
    return _read_fingerprints().get(key) if key else None


def remember_fingerprint(folder: Path, fingerprint: str) -> None:
    """Keep ``fingerprint`` for the folder's files as they are now (best effort: a read-only home is fine)."""
    import json

    from fastvocab.artifacts_schema.atomic import atomic_path

    key = _files_key(folder)
    if key is None:
        return
    known = {k: v for k, v in _read_fingerprints().items() if not k.startswith(f"{folder.resolve()}|")}
    known[key] = fingerprint
    try:
        path = fingerprint_cache()
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(dict(list(known.items())[-200:]), indent=1), encoding="utf-8")
    except OSError as exc:
        log.debug("fingerprint of %s not remembered: %s", folder, exc)
