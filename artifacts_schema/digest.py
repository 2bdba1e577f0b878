"""Content digests: the one way fastvocab names the identity of bytes, files, texts and arrays.

Every digest reads ``sha256:<first 32 hex digits>``. Manifests and resume checks compare them; they are not
security tokens, so 128 bits are plenty and keep manifests readable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path

import numpy as np

PREFIX = "sha256:"
HEX_DIGITS = 32


class Digest:
    """An incremental digest: ``update`` bytes or text in order, then ``str(d)`` (or ``d.value``)."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def update(self, data: bytes | memoryview | str) -> Digest:
        self._h.update(data.encode() if isinstance(data, str) else data)
        return self

    def update_array(self, a: np.ndarray) -> Digest:
        """dtype, shape and the C-order bytes of ``a`` (so equal values of another shape differ)."""
        a = np.ascontiguousarray(a)
        self.update(f"{a.dtype.str}{a.shape};")
        return self.update(a.tobytes())

    @property
    def value(self) -> str:
        return PREFIX + self._h.hexdigest()[:HEX_DIGITS]

    def __str__(self) -> str:
        return self.value


def digest(*parts: bytes | str) -> str:
    """Digest of ``parts`` concatenated."""
    d = Digest()
    for p in parts:
        d.update(p)
    return d.value


def array_digest(*arrays: np.ndarray) -> str:
    """Digest of arrays' dtype, shape and bytes: identifies centroids in manifests and resume checks."""
    d = Digest()
    for a in arrays:
        d.update_array(a)
    return d.value


def text_digest(texts: Iterable[str]) -> str:
    """Digest of lines joined by newlines: identifies a sample of sentences."""
    return digest("\n".join(texts))


def files_digest(*paths: Path) -> str:
    """Digest of each file's name and full content, in the order given (read a MiB at a time)."""
    d = Digest()
    for p in paths:
        d.update(p.name.encode() + b";")
        with Path(p).open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                d.update(chunk)
    return d.value


def footer_digest(files: Iterable[Path], tail_bytes: int = 65536) -> str:
    """Cheap identity of a set of Parquet files: folder/name, size and the last ``tail_bytes`` of each.

    A Parquet footer holds row counts and column statistics, so a rewritten file with other content changes
    the digest without reading every row again.
    """
    d = Digest()
    for f in sorted(Path(p) for p in files):
        size = f.stat().st_size
        d.update(f"{f.parent.name}/{f.name}:{size};")
        with f.open("rb") as fh:
            fh.seek(max(0, size - tail_bytes))
            d.update(fh.read())
    return d.value
