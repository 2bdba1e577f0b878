"""``fastvocab experiment``: experiments a user reviews in MLflow, on their own model.

``fastvocab experiment paper``: the tables and figures of Amer et al. (2022) measured on a model, its corpus
and a pipeline work dir's maps and stored states (``experiment_paper``). Each table and figure is one
child run of one parent run (tables as CSV and Markdown artifacts, figures as PNG); the same files and a JSON
record of every number go to ``--output``. ``fastvocab report <parent run id>`` renders the result as one
page.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import logging
import re
import sys
import time
from pathlib import Path

from fastvocab.artifacts_schema.provenance import git_commit
from fastvocab.pipeline import commands
from fastvocab.pipeline.errors import UserError

HELP = "experiments of Amer et al. on your model (tables and figures logged to MLflow)"
EXPERIMENT = "fastvocab-experiments"

log = logging.getLogger(__name__)

PAPER_HELP = "the paper's Tables 2-5 and Figures 2-4 on a model and its directions"

EXAMPLES = """\
examples:
  fastvocab experiment paper --quick
  fastvocab experiment paper --quick --parts table2,table3 --directions en-it,it-en
"""

PAPER_DESCRIPTION = """\
The experiments of Amer et al. (2022) on a model (default: the demo model), its corpus and the maps and
stored hidden states of a pipeline work dir (default runs/demo, as `fastvocab run configs/demo.yaml`
leaves it):

  table2   active percentage and time per call of the output layer, full vs clustered, per direction and
           search setting (beam 1 batch 1; beam 2 batch 20), measured inside decoding
  table3   BLEU full vs clustered, end-to-end speed-up (tokens/s, %), identical-output rate and search error
           rate (Hoang et al.), at beam 1 batch 1 and beam 2 batch 20, on the test split ("set 1")
  table4   the same at beam 2 batch 20 on the dev split ("set 2")
  table5   memory: peak RSS while each method decodes, and the map's size
  figure2  largest active set (% of the vocabulary) against r = 100-500 at K=1, one map of --fig-direction
           (source and target known) vs one map pooling it with --fig2-pool (target only known)
  figure3  speed vs full softmax against r = 100-2000 for K = 1, 3, 5 (--fig-direction, dev split, beam 2
           batch 20; full and the K maps of one r decoded interleaved)
  figure4  active percentage per centroid index at r = 1300 for K = 1, 3, 5

Tables 2-5 use the work dir's maps; Figures 2-4 re-cluster the work dir's stored states (Faiss k-means)
without dumping again. A direction with no stored states (Figure 2's pool: fr-en and es-en by default) is
dumped once into --states-cache with the dump stage's actor. The clustered method is the paper's (union
selection, softmax over the active columns: --inactive-mass none).

--quick keeps every table and figure and each axis's range but samples it (30 test and 40 dev sentences,
r in {100, 300, 500} for Figure 2 and {100, 700, 1300, 2000} for Figure 3, 500-1000 sentences of states):
about 10 CPU-minutes on the demo model. Without it the paper's grids run (hours on 2 cores).

MLflow store: --tracking-uri, else $MLFLOW_TRACKING_URI, else the default store <work-dir>/mlflow.db
(runs/demo/mlflow.db, where `fastvocab run` and `fastvocab report` log and look by default); --no-mlflow logs
nothing.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    commands.add_examples(p, EXAMPLES)
    sub = p.add_subparsers(dest="experiment", metavar="EXPERIMENT", required=True)
    paper = commands.add_subcommand(sub, "paper", PAPER_HELP, PAPER_DESCRIPTION)
    commands.add_examples(paper, EXAMPLES)
    add_paper_arguments(paper)


