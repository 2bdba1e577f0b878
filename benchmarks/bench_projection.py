"""Projection micro-benchmark: full output layer vs the clustered one (union and per-row), same process.

    .venv/bin/python benchmarks/bench_projection.py                      # CPU, fp32, the paper's sizes
    .venv/bin/python benchmarks/bench_projection.py --device cuda --dtype fp16   # GPU (cupy + torch backends)

The synthetic weights and maps, how it times, what it writes: ``benchmarks/harnesses.md#bench_projectionpy``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import functools
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from bench_meta import RESULTS, ROOT, comma_list, cupy_version, device_name, git_commit, write_result

from fastvocab.artifacts_schema.cluster_map import ClusterMap, MapManifest, active_fraction_stats
from fastvocab.artifacts_schema.fingerprint import projection_fingerprint
from fastvocab.kernels import create_projection

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# Peak HBM bandwidth by device-name fragment (GB/s): the floor of a memory-bound kernel.
PEAK_GBPS = {"H200": 4800.0, "H100 SXM": 3350.0, "H100 80GB HBM3": 3350.0, "H100 PCIe": 2000.0,
             "A100": 2039.0}  # fmt: skip


def synthetic_weights(n_vocab: int, d: int, dtype: torch.dtype, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n_vocab, d, generator=g) / math.sqrt(d)).to(dtype)
    b = (0.1 * torch.randn(n_vocab, generator=g)).to(dtype)
    return w.to(device), b.to(device), projection_fingerprint(w.float().numpy(), b.float().numpy())


def synthetic_map(
    n_vocab: int, d: int, r: int, fraction: float, set_ratio: float, fingerprint: str, seed: int = 0,
    centroids: np.ndarray | None = None,
) -> ClusterMap:  # fmt: skip
    """Each cluster a random ``set_ratio`` share of one pool of ``fraction * N`` ids, Zipf populations;
    ``centroids`` (r, d) random unless given (the GPU e2e step passes k-means-free ones over real states)."""
    rng = np.random.default_rng(seed)
    if centroids is None:
        centroids = rng.standard_normal((r, d)).astype(np.float32)
    centroids = np.ascontiguousarray(centroids, dtype=np.float32)
    pool = rng.choice(n_vocab, max(1, round(fraction * n_vocab)), replace=False)
    size = max(1, round(set_ratio * len(pool)))
    sets = [np.sort(rng.choice(pool, size, replace=False)) for _ in range(r)]
    zipf = 1.0 / np.arange(1, r + 1)
    pop = rng.permutation(np.maximum(1, np.round(1000 * zipf / zipf[0]))).astype(np.int32)
    indptr = np.zeros(r + 1, dtype=np.int64)
    np.cumsum([len(s) for s in sets], out=indptr[1:])
    counts = np.concatenate([np.full(len(s), pop[c], dtype=np.int32) for c, s in enumerate(sets)])
    manifest = MapManifest(
        model_fingerprint=fingerprint, direction="synthetic", scope="direction", r=r, k=0, d=d,
        n_vocab=n_vocab, niter=0, seed=seed, states_used=int(pop.sum()),
        active_fraction=active_fraction_stats(indptr, n_vocab),
        extra={"pool_fraction": fraction, "set_ratio": set_ratio},
    )  # fmt: skip
    sq = np.einsum("rd,rd->r", centroids, centroids).astype(np.float32)
    return ClusterMap(manifest, centroids, sq, indptr, np.concatenate(sets).astype(np.int32), counts)


def synthetic_rows(cmap: ClusterMap, rows: int, seed: int = 0) -> tuple[np.ndarray, int]:
    """``rows`` states, two consecutive rows (a sentence's beams) per cluster drawn by population, and the
    number of distinct clusters drawn."""
    rng = np.random.default_rng(seed + rows)
    sizes = np.diff(cmap.indptr)
    pop = np.add.reduceat(cmap.counts.astype(np.float64), cmap.indptr[:-1]) * (sizes > 0)
    n_clusters = math.ceil(rows / 2)
    chosen = rng.choice(len(pop), n_clusters, replace=n_clusters > (pop > 0).sum(), p=pop / pop.sum())
    which = np.repeat(chosen, 2)[:rows]
    noise = 0.02 * rng.standard_normal((rows, cmap.centroids.shape[1])).astype(np.float32)
    return cmap.centroids[which] + noise, len(set(chosen.tolist()))


def timed(fn: Callable[[], object], device: str, inner: int = 1) -> float:
    """Seconds per call of ``fn``, timed over a block of ``inner`` calls (perf_counter or CUDA events)."""
    if device.startswith("cuda"):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / inner
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def copy_bandwidth_gbps(device: str, mb: int = 256, rounds: int = 3) -> float:
    """Measured device copy bandwidth (read + write), a sanity reference next to the nominal peak: the best
    of ``rounds`` blocks of ``rounds`` copies."""
    x = torch.empty(mb * 2**20 // 4, dtype=torch.float32, device=device)
    y = torch.empty_like(x)
    y.copy_(x)
    return 2 * x.numel() * 4 / min(timed(lambda: y.copy_(x), device, rounds) for _ in range(rounds)) / 1e9


def peak_gbps(device_name: str) -> tuple[float | None, str]:
    key = next((k for k in PEAK_GBPS if k in device_name), None)
    return (PEAK_GBPS[key], f"nominal for {key}") if key else (None, "unknown device: no nominal peak")


def clustered_variants(device: str, args) -> list[tuple[str, dict]]:
    """(label, create_projection options) of the clustered variants to time on this device."""
    out = []
    for mode in ("union", "per-row"):
        if device.startswith("cuda"):
            out += [(f"{mode}/{be}", {"selection": mode, "backend": be}) for be in ("cupy", "torch")]
        else:
            out.append((mode, {"selection": mode}))
            if args.no_cache_variant:
                out.append((f"{mode}/nocache", {"selection": mode, "cache_mb": 0.0}))
    return out


def bench_size(n_vocab: int, d: int, rows_list: list[int], args, meta: dict) -> list[dict]:
    device, dtype = args.device, DTYPES[args.dtype]
    cuda = device.startswith("cuda")
    r = args.r or (200 if n_vocab <= 64_000 else (2000 if cuda else 256))
    w, b, fp = synthetic_weights(n_vocab, d, dtype, device)
    full = create_projection("full", w, b)
    itemsize = w.element_size()
    ratios = args.set_ratios if n_vocab <= 64_000 else args.set_ratios[:1]
    cases = []  # (fraction, set_ratio, cmap, {label: projection})
    for frac in args.fractions:
        for ratio in ratios:
            cmap = synthetic_map(n_vocab, d, r, frac, ratio, fp, seed=int(frac * 1000))
            projs = {}
            for label, opts in clustered_variants(device, args):
                try:
                    projs[label] = create_projection("clustered", w, b, cluster_map=cmap, **opts)
                except ValueError as exc:  # e.g. no CuPy: say so and time the rest
                    print(f"  skip {label}: {exc}", file=sys.stderr)
            cases.append((frac, ratio, cmap, projs))
    records: list[dict] = []
    for rows in rows_list:
        inner = args.inner or (20 if cuda else max(1, min(50, int(2e8 / (n_vocab * d * max(rows, 4))))))
        fns: dict[tuple, Callable[[], object]] = {}
        states = {}
        for frac, ratio, cmap, projs in cases:
            h_np, distinct = synthetic_rows(cmap, rows)
            h = torch.from_numpy(h_np).to(device=device, dtype=dtype)
            states[(frac, ratio)] = (h, distinct)
            if not fns:
                fns[("full", None, None)] = lambda h=h: full(h)
            for label, proj in projs.items():
                fns[(label, frac, ratio)] = lambda p=proj, h=h: p(h)
                if label == "union/cupy":  # the fused gather-GEMM alone, on this batch's union
                    fns[("union/cupy-gemm", frac, ratio)] = _gemm_only(proj, h)
        for fn in fns.values():  # warm-up (and kernel compilation)
            fn()
        times: dict[tuple, list[float]] = {key: [] for key in fns}
        for _ in range(args.repeats):
            for key, fn in fns.items():  # interleaved: every variant once per round
                times[key].append(timed(fn, device, inner))
        first = len(records)
        full_times = times[("full", None, None)]
        record = functools.partial(_record, meta, n_vocab, d, r, rows, t_full=statistics.median(full_times))
        row_bytes = (d + 1) * itemsize  # a row of W and its bias
        records.append(record(None, None, "full", "torch", full_times, n_vocab * row_bytes, {}))
        for frac, ratio, _, projs in cases:
            h, distinct = states[(frac, ratio)]
            for label, proj in projs.items():
                stats = _active_stats(proj, proj(h), h)
                w_bytes = stats.pop("bytes_w") * row_bytes
                cent = r * d * proj.prepared_map.centroids_t.element_size()
                stats["distinct_clusters"] = distinct
                ts = times[(label, frac, ratio)]
                records.append(record(frac, ratio, label, proj.backend, ts, w_bytes + cent, stats))
                gkey = ("union/cupy-gemm", frac, ratio)
                if label == "union/cupy" and gkey in times:  # the fused kernel's floor: no centroids read
                    records.append(record(frac, ratio, gkey[0], "cupy", times[gkey], w_bytes, dict(stats)))
        _print_rows(records[first:])
    return records


def _gemm_only(proj, h: torch.Tensor) -> Callable[[], object]:
    from fastvocab.kernels import cupy_ops

    pm = proj.prepared_map
    clusters = proj.assign(h)
    mask = cupy_ops.mark_active(clusters, pm.indptr, pm.indices.to(torch.int32), proj.n_vocab, pm.max_size)
    cols32, _ = cupy_ops.compact(mask)
    return lambda: cupy_ops.gather_gemm_union(h, proj.weight, proj.bias, cols32)


def _active_stats(proj, out, h) -> dict:
    """Union and per-row active fractions, W rows the call reads, cache hits."""
    pm = proj.prepared_map
    clusters = proj.assign(h).tolist()
    sizes = [pm.sizes[c] for c in clusters]
    uniq = sorted(set(clusters))
    union = torch.unique(torch.cat([pm.ids[c] for c in uniq])).numel()
    n = proj.n_vocab
    rows_w = union if proj.selection == "union" else sum(pm.sizes[c] for c in uniq)
    hits = sum(pm.blocks[c] is not None for c in clusters) / len(clusters)
    return {
        "union_fraction": union / n, "per_row_fraction": float(np.mean(sizes)) / n,
        "computed_columns": int(out.active_columns().sum()), "bytes_w": rows_w, "cache_hit_rate": hits,
    }  # fmt: skip


def _record(meta, n_vocab, d, r, rows, frac, ratio, method, backend, ts, bytes_read, stats, t_full) -> dict:
    t = statistics.median(ts)
    rec = {
        "device": meta["device"], "device_name": meta["device_name"], "dtype": meta["dtype"], "d": d,
        "N": n_vocab, "r": r, "rows": rows, "active_fraction": frac, "set_ratio": ratio, "method": method,
        "backend": backend, "time_us": t * 1e6, "time_us_min": min(ts) * 1e6,
        "time_us_all": [round(x * 1e6, 2) for x in ts], "ratio_vs_full": t_full / t,
        "bytes_read": int(bytes_read), "achieved_GBps": bytes_read / t / 1e9, **stats,
    }  # fmt: skip
    # the byte floor at the nominal peak, and at the copy bandwidth measured in this run
    for which, gbps in (("", meta["peak_gbps"]), ("measured_", meta.get("copy_gbps"))):
        if gbps:
            rec[f"floor_{which}us"] = bytes_read / (gbps * 1e9) * 1e6
            rec[f"time_over_{which}floor"] = t / (bytes_read / (gbps * 1e9))
    return rec


def _print_rows(recs: list[dict]) -> None:
    for rec in recs:
        active = rec["active_fraction"]
        frac = "-" if active is None else f"{100 * active:.0f}%/{rec['set_ratio']}"
        extra = ""
        if "union_fraction" in rec:
            extra = f"union {100 * rec['union_fraction']:5.1f}%  row {100 * rec['per_row_fraction']:5.1f}%"
        floor = f"{rec['time_over_floor']:6.2f}x floor" if "time_over_floor" in rec else ""
        if "time_over_measured_floor" in rec:
            floor += f" {rec['time_over_measured_floor']:6.2f}x measured floor"
        print(
            f"{rec['N']:>7} {rec['d']:>5} {rec['rows']:>4} {frac:>9}  {rec['method']:<16} "
            f"{rec['time_us']:>11.1f} us  x{rec['ratio_vs_full']:>6.2f}  {rec['achieved_GBps']:>7.1f} GB/s  "
            f"{floor}  {extra}",
            flush=True,
        )


def crossover(records: list[dict]) -> list[dict]:
    """Per (N, d, fraction, backend): the smallest row count from which per-row beats union."""
    times: dict[tuple, dict[str, dict[int, float]]] = {}  # (N, d, fraction, set ratio) -> method -> rows
    for r in records:
        if r["active_fraction"] is not None:
            key = (r["N"], r["d"], r["active_fraction"], r["set_ratio"])
            times.setdefault(key, {}).setdefault(r["method"], {})[r["rows"]] = r["time_us"]
    out = []
    for (n, d, frac, ratio), methods in sorted(times.items()):
        for suffix in ("", "/cupy", "/torch", "/nocache"):
            u, p = methods.get("union" + suffix, {}), methods.get("per-row" + suffix, {})
            if not (rows := sorted(set(u) & set(p))):
                continue
            wins = [k for k in rows if p[k] < u[k]]
            first = next((k for k in rows if all(p[j] < u[j] for j in rows if j >= k)), None)
            out.append({
                "N": n, "d": d, "active_fraction": frac, "set_ratio": ratio, "variant": suffix or "default",
                "rows": rows, "per_row_over_union": [round(p[k] / u[k], 3) for k in rows],
                "per_row_wins_at": wins, "per_row_wins_from": first,
            })  # fmt: skip
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    p.add_argument("--dtype", choices=sorted(DTYPES), help="fp32 on CPU, fp16 on GPU by default")
    p.add_argument("--sizes", help="N:d,... (default: 32000:256 on CPU, then 128000:1024,250000:1024)")
    p.add_argument("--rows", help="row counts (default 1,40,128; demo size also 2..64 on CPU)")
    floats = comma_list(float)
    p.add_argument("--fractions", type=floats, default="0.05,0.1,0.2", help="union active fractions")
    p.add_argument(
        "--set-ratios", type=floats, default="0.5,0.15",
        help="one cluster's set / the pool; later ones only at N <= 64K",
    )  # fmt: skip
    p.add_argument("--r", type=int, help="clusters (default 200 demo size, 2000 GPU, 256 CPU)")
    p.add_argument("--repeats", type=int, help="timed rounds (default 7 CPU, 20 GPU)")
    p.add_argument("--inner", type=int, help="calls per timed block (default: by size)")
    p.add_argument("--no-cache-variant", action="store_true", help="CPU: also time cache_mb=0")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.add_argument("--out", type=Path, help="result JSON (default benchmarks/results/...)")
    args = p.parse_args(argv)
    cuda = args.device.startswith("cuda")
    args.dtype = args.dtype or ("fp16" if cuda else "fp32")
    args.repeats = args.repeats or (20 if cuda else 7)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("bench_projection: --device cuda but torch sees no CUDA device")
    name = device_name(args.device)
    peak, peak_src = peak_gbps(name) if cuda else (None, "not used on CPU")
    if args.sizes:
        sizes = [tuple(int(v) for v in s.split(":")) for s in args.sizes.split(",")]
    else:
        sizes = ([] if cuda else [(32000, 256)]) + [(128000, 1024), (250000, 1024)]
    # copy_gbps: measured in this run (read + write), the floor that counts beside the nominal peak's
    meta = {"device": args.device, "device_name": name, "dtype": args.dtype, "peak_gbps": peak,
            "copy_gbps": copy_bandwidth_gbps(args.device)}  # fmt: skip
    header = {
        **meta, "peak_source": peak_src, "copy_bandwidth_GBps": meta["copy_gbps"], "torch": torch.__version__,
        "commit": git_commit(cwd=ROOT), "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "threads": torch.get_num_threads(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "host": platform.node(), "cupy": cupy_version(),
    }  # fmt: skip
    print(f"# {name}, {args.dtype}, torch {torch.__version__}, commit {header['commit']}")
    print(f"# copy bandwidth {header['copy_bandwidth_GBps']:.1f} GB/s; peak {peak} GB/s ({peak_src})")
    print(
        f"{'N':>7} {'d':>5} {'rows':>4} {'act/set':>9}  {'method':<16} {'time (median)':>14}  {'vs full':>7}"
    )
    records = []
    for n_vocab, d in sizes:
        if args.rows:
            rows_list = [int(x) for x in args.rows.split(",")]
        elif n_vocab <= 64_000 and not cuda:
            rows_list = [1, 2, 4, 8, 16, 40, 64, 128]
        else:
            rows_list = [1, 8, 40, 128] if cuda else [1, 40, 128]
        records += bench_size(n_vocab, d, rows_list, args, meta)
    cross = crossover(records)
    print("\n# per-row vs union (per-row time / union time by rows; < 1: per-row faster)")
    for c in cross:
        pairs = ", ".join(f"{k}:{v}" for k, v in zip(c["rows"], c["per_row_over_union"], strict=True))
        print(
            f"N={c['N']} d={c['d']} act={100 * c['active_fraction']:.0f}% set={c['set_ratio']} "
            f"[{c['variant']}] {pairs}  -> per-row wins from {c['per_row_wins_from']}"
        )
    out = args.out
    if out is None:
        slug = "cpu" if not cuda else "cuda-" + "-".join(name.lower().replace("nvidia", "").split())[:40]
        out = RESULTS / f"projection-{slug}-{dt.date.today().isoformat()}.json"
    write_result(out, {"meta": header, "results": records, "crossover": cross})
    return 0


if __name__ == "__main__":
    sys.exit(main())
