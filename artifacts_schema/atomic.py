"""Atomic writes: write to a temporary name beside the target, then rename.

A killed run leaves either the old file, or the new one, never a half-written file under the real name.

What a user names is honoured as Unix tools do: ``-`` is standard output; a path that exists and is not a
regular file or folder (a FIFO, a device such as ``/dev/null`` or ``/dev/stdout``, a socket) is written
through, never replaced; a symlink keeps its place and the file it points to is replaced. The content is
complete before the first byte goes to a stream, so a failed write sends nothing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

STDIO = "-"


def is_stream(target: str | os.PathLike[str]) -> bool:
    """True for ``-`` and for a path that exists and is neither a regular file nor a folder, or that exists
    under ``/dev`` or ``/proc`` (``/dev/stdout`` resolves to a regular file when the shell redirected it to
    one: the shell holds that file open, so it is written through, not replaced)."""
    text = os.fspath(target)
    if text == STDIO:
        return True
    path = Path(text)
    if not path.exists():
        return False
    return text.startswith(("/dev/", "/proc/")) or not (path.is_file() or path.is_dir())


@contextlib.contextmanager
def atomic_path(target: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path; when the block succeeds, put what it wrote at ``target``.

    Files and folders (a folder target is replaced whole) are renamed into place; a symlink's destination
    is replaced and the link kept; ``-`` and streams get the bytes copied in (see the module docstring).
    """
    if is_stream(target):
        with tempfile.TemporaryDirectory(prefix=".fastvocab-out.") as folder:
            name = Path(os.fspath(target)).name or "out"
            tmp_target = Path(folder) / name
            yield tmp_target
            if not tmp_target.is_file():
                raise FileNotFoundError(f"atomic write produced nothing for {os.fspath(target)}")
            copy_to_stream(tmp_target, target)
        return
    path = Path(target)
    if path.is_symlink():
        path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    tmp_target = tmp / path.name
    try:
        yield tmp_target
        if not tmp_target.exists():
            raise FileNotFoundError(f"atomic write produced nothing for {path}")
        if path.is_dir() and tmp_target.is_dir():
            shutil.rmtree(path)
        os.replace(tmp_target, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def copy_to_stream(source: Path, target: str | os.PathLike[str]) -> None:
    """Copy ``source``'s bytes to standard output (``-``) or into the stream ``target`` opened for writing."""
    with source.open("rb") as src:
        if os.fspath(target) == STDIO:
            sys.stdout.flush()
            shutil.copyfileobj(src, sys.stdout.buffer)
            sys.stdout.buffer.flush()
        else:
            with open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
