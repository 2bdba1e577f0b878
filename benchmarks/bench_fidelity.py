"""Fidelity yardstick (issue 10): how far clustered decoding is from full softmax, per search setting.

    .venv/bin/python benchmarks/bench_fidelity.py               # quick: 50 sentences, beam 1 and 4, batch 32
    .venv/bin/python benchmarks/bench_fidelity.py --grid full   # beam 1, 2, 4, 5 x batch 1, 32
    .venv/bin/python benchmarks/bench_fidelity.py --beams 1,4 --batches 1,32 --sentences 300

For every direction (``--directions``, test split of ``--corpus`` via ``read_direction``), beam size and batch
size, it decodes the same sentences with the full projection and with each method of ``--methods``, in the
same process (token ids, not text), and records against full softmax with the same search and settings:

- ``identical``: share of sentences whose output token sequence equals full softmax's;
- ``search_errors``: Hoang et al.'s search error rate, the share of sentences whose output scores *lower*
  under the full model than full softmax's output (both scored by forced decoding with the full projection,
  ``decoding/scoring.py``, the search's length penalty); ``better``: differing outputs that score higher
  (full softmax's own beam search erred there);
- BLEU and chrF of full and of the method against the references (``tasks.evaluate.score``);
- active columns per decoder row (computed columns / rows, over every projection call; a row the exact
  method sends to the full projection counts its set plus N) and, for ``exact``, the certified fraction;
- sentences/s and target tokens/s of full and the method (decoding only: tokenization and model load
  excluded), every method run on each batch in turn (so load changes on a shared machine hit all alike),
  the median over ``--repeats`` passes, and their ratio; also the ratio of process CPU time, steadier than
  wall time when other jobs share the cores.

Methods: ``clustered`` (the paper's union selection, no inactive-mass estimate), ``moments`` (the same with
``inactive_mass=moments``; beam > 1 only), ``centroid`` (likewise), ``exact`` (the certificate of
``kernels/clustered.py`` with ``exact_k`` = 1 for greedy and 2 x beam for beam search), ``per-row`` (per-row
selection). Writes ``benchmarks/results/fidelity-<device>-<date>[-<tag>].json`` with the command and meta.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from bench_meta import device_name, git_commit

from fastvocab.artifacts_schema.cluster_map import load_cluster_map, resolve_map_dir
from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.scoring import sequence_scores
from fastvocab.decoding.search import beam_search, greedy_search
from fastvocab.kernels.base import Projection
from fastvocab.tasks.evaluate import score
from fastvocab.tasks.translate import make_projection

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
METHODS = ("clustered", "moments", "centroid", "exact", "per-row")
GRIDS = {"quick": ([1, 4], [32]), "full": ([1, 2, 4, 5], [1, 32])}
# Scores are float32 sums: a differing output counts as a search error only when it is worse by more than
# rounding (and as "better" only when better by more than rounding).
SCORE_TOL = 1e-5


def method_options(method: str, beam: int, selection: str, maps: object) -> dict:
    opts: dict = {"cluster_map": maps, "selection": selection}
    if method == "per-row":
        opts["selection"] = "per-row"
    elif method in ("moments", "centroid"):
        opts["inactive_mass"] = method
    elif method == "exact":
        opts["exact_k"] = 1 if beam == 1 else 2 * beam
    return opts


def decode_all(
    adapter: Seq2SeqAdapter,
    projs: dict[str, Projection],
    seqs: list[list[int]],
    src: str,
    tgt: str,
    beam: int,
    batch_size: int,
    max_len: int,
    length_penalty: float,
) -> tuple[dict[str, list[list[int]]], dict[str, float], dict[str, float]]:
    """Every projection on every batch, interleaved batch by batch (so a change of machine load hits all
    methods alike). Returns per method: outputs (token ids, prefix and EOS excluded) in input order, wall
    seconds and process CPU seconds of decoding (padding included, tokenization excluded)."""
    order = sorted(range(len(seqs)), key=lambda j: -len(seqs[j]))  # as tasks.translate: longest first
    outs = {name: [[] for _ in seqs] for name in projs}
    wall = dict.fromkeys(projs, 0.0)
    cpu = dict.fromkeys(projs, 0.0)
    with torch.inference_mode():
        for lo in range(0, len(order), batch_size):
            chunk = order[lo : lo + batch_size]
            for name, proj in projs.items():
                t0, c0 = time.perf_counter(), time.process_time()
                batch = adapter.pad([seqs[j] for j in chunk])
                if beam == 1:
                    res = greedy_search(adapter, proj, batch, src, tgt, max_len=max_len)
                else:
                    res = beam_search(
                        adapter,
                        proj,
                        batch,
                        src,
                        tgt,
                        beam=beam,
                        max_len=max_len,
                        length_penalty=length_penalty,
                    )
                wall[name] += time.perf_counter() - t0
                cpu[name] += time.process_time() - c0
                for j, r in zip(chunk, res, strict=True):
                    outs[name][j] = r
    return outs, wall, cpu


class Scorer:
    """Full-model scores of outputs, cached per (sentence, output): each distinct output is scored once."""

    def __init__(self, adapter, full, seqs, tgt, max_len, length_penalty, batch_size=32):
        self.adapter, self.full, self.seqs, self.tgt = adapter, full, seqs, tgt
        self.max_len, self.lp, self.batch_size = max_len, length_penalty, batch_size
        self.cache: dict[tuple[int, tuple[int, ...]], float] = {}

    def scores(self, outputs: list[list[int]]) -> list[float]:
        todo = sorted({(i, tuple(o)) for i, o in enumerate(outputs)} - self.cache.keys())
        for lo in range(0, len(todo), self.batch_size):
            part = todo[lo : lo + self.batch_size]
            batch = self.adapter.pad([self.seqs[i] for i, _ in part])
            outs = [list(o) for _, o in part]
            ended = [len(o) < self.max_len for o in outs]  # an output cut at max_len has no EOS
            vals = sequence_scores(
                self.adapter, self.full, batch, self.tgt, outs, length_penalty=self.lp, ended=ended
            )
            self.cache.update(zip(part, vals, strict=True))
        return [self.cache[(i, tuple(o))] for i, o in enumerate(outputs)]


def run_setting(ctx: dict, beam: int, batch_size: int, methods: list[str], args) -> list[dict]:
    adapter, seqs, refs, src, tgt = ctx["adapter"], ctx["seqs"], ctx["refs"], ctx["src"], ctx["tgt"]
    full = ctx["full"]
    projs: dict[str, Projection] = {}
    for m in methods:
        if m in ("moments", "centroid") and beam == 1:
            continue  # greedy reads logits only: an inactive-mass estimate changes nothing
        projs[m] = make_projection(
            adapter, "clustered", **method_options(m, beam, args.selection, ctx["map"])
        )

    everything = {"full": full, **projs}
    args_ = (src, tgt, beam, batch_size, args.max_len, args.length_penalty)
    # Warm-up on a few sentences (first-call allocations, the static engine's cache growth).
    decode_all(adapter, everything, seqs[: min(len(seqs), batch_size, 8)], *args_)
    times: dict[str, list[float]] = {name: [] for name in everything}
    cpu_times: dict[str, list[float]] = {name: [] for name in everything}
    outputs: dict[str, list[list[int]]] = {}
    for rep in range(args.repeats):
        for p in projs.values():
            p.reset_counters()
        outs, wall, cpu = decode_all(adapter, everything, seqs, *args_)
        for name in everything:
            times[name].append(wall[name])
            cpu_times[name].append(cpu[name])
            if rep == 0:
                outputs[name] = outs[name]
            elif outs[name] != outputs[name]:
                print(f"warning: {name} gave other outputs on repeat {rep + 1}", file=sys.stderr)
    scorer = ctx["scorer"][(beam, batch_size)] = ctx["scorer"].get(
        (beam, batch_size), Scorer(adapter, full, seqs, tgt, args.max_len, args.length_penalty)
    )
    full_out = outputs["full"]
    full_scores = scorer.scores(full_out)
    full_text = adapter.decode_ids(full_out)
    full_q = score(full_text, refs, tgt)
    full_sec = statistics.median(times["full"])
    full_cpu = statistics.median(cpu_times["full"])
    full_tokens = sum(len(o) for o in full_out)
    rows = []
    for name, p in projs.items():
        out = outputs[name]
        sc = scorer.scores(out)
        differ = [a != b for a, b in zip(out, full_out, strict=True)]
        worse = [d and s < f - SCORE_TOL for d, s, f in zip(differ, sc, full_scores, strict=True)]
        better = [d and s > f + SCORE_TOL for d, s, f in zip(differ, sc, full_scores, strict=True)]
        q = score(adapter.decode_ids(out), refs, tgt)
        sec = statistics.median(times[name])
        n = len(out)
        counters = p.counters
        row = {
            "direction": f"{src}-{tgt}",
            "beam": beam,
            "batch": batch_size,
            "method": name,
            "options": p.options(),
            "sentences": n,
            "identical": round(1 - sum(differ) / n, 4),
            "search_errors": round(sum(worse) / n, 4),
            "better": round(sum(better) / n, 4),
            "bleu_full": round(full_q["bleu"], 2),
            "bleu": round(q["bleu"], 2),
            "chrf_full": round(full_q["chrf"], 2),
            "chrf": round(q["chrf"], 2),
            "active_columns_per_row": round(counters["columns"] / max(1, counters["rows"]), 1),
            "certified": None
            if getattr(p, "certified_fraction", None) is None
            else round(p.certified_fraction, 4),
            "sent_per_s_full": round(n / full_sec, 2),
            "sent_per_s": round(n / sec, 2),
            "tok_per_s_full": round(full_tokens / full_sec, 1),
            "tok_per_s": round(sum(len(o) for o in out) / sec, 1),
            "speed_ratio": round(full_sec / sec, 3),
            "cpu_ratio": round(full_cpu / statistics.median(cpu_times[name]), 3),
            "seconds_full": [round(t, 3) for t in times["full"]],
            "seconds": [round(t, 3) for t in times[name]],
            "cpu_seconds_full": [round(t, 3) for t in cpu_times["full"]],
            "cpu_seconds": [round(t, 3) for t in cpu_times[name]],
        }
        rows.append(row)
        print(
            f"{row['direction']} beam {beam} batch {batch_size:>2} {name:<9} "
            f"identical {row['identical']:.3f} "
            f"search-err {row['search_errors']:.3f} better {row['better']:.3f} "
            f"BLEU {row['bleu_full']:.2f}->{row['bleu']:.2f} chrF {row['chrf_full']:.2f}->{row['chrf']:.2f} "
            f"cols/row {row['active_columns_per_row']:.0f} cert {row['certified']} "
            f"sent/s {row['sent_per_s_full']:.2f}->{row['sent_per_s']:.2f} (x{row['speed_ratio']:.2f}, "
            f"CPU x{row['cpu_ratio']:.2f})",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(ROOT / "models/demo"))
    ap.add_argument("--maps", default=str(ROOT / "runs/demo/maps"), help="maps root or a map folder")
    ap.add_argument("--corpus", default=str(ROOT / "data/corpus"))
    ap.add_argument("--split", default="test")
    ap.add_argument("--directions", default="en-it,it-en")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="quick", help="beams x batches preset")
    ap.add_argument("--beams", help="comma-separated beam sizes (overrides --grid)")
    ap.add_argument("--batches", help="comma-separated batch sizes (overrides --grid)")
    ap.add_argument("--methods", default="clustered,moments,exact", help=f"comma-separated, of {METHODS}")
    ap.add_argument("--selection", default="union", choices=("union", "per-row"))
    ap.add_argument("--sentences", type=int, default=50, help="first N sentences of the split (0 = all)")
    ap.add_argument("--max-len", type=int, default=128)
    ap.add_argument("--length-penalty", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=1, help="timed runs per method (median reported)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tag", default="", help="suffix of the results file name")
    ap.add_argument("--out", help="results file (default benchmarks/results/fidelity-<device>-<date>.json)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    beams = [int(b) for b in args.beams.split(",")] if args.beams else GRIDS[args.grid][0]
    batches = [int(b) for b in args.batches.split(",")] if args.batches else GRIDS[args.grid][1]
    methods = [m for m in args.methods.split(",") if m]
    bad = [m for m in methods if m not in METHODS]
    if bad:
        ap.error(f"unknown methods {bad}; valid: {', '.join(METHODS)}")
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    adapter = Seq2SeqAdapter.load(args.model, device=args.device)
    full = make_projection(adapter, "full")
    results = []
    for direction in args.directions.split(","):
        src, tgt = direction.split("-")
        _, sources, refs = read_direction(args.corpus, src, tgt, args.split, limit=args.sentences or None)
        keep = [i for i, s in enumerate(sources) if s.strip()]
        sources, refs = [sources[i] for i in keep], [refs[i] for i in keep]
        map_dir = resolve_map_dir(args.maps, src, tgt)
        cmap = load_cluster_map(map_dir, expect_fingerprint=adapter.fingerprint)
        ctx = {
            "adapter": adapter,
            "full": full,
            "seqs": adapter.tokenize(sources, src, tgt),
            "refs": refs,
            "src": src,
            "tgt": tgt,
            "map": cmap,
            "scorer": {},
        }
        for beam in beams:
            for batch_size in batches:
                results += run_setting(ctx, beam, batch_size, methods, args)
    load_after = os.getloadavg()
    device = "cpu" if args.device == "cpu" else "gpu"
    date = dt.date.today().isoformat()
    out = (
        Path(args.out)
        if args.out
        else RESULTS / f"fidelity-{device}-{date}{'-' + args.tag if args.tag else ''}.json"
    )
    record = {
        "benchmark": "fidelity",
        "command": " ".join([".venv/bin/python", "benchmarks/bench_fidelity.py", *(argv or sys.argv[1:])]),
        "meta": {
            "commit": git_commit("kernels", "decoding"),
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "device": device_name(args.device),
            "torch": torch.__version__,
            "threads": args.threads,
            "cpu_count": os.cpu_count(),
            "loadavg_before": [round(x, 2) for x in load_before],
            "loadavg_after": [round(x, 2) for x in load_after],
            "model": args.model,
            "model_fingerprint": adapter.fingerprint,
            "n_vocab": adapter.n_vocab,
            "d": adapter.d_model,
            "dtype": str(adapter.dtype),
            "maps": args.maps,
            "split": args.split,
            "sentences": args.sentences,
            "max_len": args.max_len,
            "length_penalty": args.length_penalty,
            "repeats": args.repeats,
            "selection": args.selection,
            "seconds_total": round(time.perf_counter() - t_start, 1),
            "score_tolerance": SCORE_TOL,
        },
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
