"""The Python half of the GPU campaign (``benchmarks/gpu/campaign.sh``): one subcommand per step.

    python benchmarks/gpu/steps.py env     --out DIR [--smoke]
    python benchmarks/gpu/steps.py static  --out DIR [--smoke]   # static-capacity union step, graph replay
    python benchmarks/gpu/steps.py e2e     --out DIR [--smoke]   # M2M100-418M-shaped random fp16 model
    python benchmarks/gpu/steps.py e2e-demo --out DIR [--smoke]  # the demo model through tasks.translate
    python benchmarks/gpu/steps.py dump    --out DIR [--smoke]   # dump throughput of the demo model

What each writes, what it may import and what ``--smoke`` checks: ``benchmarks/harnesses.md#gpustepspy``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_meta import device_name, git_commit, write_result  # noqa: E402
from bench_projection import copy_bandwidth_gbps, synthetic_map, synthetic_rows, timed  # noqa: E402
from summarize import e2e_demo_section, e2e_section, env_section, static_section  # noqa: E402

from fastvocab import switches  # noqa: E402

# The campaign's dtype: on the GPU, and in CPU smoke runs too, so that a half-precision bug shows here first.
DTYPE = torch.float16


def pick_device(smoke: bool) -> str:
    if torch.cuda.is_available():
        return "cuda"
    if not smoke:
        raise SystemExit("no CUDA device: run with --smoke on a CPU machine")
    return "cpu"


def meta(device: str, args: argparse.Namespace, **extra: object) -> dict:
    """What every result records: device, driver, CUDA, torch, CuPy, commit, load, the command."""
    out: dict[str, object] = {
        "device": device, "device_name": device_name(device), "torch": torch.__version__,
        "cuda": torch.version.cuda, "commit": os.environ.get("FV_COMMIT") or git_commit(cwd=ROOT),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node(),
        "loadavg": list(os.getloadavg()), "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "smoke": bool(args.smoke), "quick": bool(getattr(args, "quick", False)),
    }  # fmt: skip
    try:
        import cupy

        out["cupy"] = cupy.__version__
    except Exception as exc:  # missing, or a CuPy that cannot load its CUDA libraries
        out["cupy"] = f"unavailable: {type(exc).__name__}: {exc}"[:200]
    if device == "cuda":
        out.update(driver=_smi("driver_version"), gpu_memory_MiB=_smi("memory.total"))
    out.update(extra)
    return out


def _smi(field: str) -> str | None:
    query = ["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=30).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def matmul_tflops(device: str, n: int, dtype: torch.dtype) -> float:
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    a @ b
    sync(device)
    return 2 * n**3 / min(timed(lambda: a @ b, device, 3) for _ in range(3)) / 1e12


def step_env(args: argparse.Namespace) -> None:
    device = pick_device(args.smoke)
    res: dict[str, object] = {"python": sys.version.split()[0], "platform": platform.platform()}
    for mod in ("transformers", "pyarrow", "numpy", "safetensors", "sentencepiece", "sacrebleu", "triton"):
        try:
            res[mod] = __import__(mod).__version__
        except Exception as exc:
            res[mod] = f"unavailable: {exc}"[:120]
    for mod in ("ray", "faiss", "mlflow", "pydantic"):  # absent on the GPU image: the steps avoid them
        try:
            __import__(mod)
            res[mod] = "importable"
        except Exception:
            res[mod] = "absent"
    if device == "cuda":
        p = torch.cuda.get_device_properties(0)
        res.update(sm=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count,
                   memory_GiB=round(p.total_memory / 2**30, 1),
                   l2_MB=round(getattr(p, "L2_cache_size", 0) / 1e6, 1))  # fmt: skip
        res["nvidia_smi"] = subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout[-3000:]
    res["copy_GBps"] = copy_bandwidth_gbps(device, 8 if args.smoke else 1024, rounds=5)
    n = 256 if args.smoke else 8192
    dt = torch.float32 if device == "cpu" else torch.bfloat16
    res["matmul_TFLOPs"] = {"n": n, "dtype": str(dt), "value": matmul_tflops(device, n, dt)}
    if device == "cuda":
        res["matmul_TFLOPs_fp16"] = matmul_tflops(device, n, torch.float16)
        try:  # CuPy kernels compile (NVRTC) and run: the gpu extra's point
            from fastvocab.kernels import cupy_ops

            d = torch.randn(4, 64, device="cuda", dtype=torch.float16)
            got = cupy_ops.assign(d, torch.zeros(64, device="cuda"))
            res["cupy_kernels"] = "ok" if torch.equal(got, (-2.0 * d.float()).argmin(1)) else "WRONG"
        except Exception as exc:
            res["cupy_kernels"] = f"failed: {type(exc).__name__}: {exc}"[:300]
    payload = {"meta": meta(device, args), "env": res}
    print(env_section(payload) + f"\n\nCuPy kernels: {res.get('cupy_kernels', 'not run (no CUDA)')}")
    write_result(args.out / "gpu-env.json", payload)


def step_static(args: argparse.Namespace) -> None:
    """The static-capacity union step against today's union mode and full: eager and CUDA-graph replay
    (the shapes and capacities: ``benchmarks/harnesses.md#gpustepspy``)."""
    from fastvocab.decoding.steppers import capture_graph
    from fastvocab.kernels import create_projection
    from fastvocab.kernels.clustered_static import StaticUnion

    device = pick_device(args.smoke)
    cuda = device == "cuda"
    n_vocab, d, r = (4000, 64, 50) if args.smoke else (128_112, 1024, 2000)
    rows_list = [1, 5, 40] if args.smoke else [1, 40] if args.quick else [1, 5, 40, 128]
    fractions = [0.1] if args.smoke or args.quick else [0.05, 0.1, 0.2]
    repeats, inner = (3, 2) if args.smoke else (15, 20)
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(n_vocab, d, generator=g) / math.sqrt(d)).to(device, DTYPE)
    b = (0.1 * torch.randn(n_vocab, generator=g)).to(device, DTYPE)
    full = create_projection("full", w, b, fingerprint="synthetic")
    records = []
    for frac in fractions:
        cmap = synthetic_map(n_vocab, d, r, frac, 0.5, "synthetic", seed=int(frac * 100))
        kw = dict(cluster_map=cmap, selection="union", fingerprint="synthetic")
        union = {"union/torch": create_projection("clustered", w, b, backend="torch", cache_mb=0, **kw)}
        if cuda:
            try:
                union["union/cupy"] = create_projection("clustered", w, b, backend="cupy", **kw)
            except ValueError as exc:
                print(f"  skip union/cupy: {exc}")
        ref = union["union/torch"]
        for rows in rows_list:
            states, _ = synthetic_rows(cmap, rows)  # 2 beams per cluster
            h = torch.from_numpy(states).to(device, DTYPE)
            c = ref(h).ids.numel()
            fns: dict[str, Callable[[], object]] = {"full": lambda h=h: full(h)}
            for name, p in union.items():
                fns[name] = lambda p=p, h=h: p(h)
            caps = {"tight": min(n_vocab, -(-c // 256) * 256), "bound": None}
            statics = {}
            for cap_name, cap in caps.items():
                su = statics[cap_name] = StaticUnion(ref, capacity=cap, rows=rows, grow=False)
                fns[f"static/{cap_name}/eager"] = lambda su=su, h=h: su.step(h)
                if cuda:  # captured on a static copy of h; the callable replays the graph
                    fns[f"static/{cap_name}/graph"] = capture_graph(partial(su.step, h.clone()), warmups=2)
            for fn in fns.values():
                fn()
            sync(device)
            times: dict[str, list[float]] = {k: [] for k in fns}
            for _ in range(repeats):
                for k, fn in fns.items():
                    times[k].append(timed(fn, device, inner))
            t_full = statistics.median(times["full"])
            for k, ts in times.items():
                t = statistics.median(ts)
                cap = statics[k.split("/")[1]].capacity if k.startswith("static/") else None
                records.append({
                    "N": n_vocab, "d": d, "r": r, "rows": rows, "active_fraction": frac, "union_columns": c,
                    "capacity": cap, "variant": k, "time_us": t * 1e6,
                    "time_us_all": [round(x * 1e6, 2) for x in ts], "ratio_vs_full": t_full / t,
                })  # fmt: skip
    # Where the time goes at the last row count: each variant's kernels and their device time per call.
    profiles = {k: kernel_table(fn, device) for k, fn in fns.items() if not k.endswith("/graph")}
    payload = {
        "meta": meta(device, args, dtype=str(DTYPE)), "results": records,
        "kernels_per_call": {"rows": rows, "active_fraction": frac, "variants": profiles},
    }  # fmt: skip
    for k, table in profiles.items():
        total = sum(row["us_per_call"] for row in table)
        print(f"# {k} at {rows} rows: {len(table)} kernels, {total:.1f} us of device time per call")
        for row in table[:6]:
            print(f"    {row['us_per_call']:8.1f} us  x{row['calls_per_call']:<4g} {row['name'][:70]}")
    print(static_section(payload, None))
    write_result(args.out / "gpu-static.json", payload)


def kernel_table(fn: Callable[[], object], device: str, calls: int = 10) -> list[dict]:
    """The kernels ``fn`` launches (CPU ops on a CPU), by device time per call, largest first: what a
    CUDA-graph replay of ``fn`` costs at least, launch gaps aside."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    fn()
    sync(device)
    with profile(activities=activities) as prof:
        for _ in range(calls):
            fn()
        sync(device)
    rows = []
    for e in prof.key_averages():
        if cuda:
            if "CUDA" not in str(e.device_type):
                continue
            us = e.self_device_time_total
        else:
            if e.cpu_children or not e.key.startswith("aten::"):
                continue  # leaf CPU ops only, so nothing is counted twice
            us = e.self_cpu_time_total
        if us > 0:
            rows.append({"name": e.key, "us_per_call": us / calls, "calls_per_call": e.count / calls})
    return sorted(rows, key=lambda r: -r["us_per_call"])


def m2m100_arch(vocab_size: int, d_model: int, layers: int, heads: int, ffn: int) -> dict[str, int]:
    """An M2M100Config's sizes, the encoder's and the decoder's alike."""
    return dict(vocab_size=vocab_size, d_model=d_model, encoder_layers=layers, decoder_layers=layers,
                encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                decoder_ffn_dim=ffn)  # fmt: skip


M2M100_418M = m2m100_arch(128_112, 1024, 12, 16, 4096)
# a vocabulary above the demo tokenizer's ids: its language tags exist in the model (the searches)
SMOKE_ARCH = m2m100_arch(32_768, 64, 2, 4, 128)


def random_model(arch: dict, device: str, dtype: torch.dtype):
    """An M2M100 with random weights built from a config (nothing downloaded), eval mode, on ``device``."""
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    no_dropout = dict.fromkeys(
        ("dropout", "attention_dropout", "activation_dropout", "encoder_layerdrop", "decoder_layerdrop"), 0.0
    )
    cfg = M2M100Config(
        **arch, **no_dropout, max_position_embeddings=1024, scale_embedding=True, pad_token_id=1,
        bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(device):
        model = M2M100ForConditionalGeneration(cfg)
    return model.to(dtype).eval()


def fixed_decode(adapter, project, src: torch.Tensor, beam: int, steps: int) -> None:
    """``steps`` decoder steps for every row, no early stop (full and clustered do the same work):
    greedy (beam 1) or beam search's per-step work (top-2k per row, top-k per sentence, cache reorder)."""
    state = adapter.encode({"input_ids": src, "attention_mask": torch.ones_like(src)})
    n, dev = src.shape[0], src.device
    tok = torch.full((n * beam,), adapter.decoder_start_id, dtype=torch.long, device=dev)
    if beam > 1:
        state = adapter.reorder(state, torch.arange(n, device=dev).repeat_interleave(beam), group=beam)
    scores = torch.zeros(n, beam, device=dev)
    base = (torch.arange(n, device=dev) * beam)[:, None]
    for _ in range(steps):
        h, state = adapter.decoder_step(tok, state)
        out = project(h)
        if beam == 1:
            tok = out.to_vocab_ids(out.logits.argmax(dim=1, keepdim=True))[:, 0]
            continue
        vals, cols = out.topk(2 * beam)  # (n*beam, 2k) log-probs, vocabulary ids
        total = (vals.view(n, beam, -1) + scores[:, :, None]).view(n, -1)
        scores, flat = torch.topk(total, beam, dim=1)  # (n, beam)
        src_beam = flat // (2 * beam)
        tok = cols.view(n, -1).gather(1, flat).reshape(-1)
        state = adapter.reorder(state, (base + src_beam).reshape(-1), group=beam)


def step_e2e(args: argparse.Namespace) -> None:
    device = pick_device(args.smoke)
    arch = SMOKE_ARCH if args.smoke else M2M100_418M
    steps = 4 if args.smoke else args.steps
    src_len = 8 if args.smoke else 32
    settings = [(1, 1), (2, 4)] if args.smoke else [(1, 1), (2, 20), (4, 64)]  # (beam, batch)
    if args.quick:
        settings = settings[:2]
    repeats = 2 if args.smoke else min(args.repeats, 3) if args.quick else args.repeats
    t0 = time.perf_counter()
    e = E2e.build(arch, device, src_len, steps, repeats)
    load_s = time.perf_counter() - t0
    r = min(args.r, len(e.states))
    maps = e.add_clustered([0.1] if args.smoke or args.quick else [0.05, 0.1, 0.2], r)
    results = [rec for beam, batch in settings for rec in e.point(beam, batch)]
    for batch in [2] if args.smoke else [1, 40] if args.quick else [1, 5, 40, 128]:
        results.append(e.projection_share(batch))
    sets = {f: {"set_size": int(np.diff(m.indptr)[0])} for f, m in maps.items()}
    info = meta(device, args, dtype=str(DTYPE), arch=arch, steps=steps, src_len=src_len, r=r,
                model_build_s=load_s, maps=sets)  # fmt: skip
    payload = {"meta": info, "results": results}
    print(e2e_section(payload))
    write_result(args.out / "gpu-e2e.json", payload)


@dataclass
class E2e:
    """The e2e step's random model on both engines, its full projection, the decoder states that give the
    synthetic maps their centroids, and the variants timed: name -> (engine, projection)."""

    adapters: dict[str, Any]
    full: Any
    n_vocab: int
    d: int
    states: np.ndarray
    device: str
    src_len: int
    steps: int
    repeats: int
    variants: dict[str, tuple[str, Any]] = field(default_factory=dict)
    gen: torch.Generator = field(default_factory=lambda: torch.Generator().manual_seed(1))

    @classmethod
    def build(cls, arch: dict, device: str, src_len: int, steps: int, repeats: int) -> E2e:
        from transformers import AutoTokenizer

        from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
        from fastvocab.kernels import create_projection

        model = random_model(arch, device, DTYPE)
        tok = AutoTokenizer.from_pretrained(ROOT / "models" / "demo", local_files_only=True)  # its ids fit
        on = partial(Seq2SeqAdapter, model, tok, "random-m2m100", device, DTYPE, "synthetic", cache_len=64)
        adapters = {eng: on(engine=eng) for eng in ("hf", "static")}
        ad = adapters["static"]
        full = create_projection("full", ad.output_weight, ad.output_bias, fingerprint="synthetic")
        n_vocab, d = ad.output_weight.shape
        e = cls(adapters, full, n_vocab, d, np.zeros(0), device, src_len, steps, repeats)
        # Centroids: hidden states of a short full-softmax decode (random weights: no trained clusters exist).
        seen: list[torch.Tensor] = []

        def record(h):
            seen.append(h.float().cpu())
            return full(h)

        with torch.inference_mode():
            fixed_decode(ad, record, e.source(64), 1, 8)
        e.states = torch.cat(seen).numpy()
        e.variants = {"full/hf": ("hf", full), "full/static": ("static", full)}
        return e

    def source(self, rows: int) -> torch.Tensor:
        return torch.randint(4, self.n_vocab, (rows, self.src_len), generator=self.gen).to(self.device)

    def add_clustered(self, fractions: list[float], r: int) -> dict:
        """A synthetic map a fraction, and its clustered variants (CuPy only on CUDA: per-row/torch groups
        rows in Python, 6.6 ms a call at 128 rows on an H100); returns the maps by fraction."""
        from fastvocab.kernels import create_projection

        ad = self.adapters["static"]
        w, b, n_vocab, d = ad.output_weight, ad.output_bias, self.n_vocab, self.d
        cent = self.states[np.random.default_rng(0).choice(len(self.states), r, replace=False)]
        cuda = self.device == "cuda"
        modes = (
            {"cupy": ("union", "per-row"), "torch": ("union",)} if cuda else {"torch": ("union", "per-row")}
        )
        maps = {}
        for frac in fractions:
            cmap = synthetic_map(n_vocab, d, r, frac, 0.5, "synthetic", seed=int(frac * 100), centroids=cent)
            maps[frac] = cmap
            kw = dict(cluster_map=cmap, fingerprint="synthetic")
            for be, be_modes in modes.items():
                for mode in be_modes:
                    try:
                        p = create_projection("clustered", w, b, selection=mode, backend=be, **kw)
                    except ValueError as exc:
                        print(f"  skip {mode}/{be}: {exc}")
                        continue
                    self.variants[f"{mode}/{be}/{frac}"] = ("static", p)
            ref = create_projection("clustered", w, b, selection="union", backend="torch", cache_mb=0, **kw)
            self.variants[f"union-static/{frac}"] = ("static", _StaticProject(ref))
        return maps

    def point(self, beam: int, batch: int) -> list[dict]:
        """A record a variant timed at this point (``benchmarks/harnesses.md#gpustepspy``), and the
        projection's share of a full static step."""
        device, steps, ad, full = self.device, self.steps, self.adapters["static"], self.full
        src = self.source(batch)
        for _eng, p in self.variants.values():
            if isinstance(p, _StaticProject):
                p.size_for(batch * beam)
        times: dict[str, list[float]] = {k: [] for k in self.variants}
        proj_only: dict[str, list[float]] = {}

        def run(eng, p):
            return lambda: fixed_decode(self.adapters[eng], p, src, beam, steps)

        with torch.inference_mode():
            for eng, p in self.variants.values():  # warm-up (CuPy compilation, cuBLAS handles)
                fixed_decode(self.adapters[eng], p, src, beam, 2)
            # Greedy and beam 2 through the searches themselves (max_len = steps; random weights: no row
            # ends early), eager and with the whole step in CUDA graphs (decoding.steppers.CapturedStepper)
            graphed: dict[str, Callable[[], object]] = {}
            if beam <= 2:
                graphed["full/search"] = searched(ad, full, src, steps, False, beam)
                graphed["full/search-graph"] = searched(ad, full, src, steps, True, beam)
                for k, (_, p) in self.variants.items():
                    if isinstance(p, _StaticProject):
                        graphed[f"{k}/search"] = searched(ad, p, src, steps, False, beam)
                        graphed[f"{k}/search-graph"] = searched(ad, p.su, src, steps, True, beam)
                times.update({k: [] for k in graphed})
            hs = torch.randn(batch * beam, self.d, device=device).to(DTYPE)
            for _ in range(self.repeats):
                for k, (eng, p) in self.variants.items():
                    times[k].append(timed(run(eng, p), device))
                for k, fn in graphed.items():
                    times[k].append(timed(fn, device))
                for k, (_, p) in self.variants.items():  # the output layer alone, on the same rows
                    if k != "full/hf":
                        proj_only.setdefault(k, []).append(timed(lambda p=p: p(hs), device, 10))
                if beam == 1:  # the decoder alone (a stand-in projection): the rest of a greedy step
                    t_dec = timed(run("static", _Noop(self.n_vocab)), device)
                    times.setdefault("decoder-only/static", []).append(t_dec)
        t_full = statistics.median(times["full/static"])
        tokens = batch * beam * steps
        results = []
        for k, ts in times.items():
            t = statistics.median(ts)
            results.append({"beam": beam, "batch": batch, "steps": steps, "variant": k, "time_s": t,
                            "tokens_per_s": tokens / t, "speedup_vs_full_static": t_full / t,
                            "times_s": ts})  # fmt: skip
        # what removing the output layer entirely would save
        share = max(0.0, 1 - statistics.median(times["decoder-only/static"]) / t_full) if beam == 1 else None
        results.append({
            "beam": beam, "batch": batch, "variant": "projection-alone",
            "per_call_us": {k: statistics.median(v) * 1e6 for k, v in proj_only.items()},
            "projection_share_of_full_static_step": share,
        })  # fmt: skip
        return results

    def projection_share(self, batch: int) -> dict:
        """The full projection's share of a greedy static-engine step at ``batch`` rows."""
        ad, device, steps = self.adapters["static"], self.device, self.steps
        src = self.source(batch)
        noop = _Noop(self.n_vocab)
        t: dict[str, list[float]] = {"full": [], "decoder-only": []}
        with torch.inference_mode():
            fixed_decode(ad, self.full, src, 1, 2)
            for _ in range(self.repeats):
                t["full"].append(timed(lambda: fixed_decode(ad, self.full, src, 1, steps), device))
                t["decoder-only"].append(timed(lambda: fixed_decode(ad, noop, src, 1, steps), device))
        tf, td = statistics.median(t["full"]), statistics.median(t["decoder-only"])
        share = max(0.0, 1 - td / tf)
        print(f"   batch {batch:>3} greedy: full step {tf / steps * 1e3:.2f} ms, share {share:.2f}")
        return {
            "beam": 1, "batch": batch, "variant": "projection-share", "full_step_ms": tf / steps * 1e3,
            "decoder_only_step_ms": td / steps * 1e3, "projection_share_of_full_static_step": share,
            "times_s": t,
        }  # fmt: skip


def searched(
    adapter, projection, src: torch.Tensor, steps: int, graph: bool, beam: int = 1
) -> Callable[[], object]:
    """A search of ``steps`` tokens over ``src``, greedy (``beam`` 1) or beam: ``decoding.search``'s, or with
    ``graph`` the captured stepper's (eager without CUDA, so ``--smoke`` checks the code)."""
    from fastvocab.decoding.search import beam_search, greedy_search
    from fastvocab.decoding.settings import SearchSettings
    from fastvocab.decoding.steppers import CapturedStepper, EagerStepper

    batch = {"input_ids": src, "attention_mask": torch.ones_like(src)}

    def stepper():
        return CapturedStepper(adapter) if graph else EagerStepper(adapter)

    if beam == 1:
        return lambda: greedy_search(adapter, projection, batch, "en", "it", max_len=steps, stepper=stepper())
    settings = SearchSettings(beam=beam, max_len=steps, early_stopping=False)
    return lambda: beam_search(adapter, projection, batch, "en", "it", settings, stepper=stepper())


@dataclass(eq=False)  # hashed and compared by identity, as a projection is
class _StaticProject:
    """The static-capacity union step as a search's ``project`` (eager, falls back on overflow)."""

    ref: Any
    su: Any = None

    def size_for(self, rows: int) -> None:
        from fastvocab.kernels.clustered_static import StaticUnion

        self.su = StaticUnion(self.ref, rows=rows)

    def __call__(self, h):
        return self.su.project(h)


@dataclass(eq=False)
class _Noop:
    """A projection stand-in that costs one tiny op: the decoder step's time without the output layer."""

    n_vocab: int

    def __call__(self, h):
        from fastvocab.kernels.base import ProjectionOutput

        return ProjectionOutput(logits=h[:, :1], ids=torch.zeros(1, dtype=torch.long, device=h.device),
                                n_vocab=self.n_vocab)  # fmt: skip


def step_e2e_demo(args: argparse.Namespace) -> None:
    """End to end on the demo model: ``tasks.translate`` over real test lines, full and clustered, each eager
    and with the whole step in CUDA graphs (the settings, and why both line counts are recorded:
    ``benchmarks/harnesses.md#gpustepspy``)."""
    from fastvocab.artifacts_schema.cluster_map import resolve_map_dir
    from fastvocab.artifacts_schema.errors import ArtifactError
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.tasks.projections import clustered_options, make_projection
    from fastvocab.tasks.translate import SearchSettings, translate

    device = pick_device(args.smoke)
    ad = Seq2SeqAdapter.load(ROOT / "models" / "demo", device=device, dtype=DTYPE)
    # (beam, batch, lines)
    settings = [(1, 1, 6), (2, 4, 8)] if args.smoke else [(1, 1, 64), (2, 20, 200), (4, 64, 256)]
    if args.quick and not args.smoke:
        settings = [(1, 1, 32), (2, 20, 100)]
    max_len = 24 if args.smoke else 128
    repeats = 1 if args.smoke else 2 if args.quick else 3
    texts = _dump_pairs(max(n for *_, n in settings), train=False)[0]  # sources only
    try:
        map_dir: Path | None = resolve_map_dir(ROOT / "runs" / "demo" / "maps", "en", "it")
    except ArtifactError as exc:
        map_dir = None
        print(f"clustered skipped: {exc} (carry runs/demo/maps/en-it)")
    full = make_projection(ad, "full")
    results = []
    for beam, batch, n in settings:
        lines = texts[:n]
        projs = {"full": full}
        if map_dir is not None:
            opts = clustered_options("union", "auto", False, beam)
            projs["clustered"] = make_projection(ad, "clustered", cluster_map=map_dir, **opts)
        kw = dict(beam=beam, batch_size=batch, max_len=max_len)
        base: dict[str, list[str]] = {}
        for name, proj in projs.items():
            for graphs in ("off", "on"):
                variant = f"{name}/{'graph' if graphs == 'on' else 'eager'}"
                search = SearchSettings(graphs=graphs, **kw)
                translate(ad, proj, lines[:batch], "en", "it", search, progress=False)  # warm-up
                runs = []
                for _ in range(repeats):
                    sync(device)
                    runs.append(translate(ad, proj, lines, "en", "it", search, progress=False))
                    sync(device)
                hyp = runs[-1].hypotheses
                base.setdefault(name, hyp)
                t = statistics.median(r.seconds for r in runs)
                results.append({
                    "beam": beam, "batch": batch, "lines": len(lines), "variant": variant,
                    "options": proj.options(), "seconds": t, "times_s": [r.seconds for r in runs],
                    "tokens": runs[-1].target_tokens, "tokens_per_s": runs[-1].target_tokens / t,
                    "lines_per_s": len(lines) / t,
                    "same_lines_as_full_eager": sum(a == b for a, b in zip(hyp, base["full"], strict=True)),
                    "same_lines_as_eager": sum(a == b for a, b in zip(hyp, base[name], strict=True)),
                })  # fmt: skip
        t_full = next(r["seconds"] for r in results if r["variant"] == "full/eager" and r["beam"] == beam)
        for r in results:
            if r["beam"] == beam:
                r["speedup_vs_full_eager"] = t_full / r["seconds"]
    used = None if map_dir is None else str(map_dir.relative_to(ROOT))
    info = meta(device, args, dtype=str(DTYPE), model="models/demo", engine=ad.engine, map=used,
                max_len=max_len, repeats=repeats)  # fmt: skip
    payload = {"meta": info, "results": results}
    print(e2e_demo_section(payload))
    write_result(args.out / "gpu-e2e-demo.json", payload)


def step_dump(args: argparse.Namespace) -> None:
    """States/s of the dump of ``models/demo`` by path and batch size, on length-sorted train lines (the
    paths: ``benchmarks/harnesses.md#gpustepspy``)."""
    from fastvocab.tasks.context import RunContext, describe_model
    from fastvocab.tasks.dump import ShardSpec

    device = pick_device(args.smoke)
    dtype = str(DTYPE).removeprefix("torch.")
    texts, refs = _dump_pairs(64 if args.smoke else args.sentences)
    ctx = RunContext(describe_model(ROOT / "models" / "demo"), device=device, dtype=dtype)
    small = [16] if args.smoke else None
    plan = [  # (path, graphs, beam, batch sizes, mode)
        ("greedy eager, read back every step", "off", 1, small or [512], "records"),
        ("greedy eager", "off", 1, small or [512, 2048], "records"),
        ("greedy captured", "on", 1, small or [256, 512, 1024, 2048, 4096], "records"),
        ("reference (teacher forcing)", "off", 0, small or [512, 2048], "records"),
        # the reference path at fixed rows a projection call (the default, teacher_rows, picks 8,192 here)
        *[(f"reference rows {r}", "off", 0, small or [2048], "records") for r in (256, 1024, 4096)],
        ("greedy captured, shards to Parquet", "on", 1, small or [1024], "shard"),
        ("greedy captured, streamed counts r 1000", "on", 1, small or [512, 1024], "stream"),
    ]
    if args.paths:  # a subset, by words of the path's name
        plan = [v for v in plan if any(w in v[0] for w in args.paths.split(","))]
    if args.batches:  # a subset of the batch sizes
        keep = {int(b) for b in args.batches.split(",")}
        plan = [(*v[:3], [b for b in v[3] if b in keep], v[4]) for v in plan]
    work = DumpWork(
        ctx, ShardSpec("en-it", 0, tuple(range(len(texts))), tuple(texts), None, tuple(refs)),
        budget=3.0 if args.smoke else args.variant_seconds,
    )  # fmt: skip
    payload = {"meta": meta(device, args, dtype=dtype, model="models/demo", k=8, max_len=128), "results": []}
    for name, graphs, beam, batches, mode in plan:
        for bs in [b for b in batches for _ in range(args.repeat)]:  # repeats: what a first run pays
            try:
                row = work.run(name, graphs, beam, bs, mode)
            except Exception as exc:  # one path failing leaves the others' numbers
                row = {"path": name, "batch_size": bs, "error": f"{type(exc).__name__}: {exc}"[:500]}
                print(f"{name} b{bs}: FAILED {row['error']}")
            payload["results"].append(row)
            if device == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            write_result(args.out / "gpu-dump.json", payload)
    agreed = [texts[i] for i in work.order[: 16 if args.smoke else 512]]
    try:
        payload["agreement"] = _captured_agreement(ctx, agreed)
    except Exception as exc:
        payload["agreement"] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
    print("captured vs eager on the same lines:", payload["agreement"])
    write_result(args.out / "gpu-dump.json", payload)


class DumpWork:
    """The lines every dump path of :func:`step_dump` decodes, and one timed run of a path."""

    def __init__(self, ctx, spec, budget: float) -> None:
        self.ctx, self.spec, self.budget = ctx, spec, budget
        self.order = sorted(range(len(spec.texts)), key=lambda i: (len(spec.texts[i]), i))

    def run(self, name: str, graphs: str, beam: int, bs: int, mode: str) -> dict:
        from fastvocab.tasks import dump as dump_mod
        from fastvocab.tasks.dump import DumpDecoder, DumpSettings, ShardSpec, run_dump_shard
        from fastvocab.tasks.stream import stream_counts

        texts, refs, device = self.spec.texts, self.spec.references, self.ctx.device
        dec = DumpDecoder(self.ctx, DumpSettings(k=8, max_len=128, batch_size=bs, beam=beam, graphs=graphs))
        rows = int(name.split("rows ")[1]) if "rows " in name else dump_mod.teacher_rows(device, dec.n_vocab)
        # a path named "rows R" runs R rows a projection call (the bounds of teacher_rows set to R)
        held = contextlib.ExitStack()
        if "rows " in name:
            held.enter_context(switches.override(TEACHER_ROWS=rows, TEACHER_ROWS_CUDA=rows))
        if "every step" in name:  # the comparison point: every step's records read back to the host
            record = dec._record

            def record_and_read(rec, *a):
                record(rec, *a)
                for v in rec.values():
                    v[-1].cpu()

            dec._record = record_and_read
        warm = self.order[: min(bs, 64)]
        dec.records([texts[i] for i in warm], "en", "it", [refs[i] for i in warm])  # lazy inits, cuBLAS
        sync(device)
        states, done, t0 = 0, 0, time.perf_counter()
        if mode == "records":
            for lo in range(0, len(self.order), bs):
                sel = self.order[lo : lo + bs]
                rec = dec.records([texts[i] for i in sel], "en", "it", [refs[i] for i in sel])
                host = {k: v.cpu().numpy() for k, v in rec.items()}  # what a shard writes
                states += len(host["step"])
                done += len(sel)
                if time.perf_counter() - t0 > self.budget:
                    break
        else:
            # a shard of about the budget at 200K states/s (23 states a line)
            done = min(len(texts), max(64, int(self.budget * 200_000 / 23)))
            cut = ShardSpec("en-it", 0, self.spec.sent_ids[:done], texts[:done], None, refs[:done])
            if mode == "shard":
                states = int(run_dump_shard(dec, cut, Path(tempfile.mkdtemp()) / "states")["states"])
            else:
                cents = np.random.default_rng(0).standard_normal((1000, dec.d)).astype(np.float32)
                states = stream_counts(dec, cut, cents, 8)[0].states
        sync(device)
        t = time.perf_counter() - t0
        held.close()
        print(
            f"{name:<42} b{bs:>5}: {states:>8} states {done:>6} lines in {t:6.1f} s = "
            f"{states / t:>9,.0f} states/s"
        )
        return {
            "path": name, "graphs": dec.settings.graphs, "beam": beam, "batch_size": bs, "mode": mode,
            "teacher_rows": rows if beam == 0 else None,
            "sentences": done, "states": states, "seconds": round(t, 3), "states_per_s": round(states / t),
            "states_per_sentence": round(states / max(done, 1), 2),
            "peak_gpu_MiB": round(torch.cuda.max_memory_allocated() / 2**20) if device == "cuda" else None,
        }  # fmt: skip


def _captured_agreement(ctx, texts: list[str]) -> dict:
    """How the captured dump's rows compare with the eager one's on the same lines (fp16 rounding differs
    with the batch's shape): rows, same rows, same top-1 id, largest |h| difference."""
    from fastvocab.tasks.dump import DumpDecoder, DumpSettings

    cols = {"sent_id": np.arange(len(texts)), "text": np.array(texts, dtype=object),
            "src_lang": np.array(["en"] * len(texts), dtype=object),
            "tgt_lang": np.array(["it"] * len(texts), dtype=object)}  # fmt: skip
    settings = partial(DumpSettings, k=8, max_len=128, batch_size=len(texts))
    e, c = (DumpDecoder(ctx, settings(graphs=graphs))(cols) for graphs in ("off", "on"))
    key = lambda o: list(zip(o["sent_id"].tolist(), o["step"].tolist(), strict=True))  # noqa: E731
    same_rows = key(e) == key(c)
    res: dict[str, object] = {"lines": len(texts), "rows_eager": len(e["step"]),
                              "rows_captured": len(c["step"]), "same_rows": same_rows}  # fmt: skip
    sent_same = [
        np.array_equal(e["topk_ids"][e["sent_id"] == s, 0], c["topk_ids"][c["sent_id"] == s, 0])
        for s in range(len(texts))
    ]
    res["sentences_same_greedy_path"] = int(sum(sent_same))
    if same_rows:
        res["top1_same"] = float((e["topk_ids"][:, 0] == c["topk_ids"][:, 0]).mean())
        res["max_abs_h_diff"] = float(
            np.abs(e["hidden"].astype(np.float32) - c["hidden"].astype(np.float32)).max()
        )
    return res


def _dump_pairs(n: int, train: bool = True) -> tuple[list[str], list[str]]:
    """English lines and their Italian references: with ``train``, ``work/gpu-carry/dump-en-it.parquet`` when
    carried (the first 40,000 en-it train pairs); else the test split (1,000 pairs); else the README's lines
    as both (a fallback so the steps run without the corpus; recorded)."""
    import pyarrow.parquet as pq

    test = ROOT / "data" / "corpus" / "en-it" / "test.parquet"
    for path in (ROOT / "work" / "gpu-carry" / "dump-en-it.parquet", test) if train else (test,):
        if path.exists():
            t = pq.read_table(path, columns=["text1", "text2"])
            pairs = zip(t.column("text1").to_pylist(), t.column("text2").to_pylist(), strict=True)
            kept = [(a, b) for a, b in pairs if a.strip()][:n]
            print(f"texts: {len(kept)} pairs from {path}")
            return [a for a, _ in kept], [b for _, b in kept]
    lines = [ln.strip("#-* ").strip() for ln in (ROOT / "README.md").read_text().splitlines() if len(ln) > 40]
    print(f"texts: {test} not carried; {min(n, len(lines))} README lines instead")
    texts = (lines * (1 + n // max(1, len(lines))))[:n]
    return texts, texts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("step", choices=["env", "static", "e2e", "e2e-demo", "dump"])
    p.add_argument("--out", type=Path, required=True, help="folder for gpu-<step>.json")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, CPU allowed: checks the script")
    p.add_argument(
        "--quick", action="store_true",
        help="the goal points only (10%% active; rows 1 and 40; beam 1 batch 1, beam 2 batch 20)",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=32, help="e2e: decoder steps per run")
    p.add_argument("--repeats", type=int, default=5, help="e2e: timed rounds (median)")
    p.add_argument("--r", type=int, default=2000, help="e2e: clusters of the synthetic maps")
    p.add_argument("--sentences", type=int, default=40000, help="dump: source sentences (at most)")
    p.add_argument("--batches", default="", help="dump: only these batch sizes (a,b)")
    p.add_argument("--repeat", type=int, default=1, help="dump: runs of each path and batch size")
    p.add_argument("--variant-seconds", type=float, default=20.0, help="dump: time per path and batch size")
    p.add_argument(
        "--paths", default="", help="dump: only the paths whose names hold one of these words (a,b)"
    )
    args = p.parse_args(argv)
    torch.set_num_threads(2 if args.smoke else min(16, os.cpu_count() or 1))
    steps = {"env": step_env, "static": step_static, "e2e": step_e2e, "e2e-demo": step_e2e_demo,
             "dump": step_dump}  # fmt: skip
    steps[args.step](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
