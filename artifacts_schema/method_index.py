"""Offline artifacts of the vocabulary-selection methods besides clustering: LSH codes, shortlists, graphs.

One folder per artifact::

    <dir>/index.safetensors   the method's arrays (names chosen by the method; a serialized Faiss or hnswlib
                              index is stored as a uint8 array)
    <dir>/manifest.json       schema version, method, model fingerprint, N, d, direction, the method's
                              parameters, the digest of index.safetensors, build time, ...

``direction`` is ``"en-it"`` for an artifact learned from one direction (a lexical shortlist) and ``"*"``
for one that depends on the output layer only (LSH codes, a graph over W), which serves every direction.
Loading checks the schema version, the method, the tensors' digest and, when given, the model fingerprint
and the direction, so an artifact is never used for a model or direction it was not built for.

Encoding (version 2): ``encoding``, empty for arrays stored as they are; a shipped artifact
(:func:`save_method_index` with ``compact``) is stored zstd-compressed and, for a method
:func:`_compact_options` lists (a shortlist), its arrays compact (``artifacts_schema/compact.py``): a
shortlist's ids as uint16 (vocabularies of at most 65,536 ids; each row keeps its order, most probable
first), ``indptr`` as row lengths, ``probs`` in float16 (read only to drop entries below ``min_prob``, whose
cut moves by at most that rounding). Loaded, it has the plain artifact's arrays and dtypes.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastvocab import __version__
from fastvocab.artifacts_schema.compact import decode_tensors, encode_tensors
from fastvocab.artifacts_schema.digest import digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.tensor_folder import MANIFEST_FILE as MANIFEST_FILE
from fastvocab.artifacts_schema.tensor_folder import read_manifest, read_tensors, write_tensor_folder

# Version 2: the manifest's ``encoding`` (module docstring).
INDEX_SCHEMA_VERSION = 2
READABLE_INDEX_VERSIONS = (1, INDEX_SCHEMA_VERSION)
COMPACT_FORMAT = "compact/1"
ANY_DIRECTION = "*"
TENSORS_FILE = "index.safetensors"


@dataclass
class IndexManifest:
    method: str  # the registered output-layer method that reads it: "lsh", "shortlist", "graph"
    model_fingerprint: str
    direction: str  # "en-it", or ANY_DIRECTION for an artifact built from the output layer alone
    n_vocab: int
    d: int
    params: dict[str, object] = field(default_factory=dict)  # what the method was built with (k, bits, M...)
    build_seconds: float = 0.0
    extra: dict[str, object] = field(default_factory=dict)  # statistics worth reading (sizes, coverage)
    tensors_digest: str = ""  # digest of index.safetensors, set when saved
    # how the arrays are stored: empty when as they are; a compact artifact's {"format", "tensors" (each
    # array's entry, compact.py), "plain_digest" (the digest of the plain artifact it was encoded from)}
    encoding: dict[str, object] = field(default_factory=dict)
    schema_version: int = INDEX_SCHEMA_VERSION
    fastvocab_version: str = __version__
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


@dataclass
class MethodIndex:
    manifest: IndexManifest
    tensors: dict[str, np.ndarray]

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.tensors.values())


def _compact_options(method: str, n_vocab: int) -> dict[str, dict[str, object]]:
    """Each array's :func:`compact.encode_tensor` keywords for ``method`` (none: stored as it is)."""
    ids: dict[str, object] = {"int_bound": n_vocab}
    if method == "shortlist":
        return {
            "indptr": {"int_bound": n_vocab + 1, "delta": "all"},
            "indices": ids,
            "frequent": ids,
            "always_active": ids,
            "probs": {"float16": True},
        }
    return {}


def save_method_index(index: MethodIndex, out_dir: str | Path, *, compact: bool = False) -> Path:
    """Write the folder atomically (tensors and manifest appear together or not at all); ``compact``: the
    shipped form (module docstring)."""
    if not index.tensors:
        raise ValueError(f"a {index.manifest.method} index needs at least one array")
    plain = {n: np.ascontiguousarray(a) for n, a in index.tensors.items()}
    if not compact:
        return write_tensor_folder(out_dir, TENSORS_FILE, plain, index.manifest)
    from safetensors.numpy import save

    m = index.manifest
    manifest = dataclasses.replace(m, schema_version=INDEX_SCHEMA_VERSION)
    plain_digest = str(m.encoding.get("plain_digest", "")) if m.encoding else digest(save(plain))
    stored, entries = encode_tensors(plain, _compact_options(m.method, m.n_vocab))
    manifest.encoding = {"format": COMPACT_FORMAT, "tensors": entries, "plain_digest": plain_digest}
    return write_tensor_folder(out_dir, TENSORS_FILE, stored, manifest, compress=True)