def add_paper_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.experiments.experiment_paper import PARTS
    from fastvocab.pipeline.tracking import DEFAULT_WORK_DIR

    commands.add_model(p)
    commands.add_corpus(p)
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"pipeline work dir: its maps, stored states and MLflow store (default: {DEFAULT_WORK_DIR})",
    )
    p.add_argument(
        "--clusters",
        dest="maps",
        type=Path,
        metavar="DIR",
        help="cluster maps root or folder for Tables 2-5 (default: <work-dir>/maps)",
    )
    commands.add_deprecated(p, "--maps", "--clusters", "maps", type=Path, metavar="DIR")
    p.add_argument(
        "--states",
        type=Path,
        metavar="DIR",
        help="stored hidden states for Figures 2-4 (default: <work-dir>/states)",
    )
    p.add_argument(
        "--states-cache",
        type=Path,
        metavar="DIR",
        help="where directions without stored states are dumped (default: <work-dir>/experiment-states)",
    )
    p.add_argument(
        "--pool-corpus",
        type=Path,
        metavar="DIR",
        help="corpus with the source text of directions dumped here (a pair split, or mono/<src>.parquet "
        "from `fastvocab corpus --mono`) (default: --corpus)",
    )
    p.add_argument(
        "--directions",
        metavar="SRC-TGT,...",
        help=f"Tables 2-5, comma-separated {_preset('directions')}",
    )
    p.add_argument(
        "--parts",
        default=",".join(PARTS),
        metavar="PART,...",
        help="comma-separated, of %(default)s (default: all)",
    )
    p.add_argument(
        "--quick", action="store_true", help="sampled grids that keep the tables' and figures' shape"
    )
    _add_grid_arguments(p)
    commands.add_output(
        p, "results folder (default: benchmarks/results/paper-<dev>-<date>[-quick])", metavar="DIR"
    )
    commands.add_mlflow_options(
        p, "the default store <work-dir>/mlflow.db", EXPERIMENT, "write the results folder only"
    )


def _preset(name: str) -> str:
    """The presets' value of a setting, as the help's default: the paper's grid's, and --quick's."""
    from fastvocab.experiments.experiment_paper import PRESETS

    def text(value: object) -> str:
        if not isinstance(value, tuple):
            return str(value)
        if len(value) > 5 and len({b - a for a, b in itertools.pairwise(value)}) == 1:  # a range
            return f"{value[0]},{value[1]},...,{value[-1]}"
        return ",".join(map(str, value))

    a, b = getattr(PRESETS["full"], name), getattr(PRESETS["quick"], name)
    return f"(default: {text(a)})" if a == b else f"(default: {text(a)}; --quick: {text(b)})"


def _add_grid_arguments(p: argparse.ArgumentParser) -> None:
    """What the tables and figures measure: sentences, grids, the search, repeats, where it runs."""
    p.add_argument(
        "--sentences",
        type=int,
        metavar="N",
        help=f"first N test sentences for Tables 2, 3, 5, 0 = all {_preset('sentences')}",
    )
    p.add_argument(
        "--set2-sentences",
        type=int,
        metavar="N",
        help=f"first N dev sentences for Table 4, 0 = all {_preset('set2_sentences')}",
    )
    p.add_argument(
        "--fig-direction", metavar="SRC-TGT", help=f"direction of Figures 2-4 {_preset('fig_direction')}"
    )
    p.add_argument(
        "--fig2-pool",
        metavar="SRC-TGT,...",
        help=f"directions pooled into its target for Figure 2 {_preset('fig2_pool')}",
    )
    p.add_argument("--fig2-rs", metavar="R,R", help=f"Figure 2's numbers of clusters {_preset('fig2_rs')}")
    p.add_argument(
        "--fig2-sentences",
        type=int,
        metavar="N",
        help=f"sentences of states per direction in Figure 2 {_preset('fig2_sentences')}",
    )
    p.add_argument("--fig3-rs", metavar="R,R", help=f"Figure 3's numbers of centroids {_preset('fig3_rs')}")
    p.add_argument(
        "--fig3-sentences",
        type=int,
        metavar="N",
        help=f"first N dev sentences decoded per r in Figure 3, 0 = all {_preset('fig3_sentences')}",
    )
    p.add_argument(
        "--fig-state-sentences",
        type=int,
        metavar="N",
        help=f"sentences of stored states for Figures 3-4, 0 = all {_preset('fig_state_sentences')}",
    )
    p.add_argument(
        "--fig4-r", type=int, metavar="R", help=f"Figure 4's number of centroids {_preset('fig4_r')}"
    )
    p.add_argument("--ks", metavar="K,K", help=f"K of Figures 3 and 4, comma-separated {_preset('ks')}")
    p.add_argument("--niter", type=int, metavar="N", help=f"k-means iterations {_preset('niter')}")
    p.add_argument(
        "--inactive-mass",
        choices=("none", "centroid", "moments", "normaliser", "auto"),
        help=f"clustered method's inactive-mass estimate, none: the paper's {_preset('inactive_mass')}",
    )
    p.add_argument("--max-len", type=int, metavar="N", help=f"max target tokens {_preset('max_len')}")
    p.add_argument(
        "--repeats",
        type=int,
        metavar="N",
        help=f"timed passes per setting, median reported {_preset('repeats')}",
    )
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's)")
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")


