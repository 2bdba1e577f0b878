"""The compact stored form of shipped tensors (cluster maps and method indexes committed beside a model).

Every shipped artifact is carried by every clone, so its tensors are stored smaller than the arrays decoding
reads and decoded back to those arrays (their dtype and shape) when loaded; nothing downstream sees the
difference. Each stored tensor is described in the manifest's ``encoding`` (``{"tensors": {name: entry}}``),
an entry holding:

- ``dtype``, ``shape``: what the tensor decodes to;
- ``stored``: the dtype kept on disk: ``uint16`` for ids and offsets of a vocabulary of at most 65,536 ids
  (int32 beyond), ``float16`` for floats that tolerate its rounding, ``int8`` for floats that tolerate a
  step of 1/127 of their row's largest magnitude (the caller's choice of each);
- ``row_scales`` (with ``stored`` ``int8``): the stored bytes begin with one float32 scale per row (the first
  axis), then the int8 values; a value decodes to its int8 times its row's scale (Faiss's SQ8 idea, per row);
- ``delta`` (optional): ``"all"``, the tensor is kept as its first value then the gaps between consecutive
  values (an ``indptr`` becomes set sizes); or the name of a CSR row pointer, each row kept as its first id
  then the gaps (sorted ids become small numbers that zstd packs);
- ``symmetric`` (optional): a stack of symmetric matrices kept as their upper triangles;
- ``planes`` (optional): the stored values' bytes kept plane by plane (every value's first byte, then every
  second byte, ...), so the near-constant high bytes of small ids and the exponents of floats sit together
  for zstd.

The file is then zstd-compressed (``tensor_folder``). Measured on the demo model's maps and shortlist tables:
benchmarks/results/compact-format-cpu-2026-11-28.json.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

UINT16_IDS = 1 << 16  # uint16 keeps ids and offsets below this: a vocabulary of at most 65,536 ids


def int_dtype(bound: int) -> np.dtype:
    """The narrowest stored dtype for non-negative integers below ``bound``: uint16 up to 65,536 (the ids of
    a vocabulary of that size), int32 beyond."""
    if bound <= UINT16_IDS:
        return np.dtype(np.uint16)
    if bound <= 1 << 31:
        return np.dtype(np.int32)
    return np.dtype(np.int64)


def _row_starts(indptr: np.ndarray) -> np.ndarray:
    """Positions of the first entry of each non-empty row."""
    starts = np.asarray(indptr[:-1], dtype=np.int64)
    return starts[np.diff(indptr) > 0]


def int8_rows(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``values`` (rows along the first axis) as int8 and one float32 scale per row: each row's largest
    magnitude becomes 127. Decoded (int8 times scale) and encoded again, a row gives the same int8."""
    v = np.asarray(values, dtype=np.float32).reshape(len(values), -1)
    scales = np.abs(v).max(axis=1) / 127 if v.size else np.zeros(len(v), dtype=np.float32)
    scales = np.where(scales > 0, scales, 1).astype(np.float32)
    return np.rint(v / scales[:, None]).astype(np.int8), scales


def int8_decoded(values: np.ndarray) -> np.ndarray:
    """``values`` as they read back from int8 rows (float32, their shape): what a reader of them sees."""
    q, scales = int8_rows(values)
    return (q * scales[:, None]).reshape(np.shape(values))


def _byte_planes(values: np.ndarray) -> np.ndarray:
    """(itemsize, n) uint8: byte j of every value in row j (like bytes pack better under zstd)."""
    v = np.ascontiguousarray(values).reshape(-1)
    return np.ascontiguousarray(v.view(np.uint8).reshape(-1, v.dtype.itemsize).T)


