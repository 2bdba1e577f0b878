"""fastvocab against CTranslate2 on the same lines, threads, beam and batch (the peer table).

    .venv/bin/pip install -e '.[bench]'      # ctranslate2==4.8.5
    make demo                                 # models/demo, data/corpus, runs/demo/maps
    .venv/bin/python benchmarks/bench_peer.py # the peer table (greedy, beam 4)

Its defaults, how it times, which systems it runs and how (threads, workers, beam stopping, CTranslate2's
vocabulary map), what it records per system: ``benchmarks/harnesses.md#bench_peerpy``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from bench_meta import RESULTS, bleu_chrf, emulation, provenance, round_order, scratch_dir, write_result

from fastvocab.decoding.search import parse_early_stopping, stopping_rule
from fastvocab.kernels.clustered_parts import BEAM_INACTIVE_MASS, INACTIVE_MASS, SHORTLIST_BEAM_INACTIVE_MASS
from fastvocab.kernels.int8 import many_rows_gemm
from fastvocab.kernels.int8_union import gather_multiply
from fastvocab.tasks.evaluate import score, search_error_rate
from fastvocab.tasks.projections import clustered_options


def load_lines(args) -> tuple[list[str], list[str] | None, str]:
    """(sources, references or None, where they came from)."""
    if args.lines:
        lines = [x for x in Path(args.lines).read_text(encoding="utf-8").splitlines() if x.strip()]
        return lines[: args.n], None, f"{args.lines} (first {args.n} non-empty lines)"
    from fastvocab.artifacts_schema.corpus import read_direction

    _, src, ref = read_direction(args.corpus, args.src_lang, args.tgt_lang, args.split)
    pairs = [(s, r) for s, r in zip(src, ref, strict=True) if s.strip()][: args.n]
    where = f"{args.corpus} {args.src_lang}-{args.tgt_lang} {args.split} split (first {len(pairs)} rows)"
    return [s for s, _ in pairs], [r for _, r in pairs], where


def convert_ct2(model: Path, out: Path) -> None:
    exe = Path(sys.executable).parent / "ct2-transformers-converter"
    cmd = [str(exe), "--model", str(model), "--output_dir", str(out), "--force"]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


class Ct2System:
    """CTranslate2 with the adapter's tokenizer: source pieces in, target pieces out, decoded alike."""

    def __init__(self, ct2_dir: Path, compute_type: str, adapter, args, use_vmap: bool = False) -> None:
        import ctranslate2

        # --parallel workers: batches on 1-thread workers, as fastvocab's translate runs them on CPU. The vmap
        # systems call translate_batch once per batch (below), which leaves inter_threads nothing to share.
        workers = args.parallel == "workers" and not use_vmap
        self.tr = ctranslate2.Translator(
            str(ct2_dir), device="cpu", compute_type=compute_type,
            intra_threads=1 if workers else args.threads, inter_threads=args.threads if workers else 1,
        )  # fmt: skip
        self.adapter, self.args, self.use_vmap = adapter, args, use_vmap
        self.tag = adapter.tokenizer.convert_ids_to_tokens(adapter.lang_id(args.tgt_lang))

    def __call__(self, lines: list[str], beam: int) -> tuple[float, list[str]]:
        tok = self.adapter.tokenizer
        t0 = time.perf_counter()
        ids = self.adapter.tokenize(lines, self.args.src_lang, self.args.tgt_lang)
        src = [tok.convert_ids_to_tokens(x) for x in ids]
        res = self._translate_vmap(src, beam) if self.use_vmap else self._translate(src, beam)
        out = self.adapter.decode_ids([tok.convert_tokens_to_ids(r.hypotheses[0]) for r in res])
        return time.perf_counter() - t0, out

    def _translate(self, src: list[list[str]], beam: int, **kw) -> list:
        return self.tr.translate_batch(
            src, target_prefix=[[self.tag]] * len(src), beam_size=beam, max_batch_size=self.args.batch_size,
            batch_type="examples", length_penalty=1.0,
            max_decoding_length=self.args.max_len + 1,  # + the forced language tag
            **kw,
        )  # fmt: skip

    def _translate_vmap(self, src: list[list[str]], beam: int) -> list:
        """One call per batch (CTranslate2 sorts a call's lines by length within it: the batches are
        formed here the same way), each after a one-step full-vocabulary call (the stale-map bug)."""
        order = sorted(range(len(src)), key=lambda i: -len(src[i]))
        res: list = [None] * len(src)
        bs = self.args.batch_size
        for lo in range(0, len(order), bs):
            chunk = order[lo : lo + bs]
            # also before the first: the previous call's batch is stale too
            self.tr.translate_batch(
                src[:1], target_prefix=[[self.tag]], beam_size=1, max_decoding_length=2, use_vmap=False
            )
            got = self._translate([src[i] for i in chunk], beam, use_vmap=True)
            for i, r in zip(chunk, got, strict=True):
                res[i] = r
        return res