def _names(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(x.strip() for x in text.split(",") if x.strip())


def paper_settings(args: argparse.Namespace):
    """The preset (``--quick`` or the paper's grid) with the flags given on top."""
    from fastvocab.experiments.experiment_paper import PRESETS

    base = PRESETS["quick" if args.quick else "full"]
    over = {
        "directions": _names(args.directions),
        "sentences": args.sentences,
        "set2_sentences": args.set2_sentences,
        "fig_direction": args.fig_direction,
        "fig2_pool": _names(args.fig2_pool),
        "fig2_rs": commands.int_list(args.fig2_rs, "--fig2-rs"),
        "fig2_sentences": args.fig2_sentences,
        "fig3_rs": commands.int_list(args.fig3_rs, "--fig3-rs"),
        "fig3_sentences": args.fig3_sentences,
        "fig_state_sentences": args.fig_state_sentences,
        "fig4_r": args.fig4_r,
        "ks": commands.int_list(args.ks, "--ks"),
        "niter": args.niter,
        "inactive_mass": args.inactive_mass,
        "max_len": args.max_len,
        "repeats": args.repeats,
    }
    import dataclasses

    try:
        return dataclasses.replace(base, **{k: v for k, v in over.items() if v is not None})
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def _default_out(device: str, quick: bool) -> Path:
    base = Path("benchmarks/results")
    kind = "cpu" if device == "cpu" else "gpu"
    name = f"paper-{kind}-{dt.date.today().isoformat()}{'-quick' if quick else ''}"
    return base / name if base.is_dir() else Path(name)


def run(args: argparse.Namespace) -> int:
    if args.experiment == "paper":
        return run_paper_command(args)
    raise UserError(f"unknown experiment {args.experiment!r}")


def run_paper_command(args: argparse.Namespace) -> int:
    from fastvocab.experiments import experiment_paper as ep
    from fastvocab.experiments.fidelity import run_meta
    from fastvocab.pipeline.extras import require
    from fastvocab.pipeline.tracking import DEFAULT_WORK_DIR, Tracker

    settings = paper_settings(args)
    parts = _names(args.parts) or ep.PARTS
    bad = [x for x in parts if x not in ep.PARTS]
    if bad:
        raise UserError(f"--parts: unknown {bad}; valid: {', '.join(ep.PARTS)}")
    figures = [x for x in parts if x not in ep.TABLE_PARTS]
    if figures:
        require(f"experiment paper's {', '.join(figures)}", "matplotlib")
    work = args.work_dir or DEFAULT_WORK_DIR
    maps = args.maps or work / "maps"
    states = args.states or work / "states"
    cache = args.states_cache or work / "experiment-states"
    if any(x in ep.TABLE_PARTS for x in parts) and not maps.exists():
        raise UserError(f"no maps at {maps}: run the pipeline (fastvocab run) or pass --maps")
    store = commands.mlflow_store(args, work)
    tracker = None if store is None else Tracker.open(store, args.experiment_name)  # fails before the work
    out = args.output or _default_out(args.device, args.quick)
    command = commands.command_line(args, "experiment", args.experiment, skip=("experiment",))
    adapter, load_before, t0 = commands.load_model(args)

    def note(msg: str) -> None:
        print(f"[{time.perf_counter() - t0:7.1f} s] {msg}", file=sys.stderr, flush=True)

    try:
        data = ep.PaperData(args.corpus, maps, [states], cache, pool_corpus=args.pool_corpus)
        res = ep.run_paper(
            adapter, data, settings, parts, model_path=args.model, device=args.device, note=note
        )
    except ValueError as exc:  # an unknown language, a direction without corpus sentences
        raise UserError(str(exc)) from exc
    meta = {
        **run_meta(adapter, args.device, load_before),
        "model": str(args.model),
        "corpus": str(args.corpus),
        "pool_corpus": str(args.pool_corpus or args.corpus),
        "maps": str(maps),
        "states": res.states,
        "commit": git_commit(digits=12, mark_dirty=False),
        "preset": "quick" if args.quick else "full",
        "parts": list(parts),
        "seconds": res.seconds,
        "seconds_total": round(time.perf_counter() - t0, 1),
        "speed_note": "wall-clock ratios on a shared machine: see loadavg; cpu_ratio is steadier",
    }
    files = write_results(res, out, settings, meta, command)
    print(f"wrote {out}/ ({len(files)} files)", file=sys.stderr)
    for name in res.tables:
        print(f"\n{name}:\n" + (out / f"{name}.md").read_text())
    if tracker is not None:
        parent = log_to_mlflow(tracker, res, files, settings, meta, command)
        print(f"MLflow: run {parent} in {tracker.uri}  (fastvocab report {parent})", file=sys.stderr)
    return 0


TITLES = {
    "table2": "Table 2: active percentage and output-layer time per call, full vs clustered",
    "table3": "Table 3: BLEU full vs clustered, end-to-end speed-up, identical outputs, search errors",
    "table4": "Table 4: the same on set 2 (dev split)",
    "table5": "Table 5: memory, full vs clustered",
    "figure2": "Figure 2: max active percentage against the number of clusters, two ways to build the maps",
    "figure3": "Figure 3: speed against the number of centroids for each K",
    "figure4": "Figure 4: active percentage per centroid index for each K",
}


def write_results(res, out: Path, settings, meta: dict, command: str) -> dict[str, list[Path]]:
    """Every part's files under ``out`` (tables: CSV + Markdown; figures: PNG + CSV + Markdown) and
    ``paper.json`` (command, meta, settings, every row, each part's span); returns part -> files."""
    from fastvocab.artifacts_schema.jsonfile import write_json
    from fastvocab.experiments import experiment_paper as ep
    from fastvocab.pipeline.tracking import plot_active_fractions

    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, list[Path]] = {}
    for name, rows in res.tables.items():
        files[name] = list(ep.write_table(rows, out / name, TITLES[name]))
    who = f"{meta['model']}, {meta['device']}"
    if res.fig2:
        png = ep.plot_figure2(
            res.fig2, out / "figure2.png", f"{settings.fig_direction}, K={settings.fig2_k}: {who}"
        )
        files["figure2"] = [png, *ep.write_table(res.fig2, out / "figure2", TITLES["figure2"])]
    if res.fig3:
        b, n = settings.fig3_setting
        title = f"{settings.fig_direction}, dev split, beam {b} batch {n}: {who}"
        png = ep.plot_figure3(res.fig3, out / "figure3.png", title)
        files["figure3"] = [png, *ep.write_table(res.fig3, out / "figure3", TITLES["figure3"])]
    if res.fig4:
        png = plot_active_fractions(
            res.fig4,
            f"{settings.fig_direction}, r={settings.fig4_r}: active vocabulary per centroid ({who})",
            out / "figure4.png",
        )
        rows = ep.figure4_rows(res.fig4)
        csv_path, _ = ep.write_table(rows, out / "figure4")
        (out / "figure4.md").unlink()  # one row per centroid: the CSV is the data, the PNG the figure
        files["figure4"] = [png, csv_path]
    record = {
        "benchmark": "paper",
        "command": command,
        "meta": meta,
        "settings": settings.describe(),
        "tables": res.tables,
        "figure2": res.fig2,
        "figure3": res.fig3,
        "figure4": {f"k{k}": [round(float(x), 6) for x in v] for k, v in res.fig4.items()},
        "bench_rows": res.bench_rows,
        "spans": {name: list(span) for name, span in res.spans.items()},
    }
    write_json(out / "paper.json", record)
    files["record"] = [out / "paper.json"]
    return files


