"""LSH vocabulary selection (Hoang et al. 2022): SimHash codes, per-row top-k by Hamming distance.

Offline, every output embedding ``w_i`` is hashed to ``c`` bits, ``H_R(w) = [w R >= 0]`` with ``R`` (d, c):
a Gaussian random rotation when ``c != d`` (as Faiss ``IndexLSH`` builds it and Marian uses it: orthonormal
columns by QR for ``c <= d``; for ``c > d`` a (c, c) orthonormal matrix with rows dropped down to d), the
identity when ``c == d`` (Marian hashes the raw coordinates then). At each step every decoder state is
hashed the same way, its ``k`` entries of smallest Hamming distance are its candidates (ties: lowest id first,
so the set is the same on every device), and only their logits ``w_i h + b_i`` are computed. Candidates are
per row (ids (rows, k)): no union over the batch or the beam (the paper's Sec. 3, point 3).

As in the paper the softmax normaliser is taken over the candidates only (``log_inactive_mass`` is None):
greedy search is unaffected, beam search compares slightly inflated probabilities (the paper's Sec. 5.5).

The hash ignores the output bias (the paper's step from Eq. 4 to Eq. 5): on a model whose bias is large
against the spread of ``W h``, the best token is often not among the candidates (Table 3: 100% search errors).
The projection checks this once, on its first call (see :func:`bias_spread_ratio`), and logs a warning.

Hamming distances, two backends chosen once in ``__init__`` from the device (never in the hot loop):

- ``numpy`` (CPU): codes as uint64 words, ``np.bitwise_count`` (hardware popcount, numpy >= 2.0);
- ``torch`` (CPU or CUDA): the same words as int64 and a SWAR popcount in torch bit operations (torch has no
  popcount op; :func:`popcount64` is the hand-written part). It is also the oracle of the numpy path.

The codes of ``W`` are the offline artifact (:func:`build_lsh_index`, a ``MethodIndex`` "lsh" for every
direction, arrays ``projection`` (d, c) float32 and ``codes`` (N, 8 * words) uint8, the little-endian bytes
of the int64 words: bit ``j`` of word ``w`` is hash bit ``64 w + j``). Without ``index=`` the projection
builds the same codes in memory from the same seed (one (N, d) x (d, c) product: well under a second at
N=32K); the signature is the same either way.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

import numpy as np
import torch
import torch.nn.functional as F

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.method_index import ANY_DIRECTION, MethodIndex, method_index_for, new_index
from fastvocab.kernels.base import Projection, ProjectionOutput, register
from fastvocab.kernels.options import (
    INDEX_FLAG,
    ArtifactPath,
    Flag,
    MethodOptions,
    candidates_flag,
    check_count,
    option,
)

log = logging.getLogger(__name__)
P = TypeVar("P")

BACKENDS = ("auto", "numpy", "torch")
DEFAULT_BITS = 256
# Warn when the bias's spread is this share of the bias-free logits' spread (bias_spread_ratio).
BIAS_WARN_RATIO = 0.25
# Elements of the (rows, N) per-word temporaries; larger batches are hashed against W in row chunks.
CHUNK_ELEMENTS = 1 << 24
# Per-row candidate logits: when the candidates of all rows together reach this share of N, one dense GEMM
# then a gather is cheaper than gathering rows * C embedding rows (and it equals the full logits exactly).
DENSE_SHARE = 0.5

_M1 = 0x5555555555555555
_M2 = 0x3333333333333333
_M4 = 0x0F0F0F0F0F0F0F0F


@dataclass(frozen=True)
class LshParams:
    """What the codes of W are built with (the artifact's parameters)."""

    bits: int = DEFAULT_BITS  # c, hash bits per vector
    seed: int = 0  # of the random rotation
    rotate: bool | None = None  # None: rotate when bits != d (Marian, Faiss IndexLSH); False needs bits == d

    def __post_init__(self) -> None:
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or self.bits < 1:
            raise ValueError(f"bits must be an integer >= 1, got {self.bits!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")

    def rotates(self, d: int) -> bool:
        if self.rotate is None:
            return self.bits != d
        if not self.rotate and self.bits != d:
            raise ValueError(
                f"rotate=False hashes the raw coordinates: it needs bits == d ({d}), got {self.bits}"
            )
        return bool(self.rotate)


# ---------------------------------------------------------------------------------------------- the hash


def rotation_matrix(d: int, bits: int, seed: int) -> np.ndarray:
    """Gaussian random rotation (d, bits) float32, orthonormal as Faiss's ``RandomRotationMatrix``: for
    ``bits <= d`` orthonormal columns, else a (bits, bits) orthonormal matrix with rows dropped to d."""
    rng = np.random.default_rng(seed)
    if bits <= d:
        q, _ = np.linalg.qr(rng.standard_normal((d, bits)))  # (d, bits)
        return q.astype(np.float32)
    q, _ = np.linalg.qr(rng.standard_normal((bits, bits)))  # (bits, bits)
    return np.ascontiguousarray(q[:d, :], dtype=np.float32)


def projection_matrix(d: int, params: LshParams) -> np.ndarray:
    """The (d, c) matrix R of ``H_R(v) = [v R >= 0]``: a random rotation, or the identity."""
    if params.rotates(d):
        return rotation_matrix(d, params.bits, params.seed)
    return np.eye(d, dtype=np.float32)


def n_words(bits: int) -> int:
    return (bits + 63) // 64


def hash_codes_numpy(x: np.ndarray, projection: np.ndarray) -> np.ndarray:
    """SimHash codes of the rows of ``x`` (n, d): (n, words) int64 (bits padded with zeros to 64 each)."""
    bits = projection.shape[1]
    words = n_words(bits)
    out = np.empty((x.shape[0], words), dtype=np.int64)
    step = max(1, CHUNK_ELEMENTS // max(bits, 1))
    for lo in range(0, x.shape[0], step):
        signs = (np.asarray(x[lo : lo + step], dtype=np.float32) @ projection) >= 0  # (n', c)
        signs = np.pad(signs, ((0, 0), (0, 64 * words - bits)))
        packed = np.packbits(signs, axis=1, bitorder="little")  # (n', 8 * words) uint8
        out[lo : lo + step] = packed.view("<i8")
    return out


def pack_bits_torch(signs: torch.Tensor) -> torch.Tensor:
    """(rows, c) bool -> (rows, words) int64, bit ``j`` of word ``w`` = column ``64 w + j``."""
    rows, bits = signs.shape
    words = n_words(bits)
    padded = F.pad(signs.to(torch.int64), (0, 64 * words - bits)).view(rows, words, 64)
    # 1 << 63 wraps to INT64_MIN: the sum of distinct powers of two is their bitwise OR, no carry.
    weights = torch.ones(64, dtype=torch.int64, device=signs.device) << torch.arange(64, device=signs.device)
    return (padded * weights).sum(dim=-1)


def popcount64(x: torch.Tensor) -> torch.Tensor:
    """Set bits of each int64 (SWAR; torch has no popcount). Arithmetic shifts are safe: every mask clears
    the bits a sign extension fills in."""
    x = x - ((x >> 1) & _M1)
    x = (x & _M2) + ((x >> 2) & _M2)
    x = (x + (x >> 4)) & _M4  # one count per byte, top bit clear from here on
    x = x + (x >> 8)
    x = x + (x >> 16)
    x = x + (x >> 32)
    return x & 0x7F


def hamming_torch(queries: torch.Tensor, codes_t: torch.Tensor) -> torch.Tensor:
    """Hamming distances (rows, N) int32 between query words (rows, words) and codes_t (words, N)."""
    rows, words = queries.shape
    n = codes_t.shape[1]
    dist = torch.zeros((rows, n), dtype=torch.int32, device=queries.device)
    for w in range(words):  # one (rows, N) temporary per word instead of (rows, N, words)
        dist += popcount64(queries[:, w : w + 1] ^ codes_t[w][None, :]).to(torch.int32)
    return dist


def hamming_numpy(queries: np.ndarray, codes_t: np.ndarray) -> np.ndarray:
    """As :func:`hamming_torch`, numpy's hardware popcount; uint64 words (rows, words), (words, N)."""
    rows, words = queries.shape
    n = codes_t.shape[1]
    dist = np.zeros((rows, n), dtype=np.uint16)
    xor = np.empty((rows, n), dtype=np.uint64)  # buffers reused across words: no temporaries per pass
    count = np.empty((rows, n), dtype=np.uint8)
    for w in range(words):
        np.bitwise_xor(queries[:, w : w + 1], codes_t[w][None, :], out=xor)
        np.bitwise_count(xor, out=count)
        np.add(dist, count, out=dist)
    return dist


def nearest_codes(dist: torch.Tensor, k: int) -> torch.Tensor:
    """Ids of the k smallest distances per row, (rows, k) int64 in ascending id order; ties at the k-th
    distance go to the lower ids (the paper's "first k found" of a linear scan, and the same set on every
    device)."""
    n = dist.shape[1]
    key = dist.to(torch.int64) * n + torch.arange(n, device=dist.device)  # (rows, N), all distinct
    ids = torch.topk(key, k, dim=1, largest=False, sorted=False).indices
    return ids.sort(dim=1).values


def nearest_codes_numpy(dist: np.ndarray, k: int) -> np.ndarray:
    """:func:`nearest_codes` by counting: distances are small integers (0..c), so a histogram finds each
    row's k-th distance t and the set is every id below t plus the lowest ids at t. No sort over N."""
    rows = dist.shape[0]
    out = np.empty((rows, k), dtype=np.int64)
    for r in range(rows):
        d = dist[r]
        below = np.cumsum(np.bincount(d))  # below[t] = ids with distance <= t
        t = int(np.searchsorted(below, k))  # smallest t with at least k ids at distance <= t
        inner = np.flatnonzero(d < t)
        at = np.flatnonzero(d == t)[: k - inner.size]
        out[r] = np.sort(np.concatenate([inner, at]))
    return out


# ---------------------------------------------------------------------------------------------- shared steps


def with_always_active(
    ids: torch.Tensor, always_active: torch.Tensor, n_vocab: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the always-active ids to every row's candidates: (rows, C + A) ids and a (rows, C + A) mask of
    the positions to pad (an always-active id the row already has, or ``ids < 0`` from a search that found
    fewer than C entries; those positions repeat a valid id, as ``ProjectionOutput`` asks)."""
    missing = ids < 0
    if missing.any():
        ids = torch.where(missing, ids[:, :1].clamp(min=0), ids)
    if always_active.numel() == 0:
        return ids, missing
    rows = ids.shape[0]
    have = torch.zeros((rows, n_vocab), dtype=torch.uint8, device=ids.device)
    # amax: a padded position repeats a real id, and must not clear it whatever order scatter writes in
    have = have.scatter_reduce(1, ids, (~missing).to(torch.uint8), reduce="amax")
    dup = have[:, always_active].bool()  # (rows, A)
    extra = always_active[None, :].expand(rows, -1)
    return torch.cat([ids, extra], dim=1), torch.cat([missing, dup], dim=1)


def candidate_logits(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, ids: torch.Tensor, pad: torch.Tensor
) -> torch.Tensor:
    """Exact logits of per-row candidates ``ids`` (rows, C); ``-inf`` where ``pad``.

    Few candidates in all: each row against its own gathered embeddings (one batched GEMV). Many (rows * C
    >= DENSE_SHARE * N, e.g. a large batch or k close to N): the dense GEMM then a gather, bit for bit the
    full projection's logits.
    """
    rows, c = ids.shape
    n = weight.shape[0]
    if rows * c >= DENSE_SHARE * n:
        logits = F.linear(h, weight, bias).gather(1, ids)
    else:
        w = weight[ids]  # (rows, C, d)
        logits = torch.bmm(w, h[:, :, None])[:, :, 0]  # (rows, C)
        if bias is not None:
            logits = logits + bias[ids]
    return logits.masked_fill(pad, -math.inf)


class CandidateSource(Protocol):
    """What :func:`candidates_output` reads of a candidate-picking projection (LSH, the graph search)."""

    n_vocab: int
    always_active: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None

    def candidates(self, h: torch.Tensor) -> torch.Tensor: ...


def candidates_output(projection: CandidateSource, h: torch.Tensor, k: int) -> ProjectionOutput:
    """The output of a method that picks ``k`` candidates per row (``projection.candidates(h)``: LSH, the
    graph search): their exact logits, with the always-active ids added; no rows give an empty output."""
    if h.shape[0] == 0:
        return ProjectionOutput(
            h.new_empty((0, k)), torch.zeros((0, k), dtype=torch.int64, device=h.device), projection.n_vocab
        )
    ids, pad = with_always_active(projection.candidates(h), projection.always_active, projection.n_vocab)
    logits = candidate_logits(h, projection.weight, projection.bias, ids, pad)
    return ProjectionOutput(logits=logits, ids=ids, n_vocab=projection.n_vocab, scratch=True)


def bias_spread_ratio(weight: torch.Tensor, bias: torch.Tensor | None, h: torch.Tensor) -> float:
    """How much the output bias can reorder the logits that a bias-blind selection ranks.

    ``std_i(b_i) / median_rows std_i(w_i h)``: the bias's spread over the vocabulary against the spread of
    the bias-free logits of real decoder states ``h``. 0 for a model without bias. At 1 the bias moves a
    token as far as its own score does; Hoang et al.'s models with bias (Table 3) fail completely, their
    bias-free models are the ones LSH serves.
    """
    if bias is None or h.shape[0] == 0:
        return 0.0
    b_std = float(bias.float().std())
    if b_std == 0.0:
        return 0.0
    z = F.linear(h.float(), weight.float())  # (rows, N) bias-free logits
    spread = float(z.std(dim=1).median())
    return math.inf if spread == 0.0 else b_std / spread


def manifest_params(cls: type[P], idx: MethodIndex, given: Mapping[str, object]) -> P:
    """The index's build parameters as ``cls``; ArtifactError when its manifest does not fit them, ValueError
    when an option the caller ``given`` (not None) contradicts them."""
    raw: dict[str, Any] = dict(idx.manifest.params)
    try:
        params = cls(**raw)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{idx.manifest.method} index: bad parameters {raw}: {exc}") from exc
    for name, value in given.items():
        if value is not None and value != getattr(params, name):
            raise ValueError(
                f"{name}={value!r} differs from the index's {name}={getattr(params, name)!r}: "
                "leave it out, or build an index with it"
            )
    return params


def check_int(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------- the artifact


def build_lsh_index(
    weight: torch.Tensor | np.ndarray,
    params: LshParams,
    *,
    fingerprint: str,
    direction: str = ANY_DIRECTION,
) -> MethodIndex:
    """SimHash codes of every output embedding (rows of ``weight`` (N, d)): the "lsh" artifact."""
    t0 = time.perf_counter()
    w = weight.detach().float().cpu().numpy() if isinstance(weight, torch.Tensor) else np.asarray(weight)
    n, d = w.shape
    proj = projection_matrix(d, params)
    codes = hash_codes_numpy(w, proj)  # (N, words) int64
    return new_index(
        "lsh",
        model_fingerprint=fingerprint,
        direction=direction,
        n_vocab=n,
        d=d,
        params=asdict(params),
        tensors={"projection": proj, "codes": codes.view(np.uint8)},
        build_seconds=time.perf_counter() - t0,
        extra={"words": int(codes.shape[1]), "rotated": params.rotates(d)},
    )


# ---------------------------------------------------------------------------------------------- the method


@dataclass(frozen=True)
class LshOptions(MethodOptions):
    """What a user chooses of the lsh method: its codes (``index``; None: hashed from W at load) and the
    candidates a row gets (``k``; None: the projection's 128), ``bits`` without an index (None: 256)."""

    method: ClassVar[str] = "lsh"

    index: ArtifactPath | None = option(None, INDEX_FLAG)
    k: int | None = option(
        None, candidates_flag("vocabulary entries per decoder row by Hamming distance", "128")
    )
    bits: int | None = option(
        None,
        Flag(
            "--bits", "without --index: hash bits, an index fixes them", type=int, metavar="C", default="256"
        ),
    )

    def __post_init__(self) -> None:
        check_count("k", self.k, 1)
        check_count("bits", self.bits, 1)


@register("lsh", LshOptions)
class LshProjection(Projection):
    """SimHash vocabulary selection over this model's W (refuses an index built for another model).

    Options: ``k`` (candidates per row, from Hamming distance; always-active ids come on top), ``bits``
    (c), ``seed`` and ``rotate`` (the hash; taken from ``index`` when one is given, where a different value
    is an error), ``index`` (a :class:`MethodIndex` or an index folder; None: codes built in memory),
    ``backend`` (auto | numpy | torch), ``check_bias`` (warn once, on the first call, when
    :func:`bias_spread_ratio` of its states exceeds ``BIAS_WARN_RATIO``).
    """

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        k: int = 128,
        bits: int | None = None,
        seed: int | None = None,
        rotate: bool | None = None,
        index: MethodIndex | str | Path | None = None,
        backend: str = "auto",
        check_bias: bool = True,
        **common: Any,  # always_active, fingerprint: see Projection
    ) -> None:
        super().__init__(weight, bias, **common)
        self.k = min(check_int("k", k, 1), self.n_vocab)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}; got {backend!r}")
        if backend == "numpy" and self.device.type != "cpu":
            raise ValueError(f"backend 'numpy' needs the weight on the CPU; it is on {self.device}")
        self.backend = "numpy" if backend == "auto" and self.device.type == "cpu" else backend
        if self.backend == "auto":
            self.backend = "torch"
        given = {"bits": bits, "seed": seed, "rotate": rotate}
        if index is None:
            self.params = LshParams(
                bits=DEFAULT_BITS if bits is None else bits, seed=0 if seed is None else seed, rotate=rotate
            )
            self.index_digest = None
            idx = build_lsh_index(self.weight, self.params, fingerprint=self.fingerprint)
        else:
            idx = method_index_for(
                index,
                "lsh",
                fingerprint=self.fingerprint,
                n_vocab=self.n_vocab,
                d=self.d,
                required=("projection", "codes"),
            )
            self.params = manifest_params(LshParams, idx, given)
            self.index_digest = idx.manifest.tensors_digest
        proj = np.asarray(idx.tensors["projection"], dtype=np.float32)
        words = n_words(self.params.bits)
        codes = np.ascontiguousarray(idx.tensors["codes"]).view("<i8").reshape(self.n_vocab, words)
        if proj.shape != (self.d, self.params.bits):
            raise ArtifactError(
                f"lsh index: projection is {proj.shape}, expected {(self.d, self.params.bits)}"
            )
        self._proj = torch.from_numpy(proj).to(self.device)  # (d, c) float32
        codes_t = np.ascontiguousarray(codes.T)  # (words, N): one contiguous row per word
        if self.backend == "numpy":
            self._codes_np = codes_t.view(np.uint64)
        else:
            self._codes_t = torch.from_numpy(codes_t).to(self.device)
        self._check_bias = bool(check_bias) and bias is not None
        self.bias_ratio: float | None = None

    def options(self) -> dict[str, object]:
        return {
            "k": self.k,
            "bits": self.params.bits,
            "seed": self.params.seed,
            "rotate": self.params.rotates(self.d),
            "backend": self.backend,
        }

    def hash(self, h: torch.Tensor) -> torch.Tensor:
        """SimHash words of decoder states (rows, d): (rows, words) int64 on the device."""
        return pack_bits_torch((h.float() @ self._proj) >= 0)

    def candidates(self, h: torch.Tensor) -> torch.Tensor:
        """The k ids of smallest Hamming distance per row, (rows, k) int64, ascending ids."""
        rows = h.shape[0]
        q = self.hash(h)
        step = max(1, CHUNK_ELEMENTS // self.n_vocab)
        out = []
        for lo in range(0, rows, step):
            if self.backend == "numpy":
                qn = q[lo : lo + step].cpu().numpy().view(np.uint64)
                ids = nearest_codes_numpy(hamming_numpy(qn, self._codes_np), self.k)
                out.append(torch.from_numpy(ids))
            else:
                out.append(nearest_codes(hamming_torch(q[lo : lo + step], self._codes_t), self.k))
        return torch.cat(out) if len(out) > 1 else out[0]

    def _project(self, h: torch.Tensor) -> ProjectionOutput:
        if self._check_bias and h.shape[0] > 0:
            self._check_bias = False  # once: it costs one full projection
            self.bias_ratio = bias_spread_ratio(self.weight, self.bias, h)
            if self.bias_ratio > BIAS_WARN_RATIO:
                log.warning(
                    "lsh: the output bias spreads %.2f times as far as the bias-free logits (std over the "
                    "vocabulary, first batch); SimHash ignores the bias (Hoang et al. 2022, Sec. 5.1), so "
                    "expect search errors: use a model trained without output bias, or another method",
                    self.bias_ratio,
                )
        return candidates_output(self, h, self.k)
