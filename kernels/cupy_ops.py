"""CuPy kernels of the clustered projection: all raw CUDA source and every launch, as thin typed wrappers
over torch CUDA tensors. Imported lazily: only ``ClusteredProjection(backend="cupy")`` and the
GPU tests import this module, so the core imports without CuPy.

Each kernel has a torch twin in ``cluster_assign`` or ``gather`` (the oracle in
tests/gpu/test_cupy_kernels.py):

=====================  ==============================================  ======================================
wrapper                what it does                                    torch twin
=====================  ==============================================  ======================================
``assign``             Eq. 2 argmin over the centroid GEMM output      ``assign_clusters`` (after the GEMM)
``mark_active``        boolean mask over N from the rows' CSR ranges   ``union_columns`` (mask half)
``compact``            mask -> sorted column ids (scan + scatter)      ``union_columns`` (nonzero half)
``group_rows``         rows sorted and grouped by cluster              ``group_rows``
``gather_gemm_union``  fused gather + GEMM over shared columns         ``gathered_logits``
``gather_gemm_per_row`` fused gather + GEMM, each group its own set    ``per_row_logits``
=====================  ==============================================  ======================================

Tensors stay torch tensors (allocated by torch's caching allocator); kernels receive raw device pointers
(zero copy) and run on torch's current stream. ``to_cupy`` is the DLPack bridge, used where a CuPy array is
needed (the compaction ElementwiseKernel).

The fused gather-GEMM reads every active row of W exactly once per launch, in 16-byte chunks, and
multiplies on tensor cores (``mma.sync.m16n8k16``, fp16/bf16 in, fp32 accumulate), so its cost is the bytes
of the active rows: the bandwidth floor the benchmark compares against.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import cupy as cp
import numpy as np
import torch

# --------------------------------------------------------------------------------------------- CUDA source

_SOURCE = r"""
// No headers: 16-bit floats travel as their bit patterns and are converted with PTX, so NVRTC needs nothing
// beyond its built-in vector types (uint4). sm_80+ (mma.sync m16n8k16, cvt.rn.bf16.f32).
typedef unsigned short u16;

template <bool BF16> __device__ __forceinline__ float to_f32(u16 x);
template <> __device__ __forceinline__ float to_f32<false>(u16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x));
  return f;
}
template <> __device__ __forceinline__ float to_f32<true>(u16 x) {
  return __uint_as_float(((unsigned)x) << 16);
}

template <bool BF16> __device__ __forceinline__ u16 from_f32(float f);
template <> __device__ __forceinline__ u16 from_f32<false>(float f) {
  u16 x;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(x) : "f"(f));
  return x;
}
template <> __device__ __forceinline__ u16 from_f32<true>(float f) {
  u16 x;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(x) : "f"(f));
  return x;
}

// D += A (16x16, row) * B (16x8, col), fp32 accumulators. Fragments (PTX ISA, mma.m16n8k16), lane = 4g + t:
//   a0: A[g][2t..2t+1]  a1: A[g+8][2t..]  a2: A[g][2t+8..]  a3: A[g+8][2t+8..]
//   b0: B[2t..2t+1][g]  b1: B[2t+8..][g]
//   c0, c1: D[g][2t], D[g][2t+1]   c2, c3: D[g+8][2t], D[g+8][2t+1]
template <bool BF16> __device__ __forceinline__ void mma16816(float (&c)[4], unsigned a0, unsigned a1,
                                                              unsigned a2, unsigned a3, unsigned b0,
                                                              unsigned b1);