def paired_ratio(numerators: list[float], denominators: list[float]) -> float | None:
    """The median of the per-round ratios (paired rounds: load drift cancels), None where either system was
    not timed (``--timed``)."""
    if not numerators or not denominators:
        return None
    return round(statistics.median([n / d for n, d in zip(numerators, denominators, strict=True)]), 3)


def fastvocab_system(adapter, projection, args) -> Callable[[list[str], int], tuple[float, list[str]]]:
    """``projection``: one projection for every beam, or a dict beam -> projection (clustered: the
    inactive-mass estimate depends on the beam). The returned function's ``projection_seconds[0]`` holds the
    seconds its last call spent in projection steps (summed over the workers); its workers are kept from
    call to call (``benchmarks/harnesses.md#bench_peerpy``)."""
    from fastvocab.tasks.decode_pool import DecodePool
    from fastvocab.tasks.translate import SearchSettings, translate

    spent = [0.0]
    pools: dict[int, DecodePool] = {}  # id(projection) -> its kept workers

    def run(lines: list[str], beam: int) -> tuple[float, list[str]]:
        # Creating a ctranslate2.Translator sets the calling thread's OpenMP thread count to its
        # intra_threads (torch.get_num_threads() reads 1 after one with intra_threads=1): set it back.
        torch.set_num_threads(args.threads)
        proj = projection[beam] if isinstance(projection, dict) else projection
        proj.time_steps()  # from zero: another system may share this projection
        workers = None if args.parallel == "workers" else 1
        if args.fresh_workers or id(proj) not in pools:
            pools[id(proj)] = DecodePool(adapter, proj, workers, args.worker_kind)
        search = SearchSettings(
            beam=beam, batch_size=args.batch_size, max_len=args.max_len, early_stopping=args.early_stopping
        )
        pool = pools[id(proj)]
        r = translate(adapter, proj, lines, args.src_lang, args.tgt_lang, search, progress=False, pool=pool)
        if args.fresh_workers:  # this call's workers end with it
            pools.pop(id(proj)).close()
        spent[0] = proj.step_seconds
        if hasattr(proj, "reset_counters"):  # clustered: the columns and skipped rows of this call
            stats[0] = proj.stats()
            probe = getattr(proj, "step_probe", None)  # int8: where steps of many rows skip the map, why
            stats[0]["map_probe"] = None if probe is None else probe.describe()
            proj.reset_counters()
        return r.seconds, r.hypotheses

    stats: list[dict] = [{}]
    run.projection_seconds = spent  # type: ignore[attr-defined]
    run.projection_stats = stats  # type: ignore[attr-defined]
    return run


