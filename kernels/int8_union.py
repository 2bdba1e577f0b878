"""The clustered projection's int8 path (CPU): W quantised once as the full int8 projection holds it, the
logits of a union or a cluster from those int8 rows, which of the two union kernels (a gather, the packed
GEMM over all N) costs less at a step's size (by a table of their measured costs, ``union_costs``, which
:func:`measure_costs` measures on this machine), and whether a step should skip the map altogether.

Every kernel here computes the full int8 layer's own logits on its columns: its integer sums, scaled as it
scales them (``kernels.int8.quantize_input``), so the choice between them changes only the time.
"""

from __future__ import annotations

import functools
import logging
import statistics
import timeit
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from fastvocab import switches
from fastvocab.kernels import int8
from fastvocab.kernels.cluster_assign import PreparedMap
from fastvocab.kernels.popular import (
    map_skipped,
    popularity_order,
    union_over_blocks,
)
from fastvocab.kernels.union_costs import (
    COST_ROWS,
    COST_UNIONS,
    PACKAGED_ORT,
    CostTable,
    costs_from_timings,
    load_cost_table,
    machine,
    time_kernels,
)

log = logging.getLogger(__name__)

# Which of the two int8 union kernels is cheaper, from their per-column costs in microseconds by the rows of
# the step, measured on a machine (``union_costs``: the packaged table, or the one FASTVOCAB_INT8_COSTS names,
# read once, here): the gather per gathered column (random rows read and multiplied) against the packed
# fbgemm GEMM per vocabulary column (W read in order, int8 arithmetic). Neither is linear in rows: on the
# machine of the packaged table (2-core AVX2, d 1024, one thread) the gather wins below a union of 18% of N at
# 1 row, 10-13% at 2-12 rows, 26-35% at 16-32 rows. Between the rows measured the costs are interpolated;
# beyond the last both grow with the rows alike, so its ratio decides. Both kernels give the same logits: the
# choice changes only the time. The packaged tables were measured with the gather that widened its rows to
# float32, which cost 2-4x today's: they keep the dense GEMM for some unions the gather alone would now win.
# Tables measured with today's gather made the 418M shape's greedy batch-32 step run the map instead of the
# dense GEMM, 1.8x slower on two workers (docs/cpu-engine.md, 0023), so they stay.
COST_TABLE = load_cost_table()
INT8_COST_ROWS, INT8_GATHER_US, INT8_DENSE_US = COST_TABLE.rows, COST_TABLE.gather_us, COST_TABLE.dense_us
# The same where the dense GEMM of many rows runs on ONNX Runtime (``Int8Weights.on_ort``): measured on a
# machine with AMX, where it costs about half of fbgemm's (docs/decisions/0019-int8-gemms-on-onnx-runtime.md).
ORT_COST_TABLE = load_cost_table(packaged=PACKAGED_ORT)
ORT_COST_ROWS, ORT_GATHER_US, ORT_DENSE_US = (
    ORT_COST_TABLE.rows,
    ORT_COST_TABLE.gather_us,
    ORT_COST_TABLE.dense_us,
)


@dataclass
class Int8Weights:
    """W and b as the full projection's ``int8`` option holds them, for the clustered projection's int8 path.

    ``full``: the dynamic int8 layer over all N columns (``kernels.int8.int8_linear``: one scale per
    output row, symmetric), its packed rows (fbgemm, and ONNX Runtime for steps of many rows where
    ``kernels.int8.ort_int8``): large unions and rows that get full logits. ``q`` and
    ``scale``: the same int8 rows unpacked, (N, d) and (N,) float32, for gathers. ``blocks[c]``: cluster
    ``c``'s rows packed alone (a cached cluster, the int8 counterpart of ``PreparedMap.blocks``; None when it
    is not cached). Every path computes the layer's own logits on its columns, to float rounding: the
    activations are quantised as the layer quantises them (``kernels.int8.quantize_input``).
    """

    full: int8.PackedRows
    q: torch.Tensor  # (N, d) int8
    scale: torch.Tensor  # (N,) float32
    bias: torch.Tensor | None  # (N,) float32
    blocks: ClusterBlocks  # packed at first use
    cached_bytes: int
    max_norm: float  # max_i ||w_i||: the certificate's bound on what input rounding moves a logit
    max_residual: float  # max_i ||w_i - scale_i q_i||: the same for the weights' rounding
    popular: PopularBlocks | None = None

    @property
    def on_ort(self) -> bool:
        """Whether the dense GEMM of many rows runs on ONNX Runtime (``kernels.int8.PackedRows``), which the
        union kernels' choice prices by its own cost table."""
        return self.full.on_ort


