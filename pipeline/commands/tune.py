"""``fastvocab tune``: the clustered map's settings that decode fastest within a search-error budget.

The search itself is ``experiments.tune`` (plain functions); this module parses the options, finds the stored
states of a work dir, saves the chosen map, writes the record (JSON, CSV, Markdown), prints the choice with
the config keys that reproduce it, and logs the search to MLflow (one parent run, one child run per tried
configuration).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from fastvocab.pipeline.commands import (
    add_batch_size,
    add_beam,
    add_corpus,
    add_deprecated,
    add_examples,
    add_grid_alias,
    add_inactive_mass,
    add_length_penalty,
    add_max_len,
    add_mlflow_options,
    add_model,
    add_output,
    command_line,
    int_list,
    load_model,
    mlflow_store,
    split_direction,
)
from fastvocab.pipeline.errors import UserError

log = logging.getLogger(__name__)

DESCRIPTION = """\
Choose, for one direction, the clustered map (r centroids, top-K per state, pruning min_count) and the
selection mode (union / per-row) that decode fastest while the search error rate on the corpus' dev split
stays within --budget (default 1%: at most 1 sentence in 100 whose output scores lower under the full model
than full softmax's own output, Hoang et al.), at your --beam and --batch-size. "Within" means with a margin:
the rate's one-sided upper bound at --confidence (default 90%, Clopper-Pearson) meets the budget, since the
fastest of many candidates is the one whose dev rate most likely runs low.

Candidate maps are built from the stored states of a pipeline work dir (<work-dir>/states, written by
`fastvocab run`'s dump stage), along every beam dumped there (maps.beams; --state-beams picks some): Faiss
k-means per r, one assignment pass per r for every K. To tune for beam search, dump along that beam too.
Full softmax and the candidates decode the same dev sentences in one process, batch by batch in turn (the
fidelity yardstick of `fastvocab bench fidelity`), so their speed ratios share the machine's load.

Search: successive halving. Rung 1 decodes the first n1 dev sentences with every candidate (quick grid:
36 candidates, 30 sentences). A candidate whose erroneous sentences already exceed what the last rung
allows (the most whose bound meets the budget: at 5% and 90%, 1 in 100) is dropped; of the rest the fastest
1/--eta go on to the next rung (more sentences), plus the fastest error-free one and the fastest of each K
and min_count (30 sentences cannot tell a 2% rate from 5%). The last rung (quick grid: 100 sentences, more
where an error-free run needs more to meet the bound: 230 at 1%) decides: the fastest candidate within the
budget.
The choice is then decoded on the test split (--test-sentences, default the last rung's count) and its
search error rate there reported: whether the budget held on sentences the choice never saw.

--by coverage (greedy only) decodes nothing but the dev and test splits once with full softmax: a greedy
clustered output differs from full softmax's exactly when its full-softmax path has a step whose best token
is outside the row's probed sets, so every (r, K, probes) point of --r, --k and --probes is measured from
the stored states alone (k-means once per r), on nested prefixes of the dumped sentences too: the
data-scale curve. It picks the point within --budget whose union batch (--batch-size rows) computes the
fewest columns, checks it on the test split the same way, and says for every point how many dumped
sentences its curve needs for the budget. Writes <output>/<direction>-coverage/coverage.json and .md; no
map is saved (the printed config keys build it).

Grids (--grid; --r, --k, --min-count, --selection, --rungs override single axes):
  quick  r 100,200,500   K 1,3,5  min_count 1,2    union,per-row  rungs 30,100
  full   r 100..2000 (5) K 1,3,5  min_count 1,2,3  union,per-row  rungs 60,200,600
At --beam B > 1 both grids try K = B, 3B/2 and 2B (beam search keeps 2B candidates a row).
Decode as the pipeline's translate stage does: --probes P,P adds the nearest clusters a row reads as an axis
(default: 1), and --with-shortlist DIR joins the lexical shortlist's candidates to every candidate's sets (as
`fastvocab translate --with-shortlist`; union selection only). configs/demo.yaml decodes with probes 4 and
the shortlist shipped in models/demo-maps: without them a map built from its 1,500 sentences a direction
misses a token in most dev sentences.

Writes <output>/<direction>-beam<B>/: map/ (the chosen map: use it with `fastvocab translate --method
clustered --clusters DIR`), tune.json (every measured row, the choice, the test check), tune.csv and tune.md;
prints the map's path and the config keys (configs/demo.yaml) that make the pipeline build and use the same
settings. Logs to MLflow (--tracking-uri, else $MLFLOW_TRACKING_URI, else the default store
<work-dir>/mlflow.db, where `fastvocab run` logs; --no-mlflow: nothing): a parent run with the settings, the
choice and the tables, a child run per tried configuration. The last rung and the test check time each
candidate against full softmax in paired passes until their ratios agree (3 to 6 passes; the median is the
speed, and a spread that stays wide is printed as UNSTABLE: a busy machine). Exits 2 with the lowest error
rate measured when no configuration meets the budget on dev, and 3 when the chosen one misses it on the test
split (the map and tune.json are still written; the MLflow run ends FAILED, tagged
fastvocab.tune=budget-not-met-on-test).
"""

# exit status of a tune whose choice met the budget on dev and missed it on test
MISSED_ON_TEST = 3

EXAMPLES = """\
examples:
  fastvocab tune --src-lang en --tgt-lang it --with-shortlist models/demo-maps --probes 4 --budget 5% \\
      --rungs 30,200
"""


COVERAGE_RS = (500, 1000, 2000)
COVERAGE_KS = (1, 3, 8)
COVERAGE_PROBES = (1, 2, 4, 8)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.experiments.tune import TuneSettings
    from fastvocab.tasks.kmeans import KMeansParams

    p.description = DESCRIPTION
    add_examples(p, EXAMPLES)
    d, km = TuneSettings(), KMeansParams()
    p.add_argument("--src-lang", default="en", metavar="XX", help="source language (default: %(default)s)")
    p.add_argument("--tgt-lang", default="it", metavar="YY", help="target language (default: %(default)s)")
    add_deprecated(
        p, "--direction", "--src-lang and --tgt-lang", "direction", split_direction, metavar="SRC-TGT"
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path("runs/demo"),
        metavar="DIR",
        help="pipeline work dir (default: %(default)s)",
    )
    p.add_argument(
        "--states", type=Path, metavar="DIR", help="hidden-state shards root (default: <work-dir>/states)"
    )
    p.add_argument(
        "--state-beams",
        metavar="B,B",
        help="the beams whose stored states build the candidate maps, as the pipeline's maps.beams "
        "(default: every beam dumped under --states)",
    )
    add_model(p)
    add_corpus(p, "corpus with dev and test splits (default: %(default)s)")
    p.add_argument(
        "--budget",
        default="1%",
        help="largest dev search error rate: a share (0.01) or a percentage (1%%) (default: %(default)s)",
    )
    p.add_argument(
        "--confidence",
        type=float,
        default=d.confidence,
        metavar="C",
        help="the level of the dev rate's upper bound that must meet --budget; 0 compares the rate itself "
        "(default: %(default)s)",
    )
    add_beam(p, d.beam)
    add_batch_size(p, d.batch_size)
    _add_grid_arguments(p)
    add_max_len(p, d.max_len)
    add_length_penalty(p, d.length_penalty)
    add_inactive_mass(p, d.inactive_mass, "as fastvocab translate (default: %(default)s)")
    p.add_argument(
        "--normaliser-rank",
        type=int,
        default=d.normaliser_rank,
        metavar="N",
        help="curvature basis of the maps' stored normaliser, as the pipeline's maps.normaliser_rank "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=d.repeats,
        metavar="N",
        help="timed passes per rung, median (default: %(default)s)",
    )
    p.add_argument(
        "--niter", type=int, default=km.niter, metavar="N", help="k-means iterations (default: %(default)s)"
    )
    p.add_argument(
        "--seed", type=int, default=km.seed, metavar="N", help="k-means seed (default: %(default)s)"
    )
    p.add_argument(
        "--threads", type=int, metavar="N", help="CPU threads for torch and Faiss (default: torch's)"
    )
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")
    p.add_argument(
        "--by",
        choices=("decode", "coverage"),
        default="decode",
        help="decode: successive halving, every candidate decoded; coverage: greedy fidelity of every "
        "(r, K, probes) predicted from full softmax's path, above (default: %(default)s)",
    )
    p.add_argument(
        "--probes",
        metavar="P,P",
        help="nearest clusters a row reads, comma-separated: an axis of the grid "
        f"(default: 1; --by coverage: {','.join(map(str, COVERAGE_PROBES))})",
    )
    p.add_argument(
        "--with-shortlist",
        type=Path,
        metavar="DIR",
        help="join the lexical shortlist's candidates to every candidate's sets, as translate "
        "--with-shortlist does: a shortlist table, or a folder holding shortlist/<src>-<tgt> "
        "(models/demo-maps does); --by decode, union selection",
    )
    add_output(p, "output root (default: <work-dir>/tune)", metavar="DIR")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the JSON record here")
    add_mlflow_options(p, "the default store <work-dir>/mlflow.db", "fastvocab-tune")


def _add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """The candidates' grid and how successive halving runs it."""
    from fastvocab.experiments.tune import GRIDS, RANK_BY, TuneSettings

    d = TuneSettings()
    p.add_argument(
        "--grid", choices=sorted(GRIDS), default=d.grid, help="candidate grid, above (default: %(default)s)"
    )
    add_grid_alias(p)
    p.add_argument(
        "--r", dest="rs", metavar="R,R", help="centroid counts, comma-separated (default: the grid's)"
    )
    p.add_argument(
        "--k", dest="ks", metavar="K,K", help="top-K ids per state in the sets (default: the grid's)"
    )
    p.add_argument(
        "--min-count",
        dest="min_counts",
        metavar="M,M",
        help="pruning: min (cluster, id) count (default: the grid's)",
    )
    p.add_argument(
        "--selection", dest="selections", metavar="S,S", help="union and/or per-row (default: the grid's)"
    )
    p.add_argument(
        "--rungs",
        metavar="N,N",
        help="dev sentences per rung, growing, the last decides (default: the grid's)",
    )
    p.add_argument(
        "--eta",
        type=int,
        default=d.eta,
        metavar="N",
        help="keep the fastest 1/eta per rung (default: %(default)s)",
    )
    p.add_argument(
        "--rank-by",
        choices=sorted(RANK_BY),
        default=d.rank_by,
        help="speed ratio to maximise: wall time, or process CPU time (steadier on a shared machine) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--test-sentences",
        type=int,
        metavar="N",
        help="test sentences for the check (default: the last rung's count)",
    )


def parse_budget(text: str) -> float:
    """``1%`` or ``0.01`` -> 0.01."""
    try:
        return float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError as exc:
        raise UserError(f"--budget takes a share (0.01) or a percentage (1%), got {text!r}") from exc


def settings_from(args: argparse.Namespace):
    from fastvocab.experiments.tune import TuneSettings
    from fastvocab.tasks.kmeans import KMeansParams

    shortlist = None
    if args.with_shortlist is not None:
        from fastvocab.pipeline.method_choice import resolve_index

        shortlist = str(resolve_index(args.with_shortlist, "shortlist", args.direction, "--with-shortlist"))
    try:
        return TuneSettings(
            budget=parse_budget(args.budget),
            confidence=args.confidence,
            beam=args.beam,
            batch_size=args.batch_size,
            grid=args.grid,
            rs=int_list(args.rs, "--r"),
            ks=int_list(args.ks, "--k"),
            min_counts=int_list(args.min_counts, "--min-count"),
            selections=tuple(s for s in args.selections.split(",") if s) if args.selections else None,
            rungs=int_list(args.rungs, "--rungs"),
            eta=args.eta,
            rank_by=args.rank_by,
            test_sentences=args.test_sentences,
            max_len=args.max_len,
            length_penalty=args.length_penalty,
            inactive_mass=args.inactive_mass,
            normaliser_rank=args.normaliser_rank,
            repeats=args.repeats,
            probes=int_list(args.probes, "--probes") or (1,),
            shortlist=shortlist,
            kmeans=KMeansParams(niter=args.niter, seed=args.seed, threads=args.threads),
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def run(args: argparse.Namespace) -> int:
    args.direction = f"{args.src_lang}-{args.tgt_lang}"  # one name for it in records and folders
    if args.by == "coverage":
        return run_coverage(args)
    return run_decode(args)


def run_coverage(args: argparse.Namespace) -> int:
    """``--by coverage``: see the description."""
    from fastvocab.artifacts_schema.corpus import read_direction
    from fastvocab.artifacts_schema.errors import ArtifactError
    from fastvocab.artifacts_schema.hidden_states import validate_beams
    from fastvocab.artifacts_schema.jsonfile import write_json
    from fastvocab.artifacts_schema.provenance import git_commit
    from fastvocab.experiments import coverage
    from fastvocab.tasks.context import RunContext, describe_model
    from fastvocab.tasks.dump import DumpDecoder, DumpSettings

    if args.beam != 1:
        raise UserError("--by coverage predicts greedy outputs (--beam 1): tune beam search with --by decode")
    if args.with_shortlist is not None:
        raise UserError("--by coverage predicts the clusters' sets alone: tune with a shortlist by decode")
    budget = parse_budget(args.budget)
    direction = args.direction
    src, sep, tgt = direction.partition("-")
    if not sep or not src or not tgt:
        raise UserError(f"--src-lang and --tgt-lang must both be given, got {direction!r}")
    rs = int_list(args.rs, "--r") or COVERAGE_RS
    ks = int_list(args.ks, "--k") or COVERAGE_KS
    probes = int_list(args.probes, "--probes") or COVERAGE_PROBES
    states = args.states or args.work_dir / "states"
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    try:
        ref = describe_model(args.model)
        by_beam = validate_beams(states, direction, fingerprint=ref.fingerprint)
        _, dev, _ = read_direction(args.corpus, src, tgt, "dev")
        _, test, _ = read_direction(args.corpus, src, tgt, "test")
    except ArtifactError as exc:
        raise UserError(f"{exc} (run `fastvocab run` with a dump stage first, or pass --states)") from exc
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    files = [f for fs in by_beam.values() for f in fs]
    ctx = RunContext(ref, device=args.device, torch_threads=args.threads)
    decoder = DumpDecoder(ctx, DumpSettings(k=1, max_len=args.max_len))
    t0 = time.perf_counter()
    try:
        grid = coverage.CoverageGrid(rs, ks, probes, batch=args.batch_size, seed=args.seed)
        result = coverage.tune_by_coverage(decoder, files, dev, test, direction, grid, budget=budget)
    except ValueError as exc:  # a K the states do not hold, too few states for an r
        raise UserError(str(exc)) from exc
    out_dir = (args.output or args.work_dir / "tune") / f"{direction}-coverage"
    record = {
        "benchmark": "tune-coverage",
        "command": command_line(args, "tune"),
        "meta": {
            "model": str(args.model),
            "model_fingerprint": ref.fingerprint,
            "states": str(states),
            "paths": sorted(by_beam),
            "direction": direction,
            "budget": budget,
            "batch": args.batch_size,
            "commit": git_commit(digits=12, mark_dirty=False),
            "seconds": round(time.perf_counter() - t0, 1),
        },
        **result,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "coverage.json", record)
    (out_dir / "coverage.md").write_text(_coverage_markdown(record), encoding="utf-8")
    if args.json:
        _copy(out_dir / "coverage.json", args.json)
    print(_coverage_markdown(record))
    chosen = result["chosen"]
    if chosen is None:
        best = min(
            (r for r in result["rows"] if r["sentences"] == result["dumped_sentences"]),
            key=lambda r: r["sentence_differ"],
        )
        raise UserError(
            f"no (r, K, probes) point is within the {100 * budget:g}% budget on dev: the best, r={best['r']} "
            f"K={best['K']} probes={best['probes']}, differs on {100 * best['sentence_differ']:.1f}% "
            f"(dump more text: see {out_dir / 'coverage.md'})"
        )
    keys = {"kmeans.r": chosen["r"], "maps.k": chosen["K"], "maps.probes": chosen["probes"]}
    sets = " ".join(f"--set {k}={v}" for k, v in keys.items())
    print(f"config keys: {', '.join(f'{k}: {v}' for k, v in keys.items())}")
    print(f"  e.g. fastvocab run CONFIG {sets}")
    return 0


def _coverage_markdown(record: dict) -> str:
    """The coverage tune's tables: every point at the full dump, the choice, its test check, the curve."""
    full = record["dumped_sentences"]
    budget = 100 * record["meta"]["budget"]
    lines = [
        f"# tune --by coverage: {record['meta']['direction']}, budget {budget:g}%",
        "",
        f"{record['stored_states']:,} stored states of {full:,} dumped sentences; predicted greedy outputs "
        f"differing on the dev split; columns as shares of N (union: batches of {record['meta']['batch']}).",
        "",
        "| r | K | probes | dev differing | per row | union | sentences for the budget |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in sorted(
        (r for r in record["rows"] if r["sentences"] == full), key=lambda r: (r["r"], r["K"], r["probes"])
    ):
        need = record["sentences_needed"].get(f"r={row['r']} K={row['K']} probes={row['probes']}")
        lines.append(
            f"| {row['r']} | {row['K']} | {row['probes']} | {100 * row['sentence_differ']:.1f}% | "
            f"{100 * row['row_cols']:.2f}% | {100 * row['union_batch']:.1f}% | "
            f"{'-' if need is None else f'{need:,}'} |"
        )
    chosen, test = record["chosen"], record["test"]
    lines.append("")
    if chosen is None:
        lines.append(f"No point is within the {budget:g}% budget.")
    else:
        halving = record.get("halving")
        lines.append(
            f"Chosen: r={chosen['r']} K={chosen['K']} probes={chosen['probes']}: dev "
            f"{100 * chosen['sentence_differ']:.1f}%, test {100 * test['sentence_differ']:.1f}% predicted "
            f"differing ({test['sentences']} sentences), {100 * chosen['union_batch']:.1f}% of N"
            + " a union batch"
            + (f"; each doubling of the text multiplies its misses by {halving:.2f}" if halving else "")
            + "."
        )
    return "\n".join(lines) + "\n"


def run_decode(args: argparse.Namespace) -> int:
    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.artifacts_schema.jsonfile import write_json
    from fastvocab.artifacts_schema.provenance import git_commit
    from fastvocab.experiments import tune as tt
    from fastvocab.experiments.fidelity import run_meta

    settings = settings_from(args)
    direction = args.direction
    src, sep, tgt = direction.partition("-")
    if not sep or not src or not tgt:
        raise UserError(f"--src-lang and --tgt-lang must both be given, got {direction!r}")
    states = args.states or args.work_dir / "states"
    out_dir = (args.output or args.work_dir / "tune") / f"{direction}-beam{settings.beam}"
    tracker = None
    store = mlflow_store(args, args.work_dir)
    if store is not None:  # open the store first: a bad URI fails before the work
        from fastvocab.pipeline.tracking import Tracker

        tracker = Tracker.open(store, args.experiment_name)
    adapter, load_before, t0 = load_model(args)
    files, state_beams = _state_files(args, states, adapter.fingerprint, settings.beam)
    command = command_line(args, "tune")
    _show_row(None)
    meta = {
        **run_meta(adapter, args.device, load_before, finished=False),  # written before the run
        "commit": git_commit(digits=12, mark_dirty=False),
        "model": str(args.model),
        "states": str(states),
        "state_beams": state_beams,
        "corpus": str(args.corpus),
        "direction": direction,
        **settings.describe(),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        result = tt.run_tune(
            adapter,
            args.corpus,
            files,
            direction,
            settings,
            on_row=_show_row,
            on_note=lambda msg: log.info("%s", msg),
        )
    except tt.BudgetNotMet as exc:
        rows = getattr(exc, "rows", [])
        meta.update(_closing_meta(t0))
        record = {
            "benchmark": "tune",
            "command": command,
            "meta": meta,
            "chosen": None,
            "error": str(exc),
            "rows": rows,
        }
        write_json(out_dir / "tune.json", record)
        tt.write_csv(rows, out_dir / "tune.csv")
        if args.json:
            _copy(out_dir / "tune.json", args.json)
        if tracker is not None:
            _log(tracker, record, rows, None, [out_dir / "tune.json", out_dir / "tune.csv"])
        raise UserError(str(exc)) from exc
    except ValueError as exc:  # a K or r the states cannot give, an unknown language
        raise UserError(str(exc)) from exc

    cand = result["chosen_candidate"]
    map_dir = out_dir / "map"
    result["chosen_map"].manifest.probes = cand.probes  # the map decodes as it was measured
    save_cluster_map(result["chosen_map"], map_dir)
    meta.update(_closing_meta(t0))
    keys = cand.config_keys(settings.beam, state_beams, settings.normaliser_rank)
    if args.with_shortlist is not None:
        keys["translate.shortlist"] = str(args.with_shortlist)
    record = {
        "benchmark": "tune",
        "command": command,
        "meta": meta,
        "chosen": {**result["chosen"], "config_keys": keys},
        "map_path": str(map_dir.resolve()),
        "test": result["test"],
        "within_budget_on_test": result["within_budget_on_test"],
        "candidates": result["candidates"],
        "rungs": result["rungs"],
        "allowed_error_sentences": result["allowed_error_sentences"],
        "recorded_k": result["recorded_k"],
        "map_info": result["map_info"],
        "rows": result["rows"],
    }
    write_json(out_dir / "tune.json", record)
    tt.write_csv(result["rows"], out_dir / "tune.csv")
    (out_dir / "tune.md").write_text(tt.markdown(result, settings, direction), encoding="utf-8")
    if args.json:
        _copy(out_dir / "tune.json", args.json)
        _copy(out_dir / "tune.md", args.json.with_suffix(".md"))
    if tracker is not None:
        _log(
            tracker,
            record,
            result["rows"],
            result,
            [out_dir / n for n in ("tune.json", "tune.csv", "tune.md")],
        )
    _print_choice(record, settings, args, map_dir)
    return 0 if record["within_budget_on_test"] else MISSED_ON_TEST


def _state_files(
    args: argparse.Namespace, states: Path, fingerprint: str, beam: int
) -> tuple[list, list[int]]:
    """The stored states' shards the candidate maps are built from (the greedy path's first, as the
    pipeline's maps), and the beams they were dumped along."""
    from fastvocab.artifacts_schema.errors import ArtifactError
    from fastvocab.artifacts_schema.hidden_states import validate_beams

    try:
        beams = int_list(args.state_beams, "--state-beams")
        by_beam = validate_beams(states, args.direction, fingerprint=fingerprint, beams=beams)
    except ArtifactError as exc:
        raise UserError(f"{exc} (run `fastvocab run` with a dump stage first, or pass --states)") from exc
    if beam > 1 and beam not in by_beam:
        log.warning(
            "tuning for beam %d from states dumped along beams %s only: dump along beam %d too "
            "(maps.beams in the pipeline config) for maps that serve it",
            beam,
            list(by_beam),
            beam,
        )
    return [f for fs in by_beam.values() for f in fs], list(by_beam)


def _show_row(row: dict[str, Any] | None) -> None:
    """One line on standard error per candidate a rung decoded (None: the header)."""
    if row is None:
        text = (
            f"{'rung':>4} {'configuration':<34} {'sent':>5} {'s.err':>6} {'ident':>6} {'wall x':>6} "
            f"{'cpu x':>6} decided"
        )
    else:
        text = (
            f"{row['rung'] + 1:>4} {row['label']:<34} {row['sentences']:>5} {row['search_errors']:>6.3f} "
            f"{row['identical']:>6.3f} {row['speed_ratio']:>6.2f} {row['cpu_ratio']:>6.2f} {row['decided']}"
        )
    print(text, file=sys.stderr, flush=True)


def _closing_meta(t0: float) -> dict[str, Any]:
    return {
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "seconds_total": round(time.perf_counter() - t0, 1),
        "speed_note": "wall-clock ratios on a shared machine: see loadavg; cpu_ratio is steadier",
    }


def _set_value(value: Any) -> str:
    """A config value as ``--set`` reads it: a list without spaces, so the shell keeps it one word."""
    return json.dumps(value, separators=(",", ":")) if isinstance(value, list) else str(value)


def _copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dst)


def _print_choice(record: dict, settings, args: argparse.Namespace, map_dir: Path) -> None:
    ch, test = record["chosen"], record["test"]
    budget = 100 * settings.budget

    def speed(row: dict) -> str:
        passes = ", ".join(f"{r}x" for r in row.get("speed_ratio_passes", []))
        steady = (
            "" if row.get("speed_stable", True) else "; UNSTABLE: the machine is busy, rerun on a quiet one"
        )
        return (
            f"{row['speed_ratio']}x full softmax, median of passes {passes}{steady}; cpu {row['cpu_ratio']}x"
        )

    print(
        f"chosen: {ch['label']} (dev: {100 * ch['search_errors']:.1f}% search errors on {ch['sentences']} "
        f"sentences, at most {100 * ch['error_bound']:.1f}% at {100 * settings.confidence:g}% confidence; "
        f"{speed(ch)})"
    )
    if record["within_budget_on_test"]:
        print(
            f"test:   {100 * test['search_errors']:.1f}% search errors on {test['sentences']} sentences: "
            f"within the {budget:g}% budget ({speed(test)})"
        )
    else:
        print(
            f"test:   BUDGET NOT MET on the test split: {100 * test['search_errors']:.1f}% search errors on "
            f"{test['sentences']} sentences, above the {budget:g}% budget ({speed(test)}); tune with more "
            f"dev sentences (--rungs) or a higher --confidence (exit {MISSED_ON_TEST})"
        )
    if ch["speed_ratio"] < 1.0:
        print("note:   the fastest configuration within the budget is slower than full softmax here")
    print(f"map:    {map_dir.resolve()}")
    keys = ch["config_keys"]
    print("config keys (configs/demo.yaml), same states and k-means settings:")
    sections: dict[str, list[str]] = {}
    for key, value in keys.items():
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"  {name}: {value}")
    for section, lines in sections.items():
        print(f"{section}:")
        print("\n".join(lines))
    sets = " ".join(f"--set {k}={_set_value(v)}" for k, v in keys.items())
    print(f"  e.g. fastvocab run configs/demo.yaml {sets}")
    print("  (the pipeline's maps also count dump.stream_sentences' states, so its sets can only grow)")
    src, _, tgt = args.direction.partition("-")
    shortlist = "" if args.with_shortlist is None else f"--with-shortlist {args.with_shortlist} "
    print(
        f"or: fastvocab translate --model {args.model} --src-lang {src} --tgt-lang {tgt} --method clustered "
        f"--clusters {map_dir.resolve()} --selection {keys['translate.selection']} --beam {settings.beam} "
        f"{shortlist}-i IN -o OUT"
    )


def _log(tracker, record: dict, rows: list[dict], result: dict | None, artifacts: list[Path]) -> None:
    """One parent run (settings as params; the choice and test check as metrics; the tables as artifacts),
    one child run per tried configuration (its last rung's metrics; per-rung values as metric steps) that
    spans its rungs' decoding, from its first rung's start to its last rung's end."""
    from fastvocab.experiments.bench_methods import numeric_metrics, span
    from fastvocab.pipeline.tracking import StageRecord

    meta = record["meta"]
    direction = meta["direction"]
    if result is None:
        outcome = "no-configuration-within-budget"
    else:
        outcome = "chosen" if record["within_budget_on_test"] else "budget-not-met-on-test"
    tags = {"fastvocab.tune": outcome}
    tracker.start(f"tune:{direction}:beam{meta['beam']}", {"command": record["command"], **meta}, tags)
    by_label: dict[str, list[dict]] = {}
    for row in rows:
        by_label.setdefault(str(row["label"]), []).append(row)
    chosen = record["chosen"]["label"] if record.get("chosen") else None
    for label, mine in by_label.items():
        last = mine[-1]
        params = {
            k: last[k] for k in ("direction", "beam", "batch", "r", "k", "min_count", "probes", "selection")
        }
        params["options"] = last["options"]
        params["decided"] = "chosen" if label == chosen else last["decided"]
        metrics = numeric_metrics(last)
        series = {
            f"{name}_by_rung": [float(r[name]) for r in mine]
            for name in ("search_errors", "speed_ratio", "cpu_ratio", "sentences")
        }
        started, ended = span(mine)
        tracker.log_stage(
            StageRecord("tune", label, "ran", "", params, metrics, series, started=started, ended=ended)
        )
    for path in artifacts:
        tracker.client.log_artifact(tracker.parent_id, str(path))
    final: dict[str, float] = {}
    if result is not None:
        test = record["test"]
        final = {
            "chosen_dev_search_errors": float(record["chosen"]["search_errors"]),
            "chosen_dev_speed_ratio": float(record["chosen"]["speed_ratio"]),
            "chosen_test_search_errors": float(test["search_errors"]),
            "chosen_test_speed_ratio": float(test["speed_ratio"]),
            "chosen_test_cpu_ratio": float(test["cpu_ratio"]),
            "chosen_test_identical": float(test["identical"]),
            "within_budget_on_test": float(record["within_budget_on_test"]),
        }
        for key, value in record["chosen"]["config_keys"].items():
            tracker.client.set_tag(tracker.parent_id, f"fastvocab.tune.{key}", str(value))
        tracker.client.set_tag(tracker.parent_id, "fastvocab.tune.map_path", record["map_path"])
    tracker.end("FINISHED" if outcome == "chosen" else "FAILED", metrics=final)
    print(f"MLflow: run {tracker.parent_id} in {tracker.uri}", file=sys.stderr)