def build_systems(args) -> tuple[dict[str, Callable], dict]:
    from fastvocab.tasks.projections import make_projection

    a32, a8 = adapters(args.model, args.engine)
    info: dict = {
        "engine": a32.engine, "n_vocab": a32.n_vocab,
        "int8_gemm": many_rows_gemm(a32.d_model),  # the many-row steps int8 GEMM, and why
        "int8_gather": {n: gather_multiply(a32.d_model, n == "few rows") for n in ("few rows", "more")},
        "fastvocab_early_stopping": stopping_rule(a32, args.early_stopping),
        "ct2_early_stopping": "patience 1: a sentence ends once beam hypotheses are finished",
    }  # fmt: skip
    full = make_projection(a32, "full")
    info["full_prepacked"] = full.packed
    systems: dict[str, Callable] = {"fastvocab full fp32": fastvocab_system(a32, full, args)}
    if not args.no_int8:
        systems["fastvocab full int8"] = fastvocab_system(a8, make_projection(a32, "full", int8=True), args)
    clustered = None if args.no_clustered else clustered_systems(a32, a8, args, info, systems)
    if args.with_engine:  # the same fastvocab systems on a second engine, in the same rounds
        e = args.with_engine
        b32, b8 = adapters(args.model, e)
        info["with_engine"] = b32.engine
        systems[f"fastvocab-{e} full fp32"] = fastvocab_system(b32, full, args)
        if not args.no_int8:
            full8 = make_projection(b32, "full", int8=True)
            systems[f"fastvocab-{e} full int8"] = fastvocab_system(b8, full8, args)
        if clustered is not None:
            systems[f"fastvocab-{e} clustered fp32"] = fastvocab_system(b32, clustered(), args)
            if not args.no_int8:
                systems[f"fastvocab-{e} clustered int8"] = fastvocab_system(b8, clustered(int8=True), args)
    if not args.no_ct2:
        ct2_systems(a32, args, info, systems)
    if a32.static_decoder is not None:
        # fp32 self-attention K/V for prefix + max_len - 1 positions (what the search allocates), per decoder
        # row (batch x beam rows); the cross-attention K/V come on top, per source sentence.
        positions = len(a32.start_tokens(args.tgt_lang)) + args.max_len - 1
        info["static_cache_positions"] = positions
        info["static_cache_bytes_per_row"] = a32.static_decoder.cache_bytes_per_row(positions)
    return systems, info


def adapters(model: str, engine: str) -> tuple:
    """The model on ``engine`` twice: as loaded, and with its encoder and decoder linears in int8."""
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    a32, a8 = Seq2SeqAdapter.load(model, engine=engine), Seq2SeqAdapter.load(model, engine=engine)
    a8.quantize_int8()
    return a32, a8


def clustered_systems(a32, a8, args, info: dict, systems: dict[str, Callable]) -> Callable[..., dict]:
    """Adds the clustered systems (one a ``--probes`` value, fp32 and int8) to ``systems``; returns a function
    building the first probes' projections again (by beam), for ``--with-engine``'s twins."""
    from fastvocab.artifacts_schema.cluster_map import resolve_map_dir
    from fastvocab.tasks.projections import make_projection

    if not Path(args.maps).exists():
        raise SystemExit(
            f"bench_peer: no cluster maps at {args.maps} (make demo builds runs/demo/maps); "
            "pass --maps DIR or --no-clustered"
        )
    map_dir = resolve_map_dir(args.maps, args.src_lang, args.tgt_lang)
    beams = sorted({int(b) for b in args.beams.split(",")})
    probes_list: list[int | None] = [int(x) for x in args.probes.split(",") if x] if args.probes else [None]
    info.update(map=str(map_dir), map_signature={})
    hybrid: dict[str, object] = {}  # --with-shortlist: the table whose candidates join the sets
    if args.with_shortlist:
        from fastvocab.experiments.bench_methods import shortlist_folder

        hybrid["shortlist"] = shortlist_folder(args.with_shortlist, f"{args.src_lang}-{args.tgt_lang}")
        info["with_shortlist"] = str(hybrid["shortlist"])

    def by_beam(probes: int | None = probes_list[0], **extra: object) -> dict:
        """One clustered projection a beam size, built before any timing, as ``fastvocab translate`` builds
        it (``benchmarks/harnesses.md#bench_peerpy``)."""

        def one(beam: int):
            opts = clustered_options("union", args.inactive_mass, False, beam, probes, bool(hybrid))
            return make_projection(a32, "clustered", cluster_map=map_dir, **opts, **hybrid, **extra)

        return {beam: one(beam) for beam in beams}

    for probes in probes_list:
        projections = by_beam(probes)
        tag = f", probes {probes}" if len(probes_list) > 1 else ""
        systems[f"fastvocab clustered fp32{tag}"] = fastvocab_system(a32, projections, args)
        if not args.no_int8:  # the int8 clustered projection, as `translate --dtype int8` runs it
            systems[f"fastvocab clustered int8{tag}"] = fastvocab_system(a8, by_beam(probes, int8=True), args)
        info["map_signature"].update({f"beam{b}{tag}": p.signature() for b, p in projections.items()})
    return by_beam


