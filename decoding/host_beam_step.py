"""Beam search's per-step bookkeeping on CPU, compiled with numba: each row's best continuations from a
projection's logits (:func:`row_candidates`) and the beams' advance over them (:func:`advance`).

At a step of a few rows (batch 1, beam 4) this work was a few dozen numpy and torch operations on arrays of
a few hundred values, and inside a whole run each cost a few times its arithmetic. One compiled call per
part does the same work: the demo model decoded beam 4, batch 1 1.07-1.17x faster on one thread
(docs/decisions/0025-a-compiled-cpu-step.md). The functions compile on first use and numba keeps the
machine code on disk (``kernels/jit.py``), so a later process loads it in under a second.

At the full layer the candidates are most of a step's work outside the GEMM: at beam 4, batch 32 a step
has 128 rows of 32,108 logits (16 MB). torch's log-softmax read them twice and wrote them over, then the
top-k read them again. :func:`row_candidates` reads a row once from memory and twice more from cache, and
writes nothing: the normaliser's exp is vectorised by hand (numba's own is a call per value), and the top-k
scans only the groups of columns that can hold a row's best (docs/cpu-engine.md, 0026).

The arithmetic is the one the numpy and torch steps did: float32 sums, divisions and comparisons, the same
order of candidates (largest first, the lower index first among equal values, NaN last). The normaliser of a
row's log-softmax is its own: a float32 exp summed by groups in float64. It may differ from torch's in its
last bits (torch sums float32 with another exp); a row with a NaN or an infinity takes an exact scalar path.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fastvocab.kernels.jit import njit

# Score given to impossible beams (finite, so sums stay ordered): beam_state.py's _NEG as float32.
NEG = np.float32(-1.0e9)

# How the compiled advance reads its stopping rule (beam search's ``early_stopping``): done once the pool is
# full (True); or also once the best live beam, normalised at its length (False) or at the length limit
# ("never" with a length penalty), cannot beat the pool's worst.
RULE_TRUE, RULE_FALSE, RULE_NEVER = 0, 1, 2


def rule_code(pool_full_is_done: bool, at_limit: bool) -> int:
    """The stopping rule's code for :func:`advance`."""
    if pool_full_is_done:
        return RULE_TRUE
    return RULE_NEVER if at_limit else RULE_FALSE


@njit()
def _before(a: float, b: float) -> bool:
    """Whether ``a`` ranks before ``b`` (larger first, NaN last): ``np.argsort(-x, kind="stable")``'s order
    for two values where ``a`` has the higher index."""
    if math.isnan(a):
        return False
    return math.isnan(b) or a > b


@njit()
def _best_first(scores, m, out) -> None:  # pragma: no cover - compiled
    """The indices of the ``m`` best ``scores`` (1-d) into ``out[:m]``, best first, the lower index first
    among equal ones (insertion into a sorted buffer: ``m`` is a few)."""
    n = 0
    for j in range(scores.shape[0]):
        v = scores[j]
        if n == m and not _before(v, scores[out[m - 1]]):
            continue
        i = n if n < m else m - 1
        while i > 0 and _before(v, scores[out[i - 1]]):
            out[i] = out[i - 1]
            i -= 1
        out[i] = j
        if n < m:
            n += 1


@njit()
def _log_norm(x, mass: float, with_mass: bool) -> np.float32:  # pragma: no cover - compiled
    """log(sum(exp(x)) [+ exp(mass)]) of a row, in float64, returned as float32."""
    m = -math.inf
    for j in range(x.shape[0]):
        if x[j] > m or math.isnan(x[j]):
            m = x[j]
    if math.isnan(m):
        return np.float32(m)
    if with_mass and mass > m:
        m = mass
    if math.isinf(m):  # every value -inf (or +inf): torch's answer
        return np.float32(m)
    s = 0.0
    for j in range(x.shape[0]):
        s += math.exp(np.float64(x[j]) - m)
    if with_mass:
        s += math.exp(np.float64(mass) - m)
    return np.float32(math.log(s) + m)