template <> __device__ __forceinline__ void mma16816<false>(float (&c)[4], unsigned a0, unsigned a1,
                                                            unsigned a2, unsigned a3, unsigned b0,
                                                            unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
template <> __device__ __forceinline__ void mma16816<true>(float (&c)[4], unsigned a0, unsigned a1,
                                                           unsigned a2, unsigned a3, unsigned b0,
                                                           unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// DT: 0 fp16, 1 bf16, 2 fp32
template <int DT> __device__ __forceinline__ float load_f32(const void* p, long long i) {
  if (DT == 2) return static_cast<const float*>(p)[i];
  return to_f32<DT == 1>(static_cast<const u16*>(p)[i]);
}

// Eq. 2: cluster[row] = argmin_j sq_norms[j] - 2 dots[row, j] (fp32, ties -> lowest j, like torch.argmin).
// One block of 256 threads per row.
template <int DT>
__global__ void fv_assign(const void* __restrict__ dots, int r, const float* __restrict__ sq_norms,
                          long long* __restrict__ clusters) {
  __shared__ float s_val[256];
  __shared__ int s_idx[256];
  const int row = blockIdx.x, tid = threadIdx.x;
  float best = __int_as_float(0x7f800000);  // +inf
  int idx = 0x7fffffff;
  for (int j = tid; j < r; j += 256) {
    const float s = sq_norms[j] - 2.0f * load_f32<DT>(dots, (long long)row * r + j);
    if (s < best) { best = s; idx = j; }  // j grows per thread: the first minimum is kept
  }
  s_val[tid] = best;
  s_idx[tid] = idx;
  __syncthreads();
  for (int stride = 128; stride > 0; stride >>= 1) {
    if (tid < stride) {
      const float o = s_val[tid + stride];
      const int oi = s_idx[tid + stride];
      if (o < s_val[tid] || (o == s_val[tid] && oi < s_idx[tid])) { s_val[tid] = o; s_idx[tid] = oi; }
    }
    __syncthreads();
  }
  if (tid == 0) clusters[row] = s_idx[0] == 0x7fffffff ? 0 : s_idx[0];
}

// Union mask (Amer et al. 2.3): mask[indices[p]] = 1 for p in each row's cluster range. grid (x, rows); a row
// whose cluster an earlier row already has does nothing (beams often share a cluster).
extern "C" __global__ void fv_mark_active(const long long* __restrict__ clusters,
                                          const long long* __restrict__ indptr,
                                          const int* __restrict__ indices,
                                          unsigned char* __restrict__ mask) {
  const int row = blockIdx.y;
  const long long c = clusters[row];
  for (int j = 0; j < row; ++j)
    if (clusters[j] == c) return;
  const long long end = indptr[c + 1];
  for (long long p = indptr[c] + (long long)blockIdx.x * blockDim.x + threadIdx.x; p < end;
       p += (long long)gridDim.x * blockDim.x)
    mask[indices[p]] = 1;
}

// Per-row mode grouping in one block (rows <= 1024): stable rank sort by cluster, then each sorted position
// says whether it leads a group (first row of its cluster, or every rpg-th row of it) and how many rows the
// group has. O(rows^2) comparisons: nothing at these sizes, and no host round trip.
extern "C" __global__ void fv_group_rows(const long long* __restrict__ clusters, int rows, int rpg,
                                         int* __restrict__ order, long long* __restrict__ grp_cluster,
                                         int* __restrict__ grp_rows) {
  extern __shared__ long long s_sorted[];  // (rows,)
  const int i = threadIdx.x;
  if (i < rows) {
    const long long ci = clusters[i];
    int rank = 0;
    for (int j = 0; j < rows; ++j) {
      const long long cj = clusters[j];
      rank += (cj < ci) || (cj == ci && j < i);
    }
    order[rank] = i;
    s_sorted[rank] = ci;
  }
  __syncthreads();
  if (i < rows) {
    const long long c = s_sorted[i];
    int s = i;
    while (s > 0 && s_sorted[s - 1] == c) --s;
    int e = i;
    while (e + 1 < rows && s_sorted[e + 1] == c) ++e;
    grp_cluster[i] = c;
    grp_rows[i] = ((i - s) % rpg == 0) ? min(rpg, e + 1 - i) : 0;
  }
}

// Fused gather + GEMM on tensor cores: out[row, pos] = h[row] . W[col(pos)] + b[col(pos)], fp32 accumulation.
// A warp owns 16 output positions x up to 8*NT rows (NT mma n-tiles of 8 rows). Each thread loads 16-byte
// chunks straight from global memory, no shared memory: W rows (positions g and g+8 of the tile) and h row g
// of each n-tile, at k = 32*kc + 8*t .. +8.
// k permutation: mma fragment column 2t+j (j = 0, 1) stands for physical k = 32kc + 8t + 4s + j, fragment
// column 2t+8+j for 32kc + 8t + 4s + 2 + j (s = 0, 1: the two mma steps of a 32-wide chunk). A and B use the
// same map and every k in the chunk appears exactly once, so the sum over k is unchanged.
// Groups, blockIdx.y:
//   union   (grp_cluster == nullptr): columns cols[0:ncols], rows y*8*NT .. min(rows, (y+1)*8*NT);
//   per-row (grp_cluster != nullptr): sorted position y leads a group iff grp_rows[y] > 0; its columns are
//            cols[indptr[c]:indptr[c+1]], c = grp_cluster[y]; its rows order[y : y + grp_rows[y]].
// out and out_ids are (rows, width); a group's positions >= its column count (per-row padding) get -inf and
// the group's first id. Requires d % 32 == 0 and 16-byte aligned h, W.
template <bool BF16, int NT>
__global__ void fv_gather_mma(const u16* __restrict__ h, const u16* __restrict__ W,
                              const u16* __restrict__ bias, int d, const int* __restrict__ cols, int ncols,
                              const long long* __restrict__ indptr,
                              const long long* __restrict__ grp_cluster, const int* __restrict__ order,
                              const int* __restrict__ grp_rows, int rows, u16* __restrict__ out,
                              long long* __restrict__ out_ids, int width) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int y = blockIdx.y;
  long long cstart = 0;
  int ncol = ncols, rstart, nrows;
  if (grp_cluster != nullptr) {
    nrows = grp_rows[y];
    if (nrows == 0) return;
    const long long c = grp_cluster[y];
    cstart = indptr[c];
    ncol = (int)(indptr[c + 1] - cstart);
    rstart = y;
  } else {
    rstart = y * 8 * NT;
    nrows = min(rows - rstart, 8 * NT);
    if (nrows <= 0) return;
  }
  const int tile0 = (blockIdx.x * (blockDim.x >> 5) + warp) * 16;  // first output position of this warp
  if (tile0 >= width) return;
  const u16 neg_inf = from_f32<BF16>(__int_as_float(0xff800000));
  const long long pad_id = ncol > 0 ? cols[cstart] : 0;

  if (tile0 >= ncol) {  // a tile of padding only (per-row mode): no multiply
    for (int e = lane; e < 16 * nrows; e += 32) {
      const int pos = tile0 + (e & 15), l = e >> 4;
      if (pos < width) {
        const int row = order != nullptr ? order[rstart + l] : rstart + l;
        out[(long long)row * width + pos] = neg_inf;
        if (out_ids != nullptr) out_ids[(long long)row * width + pos] = pad_id;
      }
    }
    return;
  }

  const int m0 = tile0 + g, m1 = tile0 + g + 8;  // this thread's two output positions (A rows g, g+8)
  const long long col0 = cols[cstart + min(m0, ncol - 1)], col1 = cols[cstart + min(m1, ncol - 1)];
  const uint4* w0 = reinterpret_cast<const uint4*>(W + col0 * d) + t;
  const uint4* w1 = reinterpret_cast<const uint4*>(W + col1 * d) + t;
  const uint4* hp[NT];
  bool hv[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int l = nt * 8 + g;  // B column g of n-tile nt = local row l
    hv[nt] = l < nrows;
    const int lc = min(l, nrows - 1);  // always a valid address; invalid rows are zeroed below
    const int row = order != nullptr ? order[rstart + lc] : rstart + lc;
    hp[nt] = reinterpret_cast<const uint4*>(h + (long long)row * d) + t;
  }
  float acc[NT][4];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

  const int kchunks = d >> 5;  // 32 k-values = 64 bytes = 4 uint4 per row and chunk
#pragma unroll 2
  for (int kc = 0; kc < kchunks; ++kc) {
    const uint4 a_lo = __ldg(w0 + kc * 4);  // A row g:   k = 32kc + 8t .. +8
    const uint4 a_hi = __ldg(w1 + kc * 4);  // A row g+8
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      if (nt * 8 < nrows) {  // warp-uniform: mma.sync stays converged
        const uint4 v = __ldg(hp[nt] + kc * 4);
        const unsigned bx = hv[nt] ? v.x : 0u, by = hv[nt] ? v.y : 0u;
        const unsigned bz = hv[nt] ? v.z : 0u, bw = hv[nt] ? v.w : 0u;
        mma16816<BF16>(acc[nt], a_lo.x, a_hi.x, a_lo.y, a_hi.y, bx, by);  // k 8t + 0..3
        mma16816<BF16>(acc[nt], a_lo.z, a_hi.z, a_lo.w, a_hi.w, bz, bw);  // k 8t + 4..7
      }
    }
  }

  const float bias0 = bias != nullptr ? to_f32<BF16>(bias[col0]) : 0.0f;
  const float bias1 = bias != nullptr ? to_f32<BF16>(bias[col1]) : 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt * 8 < nrows) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int pos = e < 2 ? m0 : m1;        // D row g (c0, c1) or g+8 (c2, c3)
        const int l = nt * 8 + 2 * t + (e & 1);  // D column: local row
        if (l < nrows && pos < width) {
          const int row = order != nullptr ? order[rstart + l] : rstart + l;
          const long long o = (long long)row * width + pos;
          if (pos < ncol) {
            out[o] = from_f32<BF16>(acc[nt][e] + (e < 2 ? bias0 : bias1));
            if (out_ids != nullptr) out_ids[o] = e < 2 ? col0 : col1;
          } else {
            out[o] = neg_inf;
            if (out_ids != nullptr) out_ids[o] = pad_id;
          }
        }
      }
    }
  }
}
"""

NT_CHOICES = (1, 2, 3, 4, 5, 6, 8, 12, 16)  # mma n-tiles of 8 rows compiled for the gather kernel
PER_ROW_GROUP = 16  # per-row mode: rows of one cluster handled together (NT = 2); groups are usually 1-2
GATHER_THREADS = 128  # 4 warps: 64 output columns per block
MAX_GROUP_ROWS = 1024  # fv_group_rows runs in one block

_DT = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 2}
_TEMPLATES = [f"fv_assign<{dt}>" for dt in (0, 1, 2)] + [
    f"fv_gather_mma<{b}, {nt}>" for b in ("false", "true") for nt in NT_CHOICES
]
_PLAIN = ["fv_mark_active", "fv_group_rows"]  # extern "C": looked up by their plain names

_COMPACT = cp.ElementwiseKernel(
    "raw uint8 mask, raw int32 pos",
    "raw int32 cols32, raw int64 cols64",
    "if (mask[i]) { const int p = pos[i] - 1; cols32[p] = (int)i; cols64[p] = i; }",
    "fastvocab_compact",
)


@functools.cache
def _functions(device_index: int) -> dict[str, cp.RawKernel]:
    """Compile the module once per device (CuPy also caches the binary on disk)."""
    with cp.cuda.Device(device_index):
        mod = cp.RawModule(code=_SOURCE, options=("-std=c++17",), name_expressions=_TEMPLATES)
        return {name: mod.get_function(name) for name in _TEMPLATES + _PLAIN}


def _fn(t: torch.Tensor, name: str) -> cp.RawKernel:
    return _functions(t.device.index if t.device.index is not None else torch.cuda.current_device())[name]


@contextlib.contextmanager
def _on(t: torch.Tensor) -> Iterator[None]:
    """Run CuPy launches on ``t``'s device and torch's current stream there (ordering with torch ops)."""
    stream = torch.cuda.current_stream(t.device)
    with cp.cuda.Device(stream.device_index), cp.cuda.ExternalStream(stream.cuda_stream):
        yield


def _p(t: torch.Tensor | None) -> np.uint64:
    """A raw device pointer as a kernel argument (a null pointer for None)."""
    return np.uint64(0 if t is None else t.data_ptr())


def _check(t: torch.Tensor, name: str, dtypes: tuple[torch.dtype, ...], dim: int) -> None:
    if not t.is_cuda or t.dtype not in dtypes or t.dim() != dim or not t.is_contiguous():
        raise ValueError(
            f"{name} must be a contiguous {dim}-d CUDA tensor of {'/'.join(str(d) for d in dtypes)}; "
            f"got {t.dtype} {tuple(t.shape)} on {t.device} (contiguous={t.is_contiguous()})"
        )


def _check_gemm(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    _check(weight, "weight", (torch.float16, torch.bfloat16), 2)
    _check(h, "h", (weight.dtype,), 2)
    if bias is not None:
        _check(bias, "bias", (weight.dtype,), 1)
    d = weight.shape[1]
    if h.shape[1] != d or d % 32:
        raise ValueError(f"need h (rows, d) and W (N, d) with d % 32 == 0; got {tuple(h.shape)}, {d}")
    if h.data_ptr() % 16 or weight.data_ptr() % 16:
        raise ValueError("h and W must be 16-byte aligned for the vectorised loads")


# --------------------------------------------------------------------------------------------- DLPack bridge


def to_cupy(t: torch.Tensor) -> cp.ndarray:
    """Zero-copy view of a torch CUDA tensor as a CuPy array (DLPack)."""
    return cp.from_dlpack(t)


# --------------------------------------------------------------------------------------------- wrappers


def assign(dots: torch.Tensor, sq_norms: torch.Tensor) -> torch.Tensor:
    """Eq. 2 from the centroid GEMM: ``argmin_j sq_norms[j] - 2 dots[:, j]``, (rows,) int64.

    ``dots`` (rows, r) fp16/bf16/fp32 = ``h @ C^T``; ``sq_norms`` (r,) float32 (+inf: never chosen).
    """
    _check(dots, "dots", tuple(_DT), 2)
    _check(sq_norms, "sq_norms", (torch.float32,), 1)
    rows, r = dots.shape
    out = torch.empty(rows, dtype=torch.int64, device=dots.device)
    if rows:
        with _on(dots):
            _fn(dots, f"fv_assign<{_DT[dots.dtype]}>")(
                (rows,), (256,), (_p(dots), np.int32(r), _p(sq_norms), _p(out))
            )
    return out


def mark_active(
    clusters: torch.Tensor, indptr: torch.Tensor, indices: torch.Tensor, n_vocab: int, max_set: int
) -> torch.Tensor:
    """Boolean mask over the vocabulary (N,) uint8: 1 where some row's cluster lists the id."""
    _check(clusters, "clusters", (torch.int64,), 1)
    _check(indptr, "indptr", (torch.int64,), 1)
    _check(indices, "indices", (torch.int32,), 1)
    mask = torch.zeros(n_vocab, dtype=torch.uint8, device=clusters.device)
    rows = clusters.shape[0]
    if rows:
        gx = max(1, min(64, -(-max_set // 256)))
        with _on(clusters):
            for lo in range(0, rows, 65_535):  # rows are grid y, which holds at most 65,535 blocks
                part = clusters[lo : lo + 65_535]
                _fn(clusters, "fv_mark_active")(
                    (gx, part.shape[0]), (256,), (_p(part), _p(indptr), _p(indices), _p(mask))
                )
    return mask


def compact(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of the ones in ``mask``, sorted: (C,) int32 for the kernels and (C,) int64 for the search.

    The inclusive scan gives each one its output slot; C is read back to the host (the one sync of union mode:
    the GEMM's shape depends on it).
    """
    _check(mask, "mask", (torch.uint8,), 1)
    pos = torch.cumsum(mask, 0, dtype=torch.int32)  # (N,) inclusive scan
    c = int(pos[-1]) if pos.numel() else 0
    cols32 = torch.empty(c, dtype=torch.int32, device=mask.device)
    cols64 = torch.empty(c, dtype=torch.int64, device=mask.device)
    if c:
        with _on(mask):
            _COMPACT(to_cupy(mask), to_cupy(pos), to_cupy(cols32), to_cupy(cols64), size=mask.numel())
    return cols32, cols64


def group_rows(
    clusters: torch.Tensor, rows_per_group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows sorted by cluster (stable): ``order`` (rows,) int32, and per sorted position its cluster (int64)
    and, where it leads a group of at most ``rows_per_group`` rows, the group's row count (else 0)."""
    _check(clusters, "clusters", (torch.int64,), 1)
    rows = clusters.shape[0]
    if rows > MAX_GROUP_ROWS:
        raise ValueError(f"group_rows handles at most {MAX_GROUP_ROWS} rows, got {rows}")
    dev = clusters.device
    order = torch.empty(rows, dtype=torch.int32, device=dev)
    grp_cluster = torch.empty(rows, dtype=torch.int64, device=dev)
    grp_rows = torch.empty(rows, dtype=torch.int32, device=dev)
    if rows:
        threads = -(-rows // 32) * 32
        with _on(clusters):
            _fn(clusters, "fv_group_rows")(
                (1,),
                (threads,),
                (
                    _p(clusters),
                    np.int32(rows),
                    np.int32(rows_per_group),
                    _p(order),
                    _p(grp_cluster),
                    _p(grp_rows),
                ),
                shared_mem=8 * rows,
            )
    return order, grp_cluster, grp_rows


def _n_tiles(rows: int) -> int:
    need = -(-rows // 8)
    return next((nt for nt in NT_CHOICES if nt >= need), NT_CHOICES[-1])


def gather_gemm_union(
    h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, cols: torch.Tensor
) -> torch.Tensor:
    """``h @ W[cols]^T + b[cols]``, (rows, C) in W's dtype, reading each active row of W once."""
    _check_gemm(h, weight, bias)
    _check(cols, "cols", (torch.int32,), 1)
    rows, c = h.shape[0], cols.shape[0]
    out = torch.empty((rows, c), dtype=weight.dtype, device=weight.device)
    if rows == 0 or c == 0:
        return out
    nt = _n_tiles(rows)
    grid = (-(-c // (16 * GATHER_THREADS // 32)), -(-rows // (8 * nt)))
    kernel = _fn(weight, f"fv_gather_mma<{'true' if weight.dtype == torch.bfloat16 else 'false'}, {nt}>")
    null = np.uint64(0)
    with _on(weight):
        kernel(
            grid,
            (GATHER_THREADS,),
            (_p(h), _p(weight), _p(bias), np.int32(weight.shape[1]), _p(cols), np.int32(c), null, null, null,
             null, np.int32(rows), _p(out), null, np.int32(c)),
        )  # fmt: skip
    return out


def gather_gemm_per_row(
    h: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    clusters: torch.Tensor,
    indptr: torch.Tensor,
    indices: torch.Tensor,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row against its own cluster's set: (logits, ids), each (rows, width), padding ``-inf`` + first id.

    Rows are grouped by cluster on the device (``group_rows``), so a group reads its W rows once; ``width``
    is the largest set of the map, static, so this path never waits for the device.
    """
    _check_gemm(h, weight, bias)
    _check(indptr, "indptr", (torch.int64,), 1)
    _check(indices, "indices", (torch.int32,), 1)
    rows = h.shape[0]
    out = torch.empty((rows, width), dtype=weight.dtype, device=weight.device)
    ids = torch.empty((rows, width), dtype=torch.int64, device=weight.device)
    if rows == 0 or width == 0:
        return out, ids
    order, grp_cluster, grp_rows = group_rows(clusters, PER_ROW_GROUP)
    nt = _n_tiles(PER_ROW_GROUP)
    grid = (-(-width // (16 * GATHER_THREADS // 32)), rows)
    kernel = _fn(weight, f"fv_gather_mma<{'true' if weight.dtype == torch.bfloat16 else 'false'}, {nt}>")
    with _on(weight):
        kernel(
            grid,
            (GATHER_THREADS,),
            (_p(h), _p(weight), _p(bias), np.int32(weight.shape[1]), _p(indices), np.int32(0), _p(indptr),
             _p(grp_cluster), _p(order), _p(grp_rows), np.int32(rows), _p(out), _p(ids), np.int32(width)),
        )  # fmt: skip
    return out, ids