def ct2_systems(adapter, args, info: dict, systems: dict[str, Callable]) -> None:
    """Adds CTranslate2 float32 and int8 to ``systems``; converts the model first where ``--ct2-dir`` holds
    none."""
    import ctranslate2

    ct2_dir = Path(args.ct2_dir) if args.ct2_dir else scratch_dir("ct2-") / "model"
    if not (ct2_dir / "model.bin").exists():
        convert_ct2(Path(args.model), ct2_dir)
    info.update(ctranslate2=ctranslate2.__version__, ct2_model=str(ct2_dir))
    for dtype in ("float32", "int8"):
        systems[f"ct2 {dtype}"] = Ct2System(ct2_dir, dtype, adapter, args)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="models/demo")
    p.add_argument("--corpus", default="data/corpus", help="corpus folder (fastvocab corpus --output)")
    p.add_argument("--split", default="test")
    p.add_argument("--lines", help="a text file of source lines instead of a corpus split (no BLEU)")
    p.add_argument("--src-lang", default="en")
    p.add_argument("--tgt-lang", default="it")
    p.add_argument("--n", type=int, default=200, help="source lines (default 200)")
    p.add_argument("--maps", default="runs/demo/maps", help="cluster map folder (or a folder of them)")
    p.add_argument("--no-clustered", action="store_true", help="skip the clustered systems")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--beams", default="1,4", help="comma-separated beam sizes (1 = greedy)")
    p.add_argument("--max-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument(
        "--timed", metavar="NAME[,NAME]",
        help="time only these systems (as the table names them) in the rounds, back to back; the others run "
        "once, untimed, for the quality columns. Two systems alternating give a tighter ratio on a noisy "
        "machine than six in a row",
    )  # fmt: skip
    kinds = ["auto", "processes", "threads"]  # what fastvocab's workers are: translate's ``parallel``
    p.add_argument("--worker-kind", choices=kinds, default="auto", help="translate's parallel")
    p.add_argument(
        "--fresh-workers", action="store_true",
        help="start and end fastvocab's workers in every call (translate without a kept DecodePool)",
    )  # fmt: skip
    p.add_argument(
        "--parallel", choices=["workers", "intra"], default="workers",
        help="how every system uses --threads: 'workers' = that many batches at once on 1 thread each "
        "(fastvocab translate's CPU default; CTranslate2 inter_threads), 'intra' = one batch at a time on "
        "all threads (CTranslate2 intra_threads)",
    )  # fmt: skip
    p.add_argument(
        "--early-stopping", type=parse_early_stopping, default=None, metavar="{model,true,false,never}",
        help="fastvocab's beam stopping rule (translate --early-stopping; default: the model's). CTranslate2 "
        "stops a sentence once beam hypotheses are finished (patience 1), generate's early_stopping=True: "
        "'true' compares the two at the same rule",
    )  # fmt: skip
    p.add_argument(
        "--inactive-mass", default="auto", choices=["auto", *INACTIVE_MASS],
        help="the clustered systems' estimate of the mass not computed, as fastvocab translate takes it "
        f"(default auto: none for greedy, {BEAM_INACTIVE_MASS} for beam search, "
        f"{SHORTLIST_BEAM_INACTIVE_MASS} with --with-shortlist)",
    )  # fmt: skip
    p.add_argument(
        "--probes", metavar="N[,N]",
        help="the clustered systems' probes (translate --probes: each row adds the sets of its N nearest "
        "clusters to the union); several: one clustered system each (default: the map's own)",
    )  # fmt: skip
    p.add_argument("--engine", default="auto", choices=["auto", "static", "hf", "onnx"])
    p.add_argument(
        "--with-engine", choices=["static", "onnx"],
        help="also time the fastvocab systems on this engine (rows 'fastvocab-ENGINE ...'), same rounds",
    )  # fmt: skip
    p.add_argument("--no-int8", action="store_true", help="skip the fastvocab int8 systems")
    p.add_argument("--no-ct2", action="store_true", help="skip CTranslate2")
    p.add_argument("--ct2-dir", help="converted CTranslate2 model (converted into a temp folder if absent)")
    p.add_argument(
        "--with-shortlist", metavar="DIR",
        help="the clustered systems add the candidates of this shortlist table (a table folder, or a root "
        "holding shortlist/<src>-<tgt>) to their sets, as translate --with-shortlist does",
    )  # fmt: skip
    p.add_argument("--out", help="result JSON (default benchmarks/results/peer-cpu-<date>.json)")
    return p.parse_args(argv)