def load_index_manifest(index_dir: str | Path) -> IndexManifest:
    """An artifact's manifest; ArtifactError for a missing, corrupt or other-version one."""
    return read_manifest(index_dir, "method index", IndexManifest, READABLE_INDEX_VERSIONS, "rebuild it")


def _check_manifest(
    m: IndexManifest, method: str, where: str, expect_fingerprint: str | None, direction: str | None
) -> None:
    if m.method != method:
        raise ArtifactError(f"{where} is a {m.method!r} index, not a {method!r} index")
    if expect_fingerprint is not None and m.model_fingerprint != expect_fingerprint:
        raise ArtifactError(
            f"{method} index {where} was built for model {m.model_fingerprint}, "
            f"but the loaded model is {expect_fingerprint}"
        )
    if direction is not None and m.direction not in (ANY_DIRECTION, direction):
        raise ArtifactError(f"{method} index {where} was built for {m.direction}, not for {direction}")


def _check_arrays(
    tensors: Mapping[str, np.ndarray], required: tuple[str, ...], method: str, where: str
) -> None:
    missing = [name for name in required if name not in tensors]
    if missing:
        raise ArtifactError(f"{method} index {where} lacks array(s) {', '.join(missing)}")


def load_method_index(
    index_dir: str | Path,
    method: str,
    *,
    expect_fingerprint: str | None = None,
    direction: str | None = None,
    required: tuple[str, ...] = (),
) -> MethodIndex:
    """Load and check an artifact for ``method``; refuse one built for another model, method or direction.

    ``direction`` ("en-it"): the direction it will serve; an artifact built for every direction (``"*"``)
    serves any. ``required``: array names the method reads (a missing one is an ArtifactError).
    """
    index_dir = Path(index_dir)
    m = load_index_manifest(index_dir)
    _check_manifest(m, method, str(index_dir), expect_fingerprint, direction)
    tensors = read_tensors(index_dir, TENSORS_FILE, m.tensors_digest, f"{method} index")
    if m.encoding:
        tensors = _decode(tensors, m, index_dir)
    _check_arrays(tensors, required, method, str(index_dir))
    return MethodIndex(m, tensors)


def _decode(stored: dict[str, np.ndarray], m: IndexManifest, where: Path) -> dict[str, np.ndarray]:
    """A compact artifact's arrays as the plain artifact holds them."""
    entries = m.encoding.get("tensors")
    try:
        if m.encoding.get("format") != COMPACT_FORMAT or not isinstance(entries, dict):
            raise ValueError(f"unknown encoding {m.encoding.get('format')!r}")
        return decode_tensors(stored, entries)
    except (KeyError, ValueError, TypeError) as exc:
        raise ArtifactError(f"corrupt {m.method} index {where}: its arrays do not decode ({exc})") from exc


def method_index_for(
    index: MethodIndex | str | Path,
    method: str,
    *,
    fingerprint: str,
    n_vocab: int,
    d: int,
    direction: str | None = None,
    required: tuple[str, ...] = (),
) -> MethodIndex:
    """The artifact a projection reads, given as a folder (loaded and checked) or in memory (checked):
    built for ``method``, this model (fingerprint, N, d) and, when given, ``direction``."""
    if isinstance(index, (str, Path)):
        idx = load_method_index(
            index, method, expect_fingerprint=fingerprint, direction=direction, required=required
        )
        where = str(index)
    elif isinstance(index, MethodIndex):
        idx, where = index, f"in-memory {index.manifest.method} index"
        _check_manifest(idx.manifest, method, where, fingerprint, direction)
        _check_arrays(idx.tensors, required, method, where)
    else:
        raise ValueError(f"index must be a MethodIndex or an index folder, got {type(index).__name__}")
    m = idx.manifest
    if (m.n_vocab, m.d) != (n_vocab, d):
        raise ArtifactError(
            f"{where} has N={m.n_vocab}, d={m.d}; the model's output layer has N={n_vocab}, d={d}"
        )
    return idx


def new_index(
    method: str,
    *,
    model_fingerprint: str,
    direction: str,
    n_vocab: int,
    d: int,
    params: Mapping[str, object],
    tensors: Mapping[str, np.ndarray],
    build_seconds: float = 0.0,
    extra: Mapping[str, object] | None = None,
) -> MethodIndex:
    """A :class:`MethodIndex` ready for :func:`save_method_index` (keyword arguments, so call sites read)."""
    manifest = IndexManifest(
        method=method,
        model_fingerprint=model_fingerprint,
        direction=direction,
        n_vocab=n_vocab,
        d=d,
        params=dict(params),
        build_seconds=float(build_seconds),
        extra=dict(extra or {}),
    )
    return MethodIndex(manifest, dict(tensors))