# The candidates' scan: a row is read in groups of _GROUP columns, and a group whose maximum cannot enter the
# best m is skipped. numba does not vectorise a max reduction; _LANES independent maxima keep the core busy.
_GROUP = 64
_LANES = 16
_LOG2E = np.float32(1.4426950408889634)
# 2^f on [-1/2, 1/2]: a degree-6 least-squares fit of the relative error, lowest power first. Evaluated in
# float32 it is within 1e-7 of 2^f; exp(t) adds the rounding of t / ln 2 (|t| x 6e-8 relative), which
# matters only for terms far below the row's maximum (tests/test_host_beam_step.py checks both).
_EXP2 = (
    np.float32(1.0), np.float32(0.6931471824645996), np.float32(0.24022646248340607),
    np.float32(0.05550329014658928), np.float32(0.009618519805371761), np.float32(0.0013399859890341759),
    np.float32(0.00015337577497120947),
)  # fmt: skip


@njit()
def _group_maxima(x, out) -> np.float32:  # pragma: no cover - compiled
    """Each group's maximum of a row into ``out``, and the row's maximum (NaN is never chosen: callers
    check for it apart)."""
    cols = x.shape[0]
    whole = cols // _GROUP
    lanes = np.empty(_LANES, np.float32)
    top = np.float32(-np.inf)
    for g in range(whole):
        lo = g * _GROUP
        for a in range(_LANES):
            lanes[a] = x[lo + a]
        for j in range(lo + _LANES, lo + _GROUP, _LANES):
            for a in range(_LANES):
                lanes[a] = x[j + a] if x[j + a] > lanes[a] else lanes[a]
        v = lanes[0]
        for a in range(1, _LANES):
            v = lanes[a] if lanes[a] > v else v
        out[g] = v
        top = v if v > top else top
    if whole * _GROUP < cols:
        v = x[whole * _GROUP]
        for j in range(whole * _GROUP + 1, cols):
            v = x[j] if x[j] > v else v
        out[whole] = v
        top = v if v > top else top
    return top


@njit(fastmath={"reassoc", "contract"}, inline="always")
def _exp(t):  # pragma: no cover - compiled
    """exp(t) for float32 t <= 0, without a call, so that a loop over it vectorises: 2^n from the exponent
    bits times the polynomial's 2^f (t under -87 counts as e^-87: against a sum of at least 1, nothing)."""
    u = t * _LOG2E
    u = u if u > np.float32(-126.0) else np.float32(-126.0)
    n = np.floor(u + np.float32(0.5))
    f = u - n
    p = _EXP2[6]
    for i in range(5, -1, -1):
        p = p * f + _EXP2[i]
    return p * np.int32((np.int32(n) + np.int32(127)) << np.int32(23)).view(np.float32)


@njit(fastmath={"reassoc", "contract"})
def _exp_sum(x, m) -> tuple[float, np.float32]:  # pragma: no cover - compiled
    """sum(exp(x - m)) over a row of finite values <= ``m``: a group's terms summed in float32, the groups in
    float64. Also ``x - x`` summed: 0 where every value is finite, else NaN."""
    cols = x.shape[0]
    whole = cols // _GROUP
    m32 = np.float32(m)
    s = 0.0
    finite = np.float32(0.0)
    for g in range(whole):
        part = np.float32(0.0)
        for j in range(g * _GROUP, (g + 1) * _GROUP):
            finite += x[j] - x[j]
            part += _exp(x[j] - m32)
        s += np.float64(part)
    for j in range(whole * _GROUP, cols):
        finite += x[j] - x[j]
        s += np.float64(_exp(x[j] - m32))
    return s, finite


@njit()
def _exact_row(x, norm, ids, banned, m, logp, best) -> None:  # pragma: no cover - compiled
    """A row's ``m`` best log-probs' columns into ``best``, every column's log-prob written into ``logp``:
    for rows with a NaN or an infinity, which rank as ``_best_first`` says."""
    for j in range(x.shape[0]):
        logp[j] = x[j] - norm
        if banned.shape[0] and _is_banned(ids[j] if ids.shape[0] else j, banned):
            logp[j] = -np.inf
    _best_first(logp, m, best)


@njit(inline="always")
def _is_banned(vid, banned) -> bool:  # pragma: no cover - compiled
    at = np.searchsorted(banned, vid)
    return at < banned.shape[0] and banned[at] == vid