@dataclass
class Rounds:
    """One beam's rounds: each system's seconds (timed systems only), the seconds its projection steps took
    (summed over the workers), and its outputs (the same in every round), with the load around them."""

    times: dict[str, list[float]]
    in_projection: dict[str, list[float]]
    outputs: dict[str, list[str]]
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float] = (0.0, 0.0, 0.0)


def run_rounds(systems: dict[str, Callable], timed: list[str], lines: list[str], beam: int, args) -> Rounds:
    """A warm-up on one batch a worker, an untimed run of each system not timed, then ``--repeats`` rounds
    of the timed systems in :func:`round_order`."""
    rounds = Rounds({name: [] for name in systems}, {name: [] for name in systems}, {}, os.getloadavg())
    # warm-up on one batch a worker (allocations, lazy inits, first-call caches, the kept workers' start)
    for run in systems.values():
        run(lines[: args.batch_size * args.threads], beam)
    for name in systems:
        if name not in timed:  # outputs only, for the quality columns
            rounds.outputs[name] = systems[name](lines, beam)[1]
    for i in range(args.repeats):
        for name, run in round_order([(name, systems[name]) for name in timed], i):
            seconds, out = run(lines, beam)
            rounds.times[name].append(seconds)
            if hasattr(run, "projection_seconds"):
                rounds.in_projection[name].append(run.projection_seconds[0])
            print(f"beam {beam} round {i + 1}: {name} {seconds:.2f} s", file=sys.stderr, flush=True)
            if rounds.outputs.setdefault(name, out) != out:
                raise RuntimeError(f"{name}: outputs changed between rounds")
    rounds.load_after = os.getloadavg()
    return rounds


def system_row(name: str, run: Callable, r: Rounds, rows: dict[str, dict], info: dict, args) -> dict:
    """The record's row of one system: its times, what it changed against full fp32 (and int8 against its
    fp32 twin, a ``--with-engine`` system against the main engine's),
    and its speed against its twins; ``rows``: the rows of the systems before it."""
    times, outputs = r.times, r.outputs
    changed = lambda a, b: round(search_error_rate(outputs[a], outputs[b]), 4)  # noqa: E731
    row: dict = {
        "seconds_median": round(statistics.median(times[name]), 4) if times[name] else None,
        "seconds": [round(t, 4) for t in times[name]],
        "lines_changed_vs_fastvocab_full_fp32": changed(name, "fastvocab full fp32"),
    }
    if r.in_projection[name]:
        # thread-seconds in projection steps over the thread-seconds of the run (workers x wall)
        workers = args.threads if args.parallel == "workers" else 1
        shares = [p / (t * workers) for p, t in zip(r.in_projection[name], times[name], strict=True)]
        row["projection_share"] = round(statistics.median(shares), 4)
    pstats = getattr(run, "projection_stats", [{}])[0]
    if pstats.get("active_columns_per_row") is not None:
        # the Amdahl bound: full's step with its projection's share s cut to the columns computed
        u = pstats["active_columns_per_row"] / info["n_vocab"]
        twin = name.split(" ")[0] + (" full int8" if "int8" in name else " full fp32")
        s_full = rows[twin].get("projection_share") if twin in rows else None
        row["active_fraction"] = round(u, 4)
        row["full_fraction"] = pstats.get("full_fraction")
        row["map_probe"] = pstats.get("map_probe")
        row["speed_vs_full"] = paired_ratio(times[twin], times[name])
        if s_full is not None and row["speed_vs_full"] is not None:
            row["bound_vs_full"] = round(1 / ((1 - s_full) + s_full * u), 3)
            row["of_bound"] = round(row["speed_vs_full"] / row["bound_vs_full"], 3)
    if "int8" in name:
        twin = name.replace("int8", "fp32" if name.startswith("fastvocab") else "float32")
        row["lines_changed_by_int8"] = changed(name, twin)
    if args.with_engine and name.startswith(f"fastvocab-{args.with_engine} "):
        main_twin = name.replace(f"fastvocab-{args.with_engine} ", "fastvocab ")
        row["lines_changed_vs_main_engine"] = changed(name, main_twin)
        row["main_engine_speed_vs_this"] = paired_ratio(times[name], times[main_twin])
    for peer in ("ct2 float32", "ct2 int8"):
        ratio = paired_ratio(times[peer], times[name]) if peer in times else None
        if ratio is not None:
            row[f"speed_vs_{peer.replace(' ', '_')}"] = ratio
    return row


