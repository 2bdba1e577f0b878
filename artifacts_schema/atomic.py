"""Atomic writes: write to a temporary name beside the target, then rename.

A killed run leaves either the old file, or the new one, never a half-written file under the real name.

What a user names is honoured as Unix tools do:

- ``-``, and any path that names a descriptor this process already holds (``/dev/stdout``, ``/dev/fd/3``,
  ``/proc/self/fd/1``, or a file that is where standard output or error goes), is written to that
  descriptor as it stands: never reopened, so a shell's ``>``, ``>>`` and ``{ ...; } > f`` keep their
  offset and nothing the shell wrote before is truncated;
- any other path that exists and is not a regular file or folder (a FIFO, a device such as ``/dev/null``, a
  socket) is written through, never replaced;
- a symlink keeps its place and the file it points to is replaced; other files and folders are replaced by
  a rename.

The content is complete before the first byte goes to a stream, so a failed write sends nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

STDIO = "-"


# /dev/fd/N, /proc/self/fd/N, /proc/<pid>/fd/N: a descriptor named by its number
_FD_PATH = re.compile(r"^/(?:dev/fd|proc/self/fd|proc/(\d+)/fd)/(\d+)$")
_STANDARD = {"/dev/stdin": 0, "/dev/stdout": 1, "/dev/stderr": 2}


def held_descriptor(target: str | os.PathLike[str]) -> int | None:
    """The descriptor of this process that ``target`` names, or None.

    ``-`` is 1; ``/dev/stdout``, ``/dev/stderr``, ``/dev/stdin`` and ``/dev/fd/N`` (also under
    ``/proc/self`` or this process's ``/proc/<pid>``) are their numbers, when open; any other path is 0, 1
    when it is the same file (device and inode) as standard output or error: ``-o out.txt > out.txt``.
    """
    text = os.fspath(target)
    if text == STDIO:
        return 1
    match = _FD_PATH.match(text)
    if match and (match.group(1) is None or int(match.group(1)) == os.getpid()):
        fd: int | None = int(match.group(2))
    else:
        fd = _STANDARD.get(text)
    if fd is not None:
        try:
            os.fstat(fd)
        except OSError:
            return None
        return fd
    try:
        named = os.stat(text)
    except OSError:
        return None
    for fd in (1, 2):
        try:
            held = os.fstat(fd)
        except OSError:
            continue
        if (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino):
            return fd
    return None


def is_stream(target: str | os.PathLike[str]) -> bool:
    """True for a target that is written through rather than replaced: one this process holds
    (:func:`held_descriptor`), and any existing path that is neither a regular file nor a folder."""
    if held_descriptor(target) is not None:
        return True
    try:
        mode = os.stat(os.fspath(target)).st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


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
    """Copy ``source``'s bytes to the descriptor ``target`` names (:func:`held_descriptor`) at its current
    offset, or into the stream ``target`` opened for writing (a FIFO, a device)."""
    fd = held_descriptor(target)
    with source.open("rb") as src:
        if fd is None:
            with open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            return
        if os.fspath(target) == STDIO:  # through sys.stdout, wherever it goes (a test's capture too)
            sys.stdout.flush()
            shutil.copyfileobj(src, sys.stdout.buffer)
            sys.stdout.buffer.flush()
            return
        # what Python buffered for this descriptor goes first, so lines keep their order
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                if stream.fileno() == fd:
                    stream.flush()
        with open(fd, "wb", closefd=False) as dst:
            shutil.copyfileobj(src, dst)


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
