"""Atomic writes: write to a temporary name beside the target, then rename.

A killed run leaves either the old file, or the new one, never a half-written file under the real name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path in the target's folder; rename it onto ``target`` if the block succeeds.

    Works for files and for folders (a folder target is replaced whole).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    tmp_target = tmp / target.name
    try:
        yield tmp_target
        if not tmp_target.exists():
            raise FileNotFoundError(f"atomic write produced nothing for {target}")
        if target.is_dir() and tmp_target.is_dir():
            shutil.rmtree(target)
        os.replace(tmp_target, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