_METRIC_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def _metric_key(*parts: object) -> str:
    return ".".join(_METRIC_KEY.sub("_", str(p)) for p in parts)


def part_metrics(name: str, res, settings) -> tuple[dict[str, float], dict[str, list[float]]]:
    """A part's numbers as MLflow metrics (one per row and column), and Figure 4's per-centroid series."""
    from fastvocab.experiments.bench_methods import numeric_metrics

    metrics: dict[str, float] = {}
    series: dict[str, list[float]] = {}
    if name in res.tables:
        for row in res.tables[name]:
            key = [row["direction"]] + ([f"b{row['beam']}_n{row['batch']}"] if "beam" in row else [])
            for col, v in numeric_metrics(row).items():
                if col not in ("beam", "batch"):
                    metrics[_metric_key(*key, col)] = v
    elif name == "figure2":
        for row in res.fig2:
            for col in ("max_active_pct", "mean_active_pct"):
                metrics[_metric_key(row["scope"], f"r{row['r']}", col)] = float(row[col])
    elif name == "figure3":
        for row in res.fig3:
            for col in ("speed_pct", "active_pct", "identical_pct", "search_err_pct", "cpu_ratio"):
                metrics[_metric_key(f"k{row['k']}", f"r{row['r']}", col)] = float(row[col])
    elif name == "figure4":
        for k, frac in res.fig4.items():
            pct = [100.0 * float(x) for x in frac]
            metrics[f"k{k}.mean_active_pct"] = sum(pct) / len(pct)
            metrics[f"k{k}.max_active_pct"] = max(pct)
            series[f"k{k}.active_pct_by_centroid"] = pct  # step = centroid index: the report plots it
    return metrics, series


