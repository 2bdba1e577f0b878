"""Where a decoder step's time goes (one thread), against CTranslate2's step on the same shapes.

Per dtype (float32; int8 = ``quantize_int8``), batch and beam, the static engine is fed ``--steps``
tokens after the prefix (beam: batch x beam rows, a reorder a step), timed (median of 3), then profiled
once: top-level ops counted, their time summed by kind; ``python`` = the profiled step less its ops;
``dispatch floor`` = ops x an empty op's cost. ``full_projection_ms``: the full projection of the dtype
and the top-k, per step (CTranslate2's step holds both). CTranslate2 (1 thread) runs the same lines forced
to ``--steps`` tokens; its step is a long call less a one-step call over the steps between (the encoder
cancels out).

    python benchmarks/bench_step_profile.py --out benchmarks/results/engine-profile-cpu-DATE.json

``--run``: instead, where a whole ``translate`` of ``--n`` test lines goes on one thread, per engine, dtype
and method (the shipped en-it map and shortlist): encoder, decoder steps, reorders, projection, the rest
(the search's own ops, tokenizing, detokenizing), the median of 3 after a warm-up.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

import torch
from bench_meta import ROOT, result_header, write_result

# top-level op name prefix -> kind (anything else: "other", mostly views, index_select and copies)
KINDS = {
    "gemm": ("aten::linear", "aten::addmm", "aten::mm", "quantized::linear_dynamic", "mkldnn", "fbgemm"),
    "attention": ("aten::matmul", "aten::bmm", "aten::softmax", "aten::_softmax", "aten::baddbmm"),
    "elementwise": ("aten::add", "aten::mul", "aten::layer_norm", "aten::relu", "aten::embedding"),
}


def kind(name: str) -> str:
    return next((k for k, names in KINDS.items() if any(name.startswith(n) for n in names)), "other")


def median_s(fn, n: int, skip: int = 0) -> float:
    """Median seconds of ``n`` calls of ``fn``, the first ``skip`` left out."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[skip:])


def run_steps(adapter, batch: dict, beam: int, steps: int):
    """Encode, feed the prefix, (beam) expand; returns a function that runs ``steps`` steps from there."""
    from fastvocab.decoding.steppers import EagerStepper

    rows = batch["input_ids"].shape[0] * beam
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, adapter.n_vocab, (steps, rows), generator=gen)
    perm = torch.arange(rows).view(-1, beam).flip(1).reshape(-1)  # a reorder within each sentence's beams

    def go(around=contextlib.nullcontext) -> float:
        st = EagerStepper(adapter)
        st.start(batch, "it", steps + 1, group=beam if beam > 1 else None)
        with around():
            t0 = time.perf_counter()
            for t in range(steps):
                st.step(tokens[t])
                if beam > 1:
                    st.reorder(perm, group=beam)
            return time.perf_counter() - t0

    return go


def profile(go, steps: int) -> dict:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprof

    go()  # warm-up
    times = [go() for _ in range(3)]
    prof = tprof(activities=[ProfilerActivity.CPU])
    profiled = go(lambda: prof) * 1e3
    top = [e for e in prof.events() if e.cpu_parent is None]
    by_kind: dict[str, float] = {}
    by_name: dict[str, float] = {}
    for e in top:
        by_kind[kind(e.name)] = by_kind.get(kind(e.name), 0.0) + e.cpu_time_total / 1e3
        by_name[e.name] = by_name.get(e.name, 0.0) + e.cpu_time_total / 1e3
    heavy = sorted(by_name.items(), key=lambda kv: -kv[1])[:6]
    one = torch.ones(1)
    empty_us = median_s(lambda: torch.add(one, one), 20000) * 1e6
    ops = len(top)
    return {
        "step_ms": round(statistics.median(times) / steps * 1e3, 3),  # no profiler
        "ops_per_step": round(ops / steps, 1),
        "profiled_ms_per_step": {k: round(v / steps, 3) for k, v in sorted(by_kind.items())},
        "top_ops_ms_per_step": {k: round(v / steps, 3) for k, v in heavy},
        "python_ms_per_step": round((profiled - sum(by_kind.values())) / steps, 3),
        "empty_op_us": round(empty_us, 2),
        "dispatch_floor_ms_per_step": round(ops / steps * empty_us / 1e3, 3),
    }


def projection_ms(adapter, dtype: str, rows: int, beam: int) -> float:
    """The full projection of this dtype (as ``translate`` builds it) and the search's choice, per step."""
    from fastvocab.tasks.projections import make_projection

    proj = make_projection(adapter, "full", int8=dtype == "int8")
    h = torch.randn(rows, adapter.d_model, generator=torch.Generator().manual_seed(1))
    return round(median_s(lambda: proj(h).topk(2 * beam if beam > 1 else 1), 40, skip=5) * 1e3, 3)


