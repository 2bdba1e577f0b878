"""The ``moments`` estimate of the left-out mass for a union on CPU, compiled with numba
(``inactive_mass._moments_union_cpu``).

At a step of a few rows the estimate was ~15 torch and numpy operations (two GEMMs against the model-wide
sums, the sums of the computed logits and of their squares, the per-row arithmetic). In a whole one-thread
run of the demo model at beam 4, batch 1, this one call instead decoded the same lines 1.04-1.10x faster
(docs/decisions/0025-a-compiled-cpu-step.md). Its sums run in float64, in an order the compiler may
vectorise: the estimate agrees with the tensor path's to float32 rounding (~1e-6 nats), not bit for bit.
"""

from __future__ import annotations

import math

import numpy as np

from fastvocab.kernels.jit import njit

# Reassociation (vectorised sums) and fused multiply-adds, without assuming finite values as fastmath=True
# would.
_SUMS = {"reassoc", "contract"}


@njit(fastmath=_SUMS)
def moments_union(
    h, z, clusters, count, w_sum, gram, w_b, b_sum, b_sq, has_bias, per_cluster, out
):  # pragma: no cover
    """Each row's ``log n_I + mean_I + excess_c * var_I / var_c`` into ``out`` (rows,) float32.

    ``h`` (rows, d) float32 states; ``z`` (rows, C) their logits over the union's C columns; ``clusters``
    (rows,) each row's cluster; ``count`` = N - C > 0 the columns left out; ``w_sum``, ``gram``, ``w_b``,
    ``b_sum``, ``b_sq``, ``has_bias``: the model-wide sums (``MassTables``), which give the sum and the sum
    of squares of a row's N logits; ``per_cluster`` (r, 2): each cluster's excess and inactive variance.

    Twelve parameters because this is a numba kernel: numba compiles it for the type of each array and
    scalar it is handed, and a container of them (a ``MassTables``, a NamedTuple) would reach it as a tuple
    type or an untyped Python object, with another compiled signature and its cached machine code, for
    nothing its one caller gains: ``inactive_mass._moments_union_cpu`` unpacks ``MassTables`` into them."""
    rows, cols = z.shape
    d = h.shape[1]
    n = np.float64(count)
    for r in range(rows):
        x = h[r]
        s1, s2, hb = 0.0, 0.0, 0.0
        for i in range(d):
            g = 0.0
            for j in range(d):
                g += np.float64(gram[i, j]) * x[j]
            s2 += g * x[i]
            s1 += np.float64(w_sum[i]) * x[i]
            hb += np.float64(w_b[i]) * x[i]
        if has_bias:
            s1 += b_sum
            s2 += 2.0 * hb + b_sq
        zs, zz = 0.0, 0.0
        for j in range(cols):
            v = np.float64(z[r, j])
            zs += v
            zz += v * v
        mean = (s1 - zs) / n
        var = max((s2 - zz) / n - mean * mean, 1e-6)
        c = clusters[r]
        out[r] = np.float32(math.log(n) + mean + per_cluster[c, 0] * (var / per_cluster[c, 1]))