def log_to_mlflow(tracker, res, files: dict[str, list[Path]], settings, meta: dict, command: str) -> str:
    """One parent run (settings and meta as params, the JSON record), one child run per table and figure,
    spanning the part's work (``res.spans``)."""
    from fastvocab.pipeline.tracking import StageRecord

    config = {
        "command": command,
        **{k: v for k, v in meta.items() if k != "states"},
        "settings": settings.describe(),
    }
    tracker.start("experiment-paper", config, {"fastvocab.experiment": "paper"})
    for name in files:
        if name == "record":
            continue
        metrics, series = part_metrics(name, res, settings)
        params: dict[str, object] = {"title": TITLES[name]}
        if name in ("table2", "table3", "table5"):
            params.update(directions=settings.directions, settings=settings.settings, split="test")
        elif name == "table4":
            params.update(directions=settings.directions, setting=settings.set2_setting, split="dev")
        elif name == "figure2":
            params.update(direction=settings.fig_direction, pool=settings.fig2_pool, rs=settings.fig2_rs)
            params.update(k=settings.fig2_k, sentences_per_direction=settings.fig2_sentences)
        elif name == "figure3":
            params.update(direction=settings.fig_direction, rs=settings.fig3_rs, ks=settings.ks)
            params.update(setting=settings.fig3_setting, sentences=settings.fig3_sentences, split="dev")
        elif name == "figure4":
            params.update(direction=settings.fig_direction, r=settings.fig4_r, ks=settings.ks)
        params["inactive_mass"] = settings.inactive_mass
        unit = TITLES[name].split(": ", 1)[1]
        started, ended = res.spans.get(name, (None, None))
        tracker.log_stage(
            StageRecord(
                name,
                unit,
                "ran",
                "",
                params,
                metrics,
                series=series,
                artifacts=files[name],
                started=started,
                ended=ended,
            )
        )
    tracker.client.log_artifact(tracker.parent_id, str(files["record"][0]))
    tracker.end()
    return tracker.parent_id