def _from_byte_planes(planes: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The values :func:`_byte_planes` split, (n,) ``dtype``."""
    return np.ascontiguousarray(planes.T).reshape(-1).view(dtype)


def _gaps(values: np.ndarray, indptr: np.ndarray | None) -> np.ndarray:
    v = values.astype(np.int64)
    out = v.copy()
    out[1:] -= v[:-1]
    if indptr is not None:  # every row restarts from its first id
        starts = _row_starts(indptr)
        out[starts] = v[starts]
    return out


def _undo_gaps(gaps: np.ndarray, indptr: np.ndarray | None) -> np.ndarray:
    total = np.cumsum(gaps.astype(np.int64))
    if indptr is None or not len(total):
        return total
    # a row's running sum starts at its own first id: subtract what the previous rows summed to
    starts = _row_starts(indptr)
    before = np.zeros(len(starts), dtype=np.int64)
    before[1:] = total[starts[1:] - 1]
    sizes: np.ndarray = np.diff(np.asarray(indptr, dtype=np.int64))
    return total - np.repeat(before, sizes[sizes > 0])


def encode_tensor(
    a: np.ndarray,
    *,
    int_bound: int | None = None,
    delta: str | None = None,
    rows: np.ndarray | None = None,
    float16: bool = False,
    int8: bool = False,
    symmetric: bool = False,
) -> tuple[np.ndarray, dict[str, Any]]:
    """The stored form of ``a`` and its manifest entry.

    ``int_bound``: an integer tensor's values (or gaps, with ``delta``) lie in ``[0, int_bound)``, which
    picks the stored width (:func:`int_dtype`); a value outside it is a ValueError, never a wrapped id.
    ``delta``: ``"all"`` or the name of the row pointer ``rows`` (module docstring). ``float16``: store a
    float tensor as float16 when every value stays finite (else as it is); ``int8``: as int8 rows with their
    scales (:func:`int8_rows`) when every value is finite. ``symmetric``: ``a`` is (..., k, k) and only its
    upper triangles are kept.
    """
    a = np.asarray(a)
    entry: dict[str, Any] = {"dtype": a.dtype.name, "shape": list(a.shape)}
    values = a
    if symmetric:
        k = a.shape[-1]
        iu = np.triu_indices(k)
        values = values[..., iu[0], iu[1]]
        entry["symmetric"] = True
    if delta is not None:
        if delta != "all" and rows is None:
            raise ValueError(f"delta by rows {delta!r} needs the row pointer")
        values = _gaps(values.reshape(-1), None if delta == "all" else rows)
        entry["delta"] = delta
    if a.dtype.kind in "iu":
        if int_bound is None:
            raise ValueError("an integer tensor needs int_bound")
        width = int_dtype(int_bound)
        if values.size and (values.min() < 0 or values.max() >= min(int_bound, np.iinfo(width).max + 1)):
            raise ValueError(
                f"values in [{values.min()}, {values.max()}] do not fit [0, {int_bound}) as {width.name}"
            )
        values = values.astype(width)
    elif float16 and a.dtype.kind == "f":
        half = values.astype(np.float16)
        if np.isfinite(half).all() or not np.isfinite(values).all():
            values = half
    elif int8 and a.dtype.kind == "f" and a.ndim and np.isfinite(values).all():
        q, scales = int8_rows(values)
        entry["stored"], entry["row_scales"] = "int8", True
        return np.concatenate([_byte_planes(scales).reshape(-1), q.reshape(-1).view(np.uint8)]), entry
    entry["stored"] = values.dtype.name
    values = np.ascontiguousarray(values).reshape(-1)
    if values.dtype.itemsize > 1 and values.size:
        values = _byte_planes(values)
        entry["planes"] = True
    return values, entry


def decode_tensor(stored: np.ndarray, entry: Mapping[str, Any], rows: np.ndarray | None = None) -> np.ndarray:
    """The tensor ``stored`` was encoded from (``rows``: the decoded row pointer its ``delta`` names)."""
    kept = np.dtype(str(entry["stored"]))
    values = np.asarray(stored)
    if entry.get("row_scales"):
        n_rows = int(entry["shape"][0])
        raw = values.reshape(-1).view(np.uint8)
        scales = _from_byte_planes(raw[: 4 * n_rows].reshape(4, n_rows), np.dtype(np.float32))
        values = (raw[4 * n_rows :].view(np.int8).reshape(n_rows, -1) * scales[:, None]).reshape(-1)
    else:
        if entry.get("planes"):
            values = _from_byte_planes(values, kept)
        values = values.reshape(-1).astype(kept, copy=False)
    delta = entry.get("delta")
    if delta is not None:
        values = _undo_gaps(values, None if delta == "all" else rows)
    out_dtype = np.dtype(str(entry["dtype"]))
    shape = tuple(int(s) for s in entry["shape"])
    if entry.get("symmetric"):
        k = shape[-1]
        iu = np.triu_indices(k)
        full = np.empty((*shape[:-2], k, k), dtype=out_dtype)
        upper = values.astype(out_dtype).reshape(*shape[:-2], len(iu[0]))
        full[..., iu[0], iu[1]] = upper
        full[..., iu[1], iu[0]] = upper
        return full
    return values.astype(out_dtype).reshape(shape)


def encode_tensors(
    tensors: Mapping[str, np.ndarray], options: Mapping[str, Mapping[str, Any]]
) -> tuple[dict[str, np.ndarray], dict[str, dict[str, Any]]]:
    """Each tensor's stored form and entry; ``options[name]`` are :func:`encode_tensor`'s keywords (a
    ``delta`` naming a row pointer reads that tensor). A tensor without options is kept as it is."""
    stored: dict[str, np.ndarray] = {}
    entries: dict[str, dict[str, Any]] = {}
    for name, a in tensors.items():
        opts = dict(options.get(name, {}))
        if not opts:
            stored[name] = np.ascontiguousarray(a)
            continue
        delta = opts.get("delta")
        if delta not in (None, "all"):
            opts["rows"] = tensors[delta]
        stored[name], entries[name] = encode_tensor(a, **opts)
    return stored, entries


def decode_tensors(
    stored: Mapping[str, np.ndarray], entries: Mapping[str, Mapping[str, Any]]
) -> dict[str, np.ndarray]:
    """The tensors :func:`encode_tensors` stored (a tensor without an entry is returned as it is)."""
    out = {name: np.asarray(a) for name, a in stored.items() if name not in entries}
    # row pointers first: a delta by rows reads its decoded pointer
    for name in sorted(entries, key=lambda n: entries[n].get("delta") not in (None, "all")):
        entry = entries[name]
        delta = entry.get("delta")
        rows = out[delta] if delta not in (None, "all") else None
        out[name] = decode_tensor(stored[name], entry, rows)
    return out