def print_table(beam: int, rows: dict[str, dict], load: float, args) -> None:
    print(
        f"\nbeam {beam}, batch {args.batch_size}, {args.threads} threads ({args.parallel}), load {load:.1f}"
    )
    head = ["system", "median s", "vs ct2 float32", "vs ct2 int8", "changed vs full", "int8 changed", "BLEU",
            "columns", "vs full", "bound"]  # fmt: skip
    for cells in [head, ["---"] + ["---:"] * 9]:
        print("| " + " | ".join(cells) + " |")
    for name, r in rows.items():
        int8_changed = "-" if (x := r.get("lines_changed_by_int8")) is None else f"{100 * x:.1f}%"
        median = "-" if r["seconds_median"] is None else f"{r['seconds_median']:.2f}"
        cells = [name, median, r.get("speed_vs_ct2_float32", "-"), r.get("speed_vs_ct2_int8", "-")]
        cells += [f"{100 * r['lines_changed_vs_fastvocab_full_fp32']:.1f}%", int8_changed, r.get("bleu", "-")]
        cells += [r.get("active_fraction", "-"), r.get("speed_vs_full") or "-", r.get("bound_vs_full", "-")]
        print("| " + " | ".join(map(str, cells)) + " |")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    lines, refs, where = load_lines(args)
    systems, info = build_systems(args)
    timed = list(systems) if not args.timed else [name.strip() for name in args.timed.split(",")]
    if unknown := [name for name in timed if name not in systems]:
        names = ", ".join(map(repr, unknown))
        raise SystemExit(f"bench_peer: --timed: no system {names}; the systems: {', '.join(systems)}")
    result: dict = {
        "benchmark": "bench_peer", **provenance("bench_peer.py", argv, "decoding", "kernels", "tasks"),
        "args": vars(args),  # every setting, defaults included
        **emulation(), "threads": args.threads, "torch": torch.__version__, "model": args.model,
        "direction": f"{args.src_lang}-{args.tgt_lang}", "lines": where, "n_lines": len(lines),
        "batch_size": args.batch_size, "max_len": args.max_len, "repeats": args.repeats,
        "dtypes": {name: ("int8" if "int8" in name else "float32") for name in systems}, **info, "runs": {},
    }  # fmt: skip
    for beam in [int(b) for b in args.beams.split(",")]:
        r = run_rounds(systems, timed, lines, beam, args)
        rows: dict[str, dict] = {}
        for name, run in systems.items():
            rows[name] = system_row(name, run, r, rows, info, args)
            if refs is not None:
                rows[name].update(bleu_chrf(score(r.outputs[name], refs)))
        cache_bytes = info.get("static_cache_bytes_per_row", 0) * args.batch_size * beam
        result["runs"][f"beam{beam}"] = {
            "beam": beam, "static_cache_bytes_batch_x_beam": cache_bytes,
            "loadavg_before": [round(x, 2) for x in r.load_before],
            "loadavg_after": [round(x, 2) for x in r.load_after], "systems": rows,
        }  # fmt: skip
        print_table(beam, rows, r.load_before[0], args)
    write_result(Path(args.out) if args.out else RESULTS / f"peer-cpu-{dt.date.today()}.json", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