@dataclass
class PopularBlocks:
    """The int8 rows of W in decreasing order of their ids' hit probability (:func:`hit_probability`),
    packed for fbgemm ``switches.INT8_BLOCK_COLUMNS`` rows at a time: a union step runs the packed GEMM on the
    blocks its union fills densely enough and gathers the columns of the rest (:func:`int8_union_logits`).
    Costs ``2 N d`` bytes (fbgemm keeps each block's unpacked copy besides the packed one)."""

    rank: torch.Tensor  # (N,) int64: each id's position in the order
    block_columns: int
    packed: list[int8.PackedRows]  # block j: the ids at positions [j * block_columns, (j + 1) * ...)


class ClusterBlocks(Sequence):
    """``blocks[c]``: cluster ``c``'s int8 rows packed alone for fbgemm, or None for a cluster left out of
    the cache.

    Each cached cluster is packed at its first use, not at load. fbgemm packs per-row scales at ~1.5 us a
    row: 0.7 s for the 2,000 clusters of a demo map on 2 cores, which a one-line translate paid whole for
    the few clusters it reads (a job of 200 lines at batch 1 reads about half of them). Which clusters are
    cached is fixed at load (:meth:`cache`), so a step takes the same path whenever its blocks were
    packed: the outputs do not depend on what ran before."""

    def __init__(
        self, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, ids: Sequence[torch.Tensor]
    ) -> None:
        self._q, self._scale, self._bias, self._ids = q, scale, bias, ids  # ids[c]: cluster c's set
        self._cached = np.zeros(len(ids), dtype=bool)
        self._packed: list[int8.PackedRows | None] = [None] * len(ids)

    def cache(self, c: int) -> None:
        self._cached[c] = True

    def cached(self, c: int) -> bool:
        return bool(self._cached[c])

    def packed_count(self) -> int:
        return sum(p is not None for p in self._packed)

    def __len__(self) -> int:
        return len(self._packed)

    def __getitem__(self, c):  # type: ignore[override]  # an int only: a cluster
        block = self._packed[c]
        if block is None and self._cached[c]:
            ids = self._ids[c]
            bias = None if self._bias is None else self._bias.index_select(0, ids)
            block = int8.packed_rows(self._q.index_select(0, ids), self._scale.index_select(0, ids), bias)
            self._packed[c] = block  # two threads may both pack it: the same block, either is kept
        return block


def int8_weights(
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    pm: PreparedMap,
    *,
    cache_bytes: int = 0,
    hit: np.ndarray | None = None,
) -> Int8Weights:
    """Quantise W once (as ``FullProjection(int8=True)`` does) and cache the most-populated clusters' rows
    packed alone, up to ``cache_bytes`` (each packed block holds its rows twice: fbgemm keeps the unpacked
    copy), each packed at its first use (:class:`ClusterBlocks`). With ``hit`` (the ids' hit probabilities)
    also pack W's rows in popularity order (:class:`PopularBlocks`), for union steps."""
    linear = int8.int8_linear(weight, bias)
    q, scale = int8.int8_rows(linear)
    b = None if bias is None else bias.detach().float().contiguous()
    blocks = ClusterBlocks(q, scale, b, pm.ids)
    row_bytes, used = 2 * q.shape[1], 0
    for c in np.argsort(-pm.population, kind="stable"):
        need = pm.sizes[c] * row_bytes
        if pm.sizes[c] and used + need <= cache_bytes:
            blocks.cache(int(c))
            used += need

    max_norm, max_residual = _int8_residuals(weight, q, scale)
    return Int8Weights(
        full=int8.packed_of(linear, many_rows=True),
        q=q,
        scale=scale,
        bias=b,
        blocks=blocks,
        cached_bytes=used,
        max_norm=max_norm,
        max_residual=max_residual,
        popular=None if hit is None else popular_blocks(q, scale, b, hit),
    )