@njit()
def _scan_row(x, norm, gmax, ids, banned, m, vals, best) -> None:  # pragma: no cover - compiled
    """``_exact_row`` for a finite row, reading only the groups whose maximum can enter the best ``m``:
    ``vals``/``best`` the best log-probs and their columns, in ``_best_first``'s order."""
    n = 0
    for g in range(gmax.shape[0]):
        if n == m and not gmax[g] - norm > vals[m - 1]:  # x - norm grows with x: none of it can enter
            continue
        for j in range(g * _GROUP, min((g + 1) * _GROUP, x.shape[0])):
            v = x[j] - norm
            if n == m and not v > vals[m - 1]:
                continue
            if banned.shape[0] and _is_banned(ids[j] if ids.shape[0] else j, banned):
                v = np.float32(-np.inf)
                if n == m:
                    continue
            i = n if n < m else m - 1
            while i > 0 and v > vals[i - 1]:
                vals[i] = vals[i - 1]
                best[i] = best[i - 1]
                i -= 1
            vals[i] = v
            best[i] = j
            if n < m:
                n += 1


@njit()
def row_candidates(logits, ids, mass, banned, m, copies, out_vals, out_toks) -> None:  # pragma: no cover
    """Each row's ``m`` best log-probs and their vocabulary ids, best first, into ``out_vals`` /
    ``out_toks`` (rows * copies, m).

    ``logits`` (rows, C) float32; ``ids`` (C,) int64 the columns' vocabulary ids, or empty where column j is
    id j; ``mass`` (rows,) float32 each row's log of the mass left out of the columns, or empty where none
    is; ``banned`` sorted int64 vocabulary ids whose log-prob is -inf (after the normaliser, as generate's
    processors); ``copies``: each row's candidates written to that many consecutive rows (beam search's
    first step scores one row per sentence for its beams).

    A finite row is read three times and never written: its groups' maxima, the normaliser (a vectorised
    exp), and a scan of the groups that can hold its best. A row with a NaN or an infinity (or an infinite
    mass) takes the exact scalar path, torch's answer for it."""
    rows, cols = logits.shape
    with_mass = mass.shape[0] > 0
    gmax = np.empty((cols + _GROUP - 1) // _GROUP, np.float32)
    vals = np.empty(m, np.float32)
    best = np.empty(m, np.int64)
    logp = np.empty(0, np.float32)  # the exact path's, made at its first row
    for r in range(rows):
        x = logits[r]
        left = np.float64(mass[r]) if with_mass else -math.inf
        top = max(np.float64(_group_maxima(x, gmax)), left)
        s, finite = _exp_sum(x, top)
        if finite == 0.0 and not math.isinf(top) and not math.isnan(left):  # (an infinite mass: top)
            if with_mass:
                s += math.exp(left - top)
            _scan_row(x, np.float32(math.log(s) + top), gmax, ids, banned, m, vals, best)
        else:
            if logp.shape[0] == 0:
                logp = np.empty(cols, np.float32)
            _exact_row(x, _log_norm(x, mass[r] if with_mass else 0.0, with_mass), ids, banned, m, logp, best)
            for i in range(m):
                vals[i] = logp[best[i]]
        for c in range(copies):
            o = r * copies + c
            for i in range(m):
                out_vals[o, i] = vals[i]
                out_toks[o, i] = ids[best[i]] if ids.shape[0] else best[i]


@njit()
def advance(  # pragma: no cover - compiled
    row_vals, row_toks, run_scores, run_seqs, fin_scores, fin_seqs, fin_any, done, step_at, denoms,
    eos, final, pooled, rule, never_len, out_toks, out_rows,
) -> bool:  # fmt: skip
    """One beam step for ``n`` sentences x ``k`` beams, in place on the state's arrays (beam_state.py's
    ``BeamState``: ``run_scores`` (n, k), ``run_seqs`` (n, k, T), ``fin_*``, ``done`` (n,), ``step_at`` (1,),
    ``denoms`` (T,)), from each row's candidates ``row_vals`` / ``row_toks`` (n*k, kk). Writes the tokens the
    live beams continue with into ``out_toks`` (n, k) and the row each continues into ``out_rows`` (n, k).

    ``final``: the length limit, where every candidate finishes and every sentence is done. ``pooled``: the
    pool may hold a finished hypothesis (the stopping rule is read only then). Returns ``pooled`` after this
    step: whether a candidate was merged into the pool now or before.

    Seventeen parameters because this is a numba kernel that works in place: numba compiles it for flat
    typed arrays and scalars, so each of the state's arrays it updates, the step's scalars and the two
    output arrays come one by one; ``BeamState`` itself, or a dict of its arrays, would reach it as an
    untyped Python object. Its one caller, ``BeamState._advance_host``, passes the state's numpy views."""
    n, k = run_scores.shape
    kk = row_vals.shape[1]
    width = k * kk
    m = min(2 * k, width)
    step = step_at[0]
    total = np.empty((n, width), np.float32)
    flat = np.empty((n, m), np.int64)
    cand_scores = np.empty((n, m), np.float32)
    cand_beam = np.empty((n, m), np.int64)
    cand_toks = np.empty((n, m), np.int64)
    done_cand = np.empty((n, m), np.bool_)
    any_done = final
    for s in range(n):
        for b in range(k):
            for j in range(kk):
                total[s, b * kk + j] = row_vals[s * k + b, j] + run_scores[s, b]
        _best_first(total[s], m, flat[s])
        for i in range(m):
            f = flat[s, i]
            cand_scores[s, i] = total[s, f]
            cand_beam[s, i] = f // kk
            cand_toks[s, i] = row_toks[s * k + f // kk, f % kk]
            done_cand[s, i] = final or cand_toks[s, i] == eos
            any_done = any_done or done_cand[s, i]

    # Finished candidates among the best k enter the pool of finished hypotheses.
    if any_done:
        new_fin = np.zeros((n, m), np.bool_)
        merge = False
        for s in range(n):
            for i in range(min(k, m)):
                new_fin[s, i] = done_cand[s, i] and not done[s]
                merge = merge or new_fin[s, i]
        if merge:
            pooled = True
            _merge(cand_scores, cand_beam, cand_toks, new_fin, step, run_seqs, fin_scores, fin_seqs, fin_any,
                   denoms[step])  # fmt: skip

    # The best k unfinished candidates live on (finished ones pushed to the bottom, as in generate).
    pick = np.empty(k, np.int64)
    scores = np.empty(m, np.float32)
    seqs = np.empty((k, run_seqs.shape[2]), np.int64)
    for s in range(n):
        if any_done:
            for i in range(m):
                scores[i] = cand_scores[s, i] + (NEG if done_cand[s, i] else np.float32(0.0))
            _best_first(scores, k, pick)
        else:
            for i in range(k):
                pick[i] = i
        for i in range(k):
            seqs[i] = run_seqs[s, cand_beam[s, pick[i]]]
        for i in range(k):
            p = pick[i]
            run_seqs[s, i] = seqs[i]
            run_seqs[s, i, step] = cand_toks[s, p]
            run_scores[s, i] = scores[p] if any_done else cand_scores[s, p]
            out_toks[s, i] = cand_toks[s, p]
            out_rows[s, i] = s * k + cand_beam[s, p]
        if final:
            done[s] = True
        elif pooled:  # with an empty pool no slot holds a finished hypothesis: no sentence is done
            now = True
            for i in range(k):
                now = now and fin_any[s, i]
            if now and rule != RULE_TRUE:
                at_len = never_len if rule == RULE_NEVER else denoms[step]
                worst = fin_scores[s, 0]
                for i in range(1, k):
                    if not fin_scores[s, i] >= worst:  # a NaN stays the minimum, as numpy's min
                        worst = fin_scores[s, i]
                now = run_scores[s, 0] / at_len <= worst
            done[s] = done[s] or now
    step_at[0] = step + 1
    return pooled


@njit()
def _merge(  # pragma: no cover - compiled
    cand_scores, cand_beam, cand_toks, new_fin, step, run_seqs, fin_scores, fin_seqs, fin_any, denom
) -> None:
    """Each sentence's pool: the best k of its finished hypotheses and its ``new_fin`` candidates, these
    normalised by ``denom`` (the length normalisation at ``step``). Every sentence is merged (where it has
    no new one, its candidates at NEG keep the pool as it was, as the tensor step's merge does)."""
    n, k = fin_scores.shape
    m = cand_scores.shape[1]
    t = run_seqs.shape[2]
    scores = np.empty(k + m, np.float32)
    sel = np.empty(k, np.int64)
    seqs = np.empty((k, t), np.int64)
    anys = np.empty(k, np.bool_)
    kept = np.empty(k, np.float32)
    for s in range(n):
        for i in range(k):
            scores[i] = fin_scores[s, i]
        for i in range(m):
            scores[k + i] = cand_scores[s, i] / denom + (np.float32(0.0) if new_fin[s, i] else NEG)
        _best_first(scores, k, sel)
        for i in range(k):
            j = sel[i]
            if j < k:
                seqs[i] = fin_seqs[s, j]
                anys[i] = fin_any[s, j]
            else:
                seqs[i] = run_seqs[s, cand_beam[s, j - k]]
                seqs[i, step] = cand_toks[s, j - k]
                anys[i] = new_fin[s, j - k]
            kept[i] = scores[j]
        for i in range(k):
            fin_seqs[s, i] = seqs[i]
            fin_any[s, i] = anys[i]
            fin_scores[s, i] = kept[i]


# What cache_state says of the compiled functions: numba's cache holds their machine code for this source,
# numba version and CPU (a later process loads it in under a second); it holds none (the first run on a
# machine, or after the source changed: a compile of ~10 s); or numba has no writable folder to cache them
# in (kernels/jit.py), so every process compiles them.
WARM, COLD, UNCACHED = "warm", "cold", "uncached"


def cache_state() -> tuple[str, str | None]:
    """(:data:`WARM` | :data:`COLD` | :data:`UNCACHED`, numba's cache folder of the first function found
    cold) for the functions :func:`warm` compiles, from numba's own index files: a function is warm when its
    index (``<name>-<line>.pyXY.nbi``, which numba empties of entries made for another numba version or
    source stamp) holds an entry for this CPU (numba's codegen ``magic_tuple``) and the function's current
    bytecode, the key numba loads by. Reads one small file a function (under a millisecond), compiles
    nothing. Where numba's internals are not as expected, :data:`WARM`: say nothing rather than a wrong
    line."""
    import hashlib

    from fastvocab.kernels.host_moments import moments_union

    fn: Any  # a numba dispatcher: its cache and target context are numba's own attributes
    for fn in (advance, row_candidates, moments_union):
        try:
            cache = fn._cache
            index = getattr(cache, "_cache_file", None)
            if index is None:  # numba's NullCache: no folder could be written
                return UNCACHED, None
            magic = fn.targetctx.codegen().magic_tuple()
            code = hashlib.sha256(fn.py_func.__code__.co_code).hexdigest()
            if not any(key[1] == magic and key[2][0] == code for key in index._load_index()):
                return COLD, str(cache.cache_path)
        except Exception:  # numba's private cache layout changed: no claim either way
            return WARM, None
    return WARM, None


def warm() -> None:
    """Compile the CPU step's functions for the arrays the search passes them (or load them from numba's
    cache): these two and the clustered projection's ``host_moments.moments_union``. The first run on a
    machine compiles for 8-10 s on a 2-core Xeon, a later process loads them in 0.5-0.8 s."""
    from fastvocab.kernels.host_moments import moments_union

    n, k, kk, t = 1, 2, 4, 3
    f32, i64, z = np.float32, np.int64, np.zeros
    advance(
        z((n * k, kk), f32), z((n * k, kk), i64), z((n, k), f32), z((n, k, t), i64), z((n, k), f32),
        z((n, k, t), i64), z((n, k), np.bool_), z(n, np.bool_), z(1, i64), np.ones(t, f32), 2, False, False,
        RULE_FALSE, f32(1.0), z((n, k), i64), z((n, k), i64),
    )  # fmt: skip
    row_candidates(z((2, 5), f32), np.arange(5, dtype=i64), z(2, f32), z(0, i64), 4, 1, z((2, 4), f32),
                   z((2, 4), i64))  # fmt: skip
    d = 3
    moments_union(z((2, d), f32), z((2, 5), f32), z(2, i64), 7, z(d, f32), z((d, d), f32), z(d, f32), 0.0,
                  0.0, True, np.ones((2, 2), f32), z(2, f32))  # fmt: skip