def ct2_step_ms(ct2_dir: Path, compute: str, adapter, lines: list[str], beam: int, steps: int) -> float:
    import ctranslate2

    tr = ctranslate2.Translator(str(ct2_dir), device="cpu", compute_type=compute, intra_threads=1)
    tok = adapter.tokenizer
    src = [tok.convert_ids_to_tokens(x) for x in adapter.tokenize(lines, "en", "it")]
    tag = tok.convert_ids_to_tokens(adapter.lang_id("it"))

    def call(n: int) -> float:  # every sentence decodes exactly n tokens after the language tag
        kw = dict(target_prefix=[[tag]] * len(src), beam_size=beam, max_decoding_length=n + 1)
        return median_s(lambda: tr.translate_batch(src, min_decoding_length=n + 1, **kw), 3)

    call(2)
    torch.set_num_threads(1)  # a Translator sets the calling thread's OpenMP count
    return round((call(steps) - call(1)) / (steps - 1) * 1e3, 3)


def run_breakdown(args) -> list[dict]:
    from fastvocab.artifacts_schema.corpus import read_direction
    from fastvocab.decoding import search, steppers
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.experiments.bench_methods import shortlist_folder
    from fastvocab.tasks.projections import clustered_options, make_projection
    from fastvocab.tasks.translate import SearchSettings, translate

    lines = read_direction(args.corpus, "en", "it", "test")[1][: args.n]
    spent: dict[str, float] = {}

    def timed(fn, part):
        def call(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            spent[part] = spent.get(part, 0.0) + time.perf_counter() - t0
            return out

        return call

    bind = search._bind
    search._bind = lambda proj, batch: timed(bind(proj, batch), "projection")
    for name, part in [("step", "steps"), ("reorder", "reorders"), ("start", "encoder and start")]:
        setattr(steppers.EagerStepper, name, timed(getattr(steppers.EagerStepper, name), part))
    rows = []
    for engine, dtype, method, beam in (x.split(":") for x in args.run.split(",")):
        adapter, exact = Seq2SeqAdapter.load(args.model, engine=engine), Seq2SeqAdapter.load(args.model)
        if dtype == "int8":
            adapter.quantize_int8()
        opts = {} if method == "full" else dict(
            cluster_map=args.maps / "en-it", shortlist=shortlist_folder(args.maps, "en-it"),
            **clustered_options("union", "auto", False, int(beam), None, True),
        )  # fmt: skip
        proj = make_projection(exact, method, int8=dtype == "int8", **opts)
        settings = SearchSettings(beam=int(beam), batch_size=args.batches_run)
        parts = []
        for _ in range(4):  # a warm-up, then 3
            spent.clear()
            r = translate(adapter, proj, lines, "en", "it", settings, workers=1, progress=False)
            parts.append({**spent, "total": r.seconds, "rest": r.seconds - sum(spent.values())})
        row = {
            "engine": engine,
            "dtype": dtype,
            "method": method,
            "beam": int(beam),
            "batch": args.batches_run,
        }
        row.update({k: round(statistics.median(p[k] for p in parts[1:]), 3) for k in parts[0]})
        print(row, flush=True)
        rows.append(row)
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    paths = {"model": ROOT / "models/demo", "corpus": ROOT / "data/corpus", "ct2-dir": None, "out": None}
    for flag, default in paths.items():  # --ct2-dir: a converted CTranslate2 model (converted if absent)
        p.add_argument(f"--{flag}", type=Path, default=default)
    for flag, default in [("batches", "32,8"), ("beams", "1,4"), ("steps", 24)]:
        p.add_argument(f"--{flag}", type=type(default), default=default)
    p.add_argument(
        "--run", help="engine:dtype:method:beam,... (e.g. onnx:int8:clustered:1): the whole-run mode"
    )
    p.add_argument("--maps", type=Path, default=ROOT / "models/demo-maps")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--batches-run", type=int, default=32, help="--run's batch size")
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.run:
        meta = {"model": str(args.model), "threads": 1, "lines": f"en-it test, first {args.n}"}
        write_result(args.out, {**result_header("run-breakdown"), **meta, "rows": run_breakdown(args)})
        return 0
    from bench_peer import convert_ct2

    from fastvocab.artifacts_schema.corpus import read_direction
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    torch.set_num_threads(1)
    _, src, _ = read_direction(args.corpus, "en", "it", "test")
    adapters = {"float32": Seq2SeqAdapter.load(args.model, engine="static")}
    adapters["int8"] = Seq2SeqAdapter.load(args.model, engine="static")
    adapters["int8"].quantize_int8()
    ct2_dir = args.ct2_dir or Path(tempfile.mkdtemp(prefix="ct2-")) / "model"
    if not (ct2_dir / "model.bin").exists():
        convert_ct2(args.model, ct2_dir)
    rows = []
    for batch_size in [int(b) for b in args.batches.split(",")]:
        lines = [s for s in src if s.strip()][:batch_size]
        for beam in [int(b) for b in args.beams.split(",")]:
            for dtype, adapter in adapters.items():
                row = {"dtype": dtype, "batch": batch_size, "beam": beam, "rows": batch_size * beam}
                batch = adapter.encode_texts(lines, "en", "it")
                row.update(profile(run_steps(adapter, batch, beam, args.steps), args.steps))
                row["full_projection_ms"] = projection_ms(adapter, dtype, batch_size * beam, beam)
                row["ct2_step_ms"] = ct2_step_ms(ct2_dir, dtype, adapter, lines, beam, args.steps)
                print(row, flush=True)
                rows.append(row)
    meta = {"model": str(args.model), "threads": 1, "steps": args.steps}
    write_result(args.out, {**result_header("step-profile"), **meta, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