def popular_blocks(
    q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None, hit: np.ndarray
) -> PopularBlocks:
    """Pack the int8 rows ``q`` in decreasing ``hit`` order, ``switches.INT8_BLOCK_COLUMNS`` at a time."""
    order, rank = popularity_order(hit)
    width = switches.INT8_BLOCK_COLUMNS.get()
    packed = []
    for lo in range(0, len(order), width):
        ids = order[lo : lo + width]
        packed.append(
            int8.packed_rows(
                q.index_select(0, ids),
                scale.index_select(0, ids),
                None if bias is None else bias[ids],
                many_rows=True,  # a union step's: many rows
            )
        )
    return PopularBlocks(rank=rank, block_columns=width, packed=packed)


def _int8_residuals(
    weight: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, rows_per_chunk: int = 1 << 14
) -> tuple[float, float]:
    """``max_i ||w_i||`` and ``max_i ||w_i - scale_i q_i||`` in float32, a chunk of rows at a time."""
    norm = resid = 0.0
    for lo in range(0, weight.shape[0], rows_per_chunk):
        w = weight[lo : lo + rows_per_chunk].float()
        deq = q[lo : lo + rows_per_chunk].float() * scale[lo : lo + rows_per_chunk, None]
        norm = max(norm, float(w.norm(dim=1).max()))
        resid = max(resid, float((w - deq).norm(dim=1).max()))
    return norm, resid


def int8_logit_error(h: torch.Tensor, w8: Int8Weights) -> torch.Tensor:
    """Per row, a bound on ``|z_i - z8_i|`` over every column i, (rows,) float32: how far an int8 logit
    ``z8_i`` (the int8 layer's, of the batch ``h``) can be from the float32 logit ``z_i`` the certificate's
    tables bound. With the input quantised as ``s a`` (``kernels.int8.quantize_input``) and ``w_i`` as
    ``scale_i q_i``: ``z_i - z8_i = (h - s a)·w_i + s a·(w_i - scale_i q_i)``, at most
    ``||h - s a|| max||w_i|| + ||s a|| max||w_i - scale_i q_i||`` (Cauchy-Schwarz). The input's rounding is
    known per call, so the bound is a few percent of the certificate's own slope, not the worst case."""
    ints, h_scale = int8.quantize_input(h)
    deq = ints * h_scale  # (rows, d)
    return (h.float() - deq).norm(dim=1) * w8.max_norm + deq.norm(dim=1) * w8.max_residual


def int8_full_logits(h: torch.Tensor, w8: Int8Weights) -> torch.Tensor:
    """All N columns through the int8 layer, (rows, N) float32."""
    return int8.linear_packed(h.float().contiguous(), w8.full)


def int8_gathered_logits(h: torch.Tensor, w8: Int8Weights, cols: torch.Tensor) -> torch.Tensor:
    """Logits of columns ``cols`` only from the int8 rows, (rows, C) float32: the layer's logits on them.

    :func:`int8_gather_gemm` for small unions; otherwise the layer over all N, keeping ``cols``
    (:func:`int8_dense_cheaper`).
    """
    if int8_dense_cheaper(cols.numel(), h.shape[0], w8.q.shape[0], w8.on_ort):
        return int8_full_logits(h, w8).index_select(1, cols)
    return int8_gather_gemm(h, w8, cols)


def int8_union_logits(h: torch.Tensor, w8: Int8Weights, cols: torch.Tensor) -> torch.Tensor:
    """Logits of the union ``cols`` (sorted ids), (rows, C) float32, the layer's own on each column.

    Without :class:`PopularBlocks`: :func:`int8_gathered_logits`. With them, each block of the popularity
    order runs the packed GEMM over all its columns when the union holds enough of them that this costs less
    than gathering those (:func:`int8_dense_cheaper` on the block), keeping the union's; the union's other
    columns are gathered in one :func:`int8_gather_gemm`. Many rows' unions are dense in the popular blocks
    and sparse in the rest, so this is cheaper than either kernel over the whole union.
    """
    pb = w8.popular
    if pb is None:
        return int8_gathered_logits(h, w8, cols)
    n_vocab = w8.q.shape[0]
    width = pb.block_columns
    smallest = n_vocab - width * (-(-n_vocab // width) - 1)  # the last block's ids: the cheapest run dense
    if not int8_dense_cheaper(cols.numel(), h.shape[0], smallest, w8.on_ort):
        # even all of it in one block would be gathered: no block runs dense, skip the bookkeeping
        return int8_gather_gemm(h, w8, cols)
    x = h.float().contiguous()
    logits = union_over_blocks(
        h,
        cols,
        pb.rank,
        pb.block_columns,
        n_vocab,
        functools.partial(int8_dense_cheaper, on_ort=w8.on_ort),
        lambda j: int8.linear_packed(x, pb.packed[j]),
        lambda c: int8_gather_gemm(h, w8, c),
        full=lambda: int8_full_logits(h, w8),
    )
    return int8_gather_gemm(h, w8, cols) if logits is None else logits


def int8_dense_cheaper(
    columns: int | np.ndarray, rows: int, n_vocab: int | np.ndarray, on_ort: bool = False
) -> bool | np.ndarray:
    """Whether ``rows`` rows cost less over all ``n_vocab`` columns (packed int8 GEMM) than over ``columns``
    gathered ones (the measured costs :data:`INT8_GATHER_US`, :data:`INT8_DENSE_US` at ``rows``; with
    ``on_ort``, :data:`ORT_GATHER_US`, :data:`ORT_DENSE_US`). ``columns`` and ``n_vocab`` may be arrays (one
    decision per block of :class:`PopularBlocks`)."""
    table_rows, gather_us, dense_us = (
        (ORT_COST_ROWS, ORT_GATHER_US, ORT_DENSE_US)
        if on_ort
        else (INT8_COST_ROWS, INT8_GATHER_US, INT8_DENSE_US)
    )
    gather = columns * float(np.interp(rows, table_rows, gather_us))
    return gather > n_vocab * float(np.interp(rows, table_rows, dense_us))


def int8_map_skipped(
    hit: np.ndarray, draws: int, rows: int, n_vocab: int, width: int | None, on_ort: bool = False
) -> bool:
    """:func:`~fastvocab.kernels.popular.map_skipped` by the int8 kernels' costs (``on_ort``: as
    :func:`int8_dense_cheaper`)."""
    return map_skipped(hit, draws, rows, n_vocab, width, functools.partial(int8_dense_cheaper, on_ort=on_ort))


def int8_gather_gemm(h: torch.Tensor, w8: Int8Weights, cols: torch.Tensor) -> torch.Tensor:
    """The input quantised as the layer does, the int8 rows ``cols`` gathered and multiplied (int32 sums: the
    layer's own), scaled back as the layer scales them. (rows, C) float32. The multiply is this machine's
    fastest at the step's rows (:func:`gather_multiply`): ``torch._int_mm``, a compiled loop that reads the
    rows in place, or the same integers summed in float32, exact at the widths that allow it."""
    rows, d = h.shape[0], w8.q.shape[1]
    ints, h_scale = int8.quantize_input(h)
    how = gather_multiply(d, rows <= FEW_ROWS)
    if how == "float32":
        acc = _float32_sums(ints, w8.q, cols)
    elif how == "compiled":
        acc = _compiled_sums(ints.to(torch.int8), w8.q, cols)
    else:
        acc = _int_mm_sums(ints.to(torch.int8), w8.q, cols)  # the integers lie in [-127, 127]
    logits = acc.float().mul_(h_scale * w8.scale.index_select(0, cols))
    return logits if w8.bias is None else logits.add_(w8.bias.index_select(0, cols))


def _int_mm_sums(x8: torch.Tensor, q: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``x8 @ q[cols].T`` in int32 by ``torch._int_mm``, the rows gathered a cache-sized block at a time,
    (rows, C)."""
    c, rows, d = cols.numel(), x8.shape[0], q.shape[1]
    step = max(1, switches.INT8_GATHER_CHUNK_BYTES.get() // d)
    if c <= step:  # one block: no buffers to reuse, fewer operations (they dominate at a few rows)
        return torch._int_mm(x8, q.index_select(0, cols).t())
    buf = torch.empty((step, d), dtype=torch.int8)
    acc_t = torch.empty((c, rows), dtype=torch.int32)  # (C, rows): each block fills contiguous rows
    x8_t = x8.t()
    for lo in range(0, c, step):
        sel = cols[lo : lo + step]
        n = sel.numel()
        torch.index_select(q, 0, sel, out=buf[:n])
        torch._int_mm(buf[:n], x8_t, out=acc_t[lo : lo + n])
    return acc_t.t()


def _float32_sums(ints: torch.Tensor, q: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``ints @ q[cols].T`` with the int8 rows widened to float32 a block at a time, (rows, C) float32: the
    int32 sums themselves while ``d * 127**2 < 2**24`` (:data:`EXACT_FLOAT32_DIM`), float rounding beyond."""
    c, rows, d = cols.numel(), ints.shape[0], q.shape[1]
    step = max(1, _FLOAT32_CHUNK_BYTES // (4 * d))
    buf8 = torch.empty((min(step, c), d), dtype=torch.int8)
    buf = torch.empty((min(step, c), d), dtype=torch.float32)
    acc_t = torch.empty((c, rows), dtype=torch.float32)
    x_t = ints.t()
    for lo in range(0, c, step):
        sel = cols[lo : lo + step]
        n = sel.numel()
        torch.index_select(q, 0, sel, out=buf8[:n])
        buf[:n].copy_(buf8[:n])
        torch.mm(buf[:n], x_t, out=acc_t[lo : lo + n])
    return acc_t.t()


def _compiled_sums(x8: torch.Tensor, q: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``x8 @ q[cols].T`` in int32 by :func:`_dot_gathered`, which reads each row of ``q`` in place (no
    gathered copy), (rows, C)."""
    out = np.empty((x8.shape[0], cols.numel()), dtype=np.int32)
    _dot_gathered()(x8.numpy(), q.numpy(), cols.numpy(), out)
    return torch.from_numpy(out)


@functools.cache
def _dot_gathered() -> Callable[..., None]:
    """:func:`_dot_gathered_loop` compiled, at its first use: importing numba costs a greedy translate
    0.2-0.3 s that it otherwise does not pay."""
    from fastvocab.kernels.jit import njit

    return njit(boundscheck=False)(_dot_gathered_loop)


def _dot_gathered_loop(x: np.ndarray, q: np.ndarray, cols: np.ndarray, out: np.ndarray) -> None:
    rows, d = x.shape
    for j in range(cols.shape[0]):
        c = cols[j]
        for r in range(rows):
            acc = np.int32(0)
            for k in range(d):
                acc += np.int32(x[r, k]) * np.int32(q[c, k])
            out[r, j] = acc


# A float32 sum of int8 x int8 products is exact while it stays below 2**24: at widths up to this one.
EXACT_FLOAT32_DIM = 2**24 // 127**2
# The float32 multiply's buffer: 1 MiB of widened rows. On the AVX2 EPYC blocks of 256 rows at d 512
# (0.5 MiB) took 4.2 ms at 32 rows x 4,500 columns, one block of all of them 7.0; 1 MiB is 256 rows at d 1024.
_FLOAT32_CHUNK_BYTES = 1 << 20
# Steps of this many rows or fewer are "few" (the compiled loop's regime: a batch-1 beam, a per-row group).
FEW_ROWS = 4
# The others must be this much faster than torch._int_mm to be chosen: a near tie keeps the library's op.
GATHER_MARGIN = 1.5
MULTIPLIES = ("int_mm", "compiled", "float32")


@functools.cache
def gather_multiply(d: int, few_rows: bool = False) -> str:
    """How the int8 gather multiplies at width ``d`` on this machine, for steps of ``FEW_ROWS`` rows or
    fewer (``few_rows``) or more: ``"int_mm"`` (``torch._int_mm``), ``"compiled"`` (:func:`_compiled_sums`)
    or ``"float32"`` (:func:`_float32_sums`), measured once per process, width and regime (milliseconds).

    ``torch._int_mm`` on CPU runs oneDNN's int8 GEMM where the CPU has the instructions oneDNN wants for it
    (VNNI) and a plain loop elsewhere: on a 2-core AMD EPYC with AVX2 only (Zen 3) it took 60-80 ms at 32
    rows x 4,500 columns x d 512, where the float32 sums took 4 ms; at one row the compiled loop, which reads
    the rows in place, took 0.3 ms against the float32 sums' 1.3. A rule by CPU flags guesses; this times
    each on one thread at 1 or 32 rows over 256 random int8 rows (the median of 3 calls, after one), and
    takes the fastest if it beats ``torch._int_mm`` ``GATHER_MARGIN`` times; the compiled loop only for few
    rows, the float32 sums only where they are exact (``d <= EXACT_FLOAT32_DIM``). Timing the compiled loop
    imports numba and loads the loop from its cache, once a process: 0.8 s on that EPYC, paid at the first
    gather of a few rows (none in the demo model's steps: its clusters' blocks are cached).
    ``FASTVOCAB_INT8_GATHER`` (``switches.INT8_GATHER``) names one instead."""
    named = switches.INT8_GATHER.get()
    if named != "auto":
        return named
    rows = 1 if few_rows else 32
    g = torch.Generator().manual_seed(0)
    q = torch.randint(-127, 128, (256, d), dtype=torch.int8, generator=g)
    ints = torch.randint(-127, 128, (rows, d), generator=g).float()
    cols = torch.arange(0, 256, dtype=torch.int64)
    x8 = ints.to(torch.int8)
    runs: dict[str, Callable[[], object]] = {"int_mm": lambda: _int_mm_sums(x8, q, cols)}
    if few_rows:  # at many rows it lost to the float32 sums at real sizes (4,500 columns: 6.3 ms against 4.2)
        runs["compiled"] = lambda: _compiled_sums(x8, q, cols)
    if d <= EXACT_FLOAT32_DIM:
        runs["float32"] = lambda: _float32_sums(ints, q, cols)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the gather serves one-thread workers
    try:
        times = {name: _median_call(fn) for name, fn in runs.items()}
    finally:
        torch.set_num_threads(threads)
    best = min(times, key=times.__getitem__)
    choice = best if times["int_mm"] > GATHER_MARGIN * times[best] else "int_mm"
    log.info(
        "int8 gather at d %d, %s rows: %s (%d rows x 256 columns on one thread: %s)",
        d,
        f"{FEW_ROWS} or fewer" if few_rows else f"over {FEW_ROWS}",
        choice,
        rows,
        ", ".join(f"{name} {1e6 * t:.0f} us" for name, t in times.items()),
    )
    return choice


def _median_call(fn: Callable[[], object], calls: int = 3) -> float:
    fn()
    return statistics.median(timeit.repeat(fn, number=1, repeat=calls))


def int8_cluster_logits(h: torch.Tensor, w8: Int8Weights, pm: PreparedMap, c: int) -> torch.Tensor:
    """Logits of rows ``h`` (all in cluster ``c``) over the cluster's own set from the int8 rows."""
    block = w8.blocks[c]
    if block is not None:
        return int8.linear_packed(h.float().contiguous(), block)  # packed once: no gather, int8 GEMM
    return int8_gathered_logits(h, w8, pm.ids[c])


def measure_costs(
    d: int = 1024,
    n_vocab: int = 128_112,
    rows: Sequence[int] = COST_ROWS,
    unions: Sequence[float] = COST_UNIONS,
    repeats: int = 5,
) -> CostTable:
    """This machine's int8 cost table: both union kernels timed on random weights (``n_vocab``, ``d``), int8
    as :func:`int8_weights` holds them (:func:`~fastvocab.kernels.union_costs.time_kernels`). The defaults
    are the packaged table's sizes."""
    gen = torch.Generator().manual_seed(0)
    linear = int8.int8_linear(torch.randn(n_vocab, d, generator=gen) * d**-0.5, None)
    q, scale = int8.int8_rows(linear)
    # the dense GEMM as a projection runs it: on ONNX Runtime from ORT_MIN_ROWS rows where int8.ort_int8()
    full = int8.packed_of(linear, many_rows=True)
    w8 = Int8Weights(
        full,
        q,
        scale,
        bias=None,
        blocks=ClusterBlocks(q, scale, None, []),
        cached_bytes=0,
        max_norm=0.0,
        max_residual=0.0,
    )
    kernels = {
        "int8-gather": lambda h, cols: int8_gather_gemm(h, w8, cols),
        "int8-dense": lambda h, cols: _dense_columns(h, w8, cols),
    }
    timings = time_kernels(kernels, d, n_vocab, rows, unions, repeats)
    measured_on = {**machine(d, n_vocab, unions, repeats), "int8_gemm": int8.many_rows_gemm(d)}
    return costs_from_timings(timings, n_vocab, measured_on)


def _dense_columns(h: torch.Tensor, w8: Int8Weights, cols: torch.Tensor) -> torch.Tensor:
    """The packed GEMM over all N, then the columns ``cols``: :func:`int8_gathered_logits` run dense."""
    return int8_full_logits(h, w8).index_select(1, cols)
