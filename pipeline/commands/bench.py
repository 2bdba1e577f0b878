"""``fastvocab bench``: measurements a user can rerun on their own model and maps.

``fastvocab bench fidelity``: the fidelity yardstick of ``experiments/fidelity.py``: decode a direction's
test sentences with full softmax and with clustered methods, same search and settings, and report per
direction, beam, batch and method the identical-output rate, the search error rate, BLEU, active columns per
row, the certified share and speed.

``fastvocab bench methods``: every output-layer method (full, clustered union and per-row, lsh, graph,
shortlist) over a grid of its parameters (``experiments.bench_methods``, which reuses the yardstick's decoding
and scoring): speed, projection time, candidates per row, search errors, BLEU/chrF, peak RSS, offline build
time and artifact size; writes a JSON record and a PNG (speed ratio against search error rate, Pareto front
marked) and logs both to MLflow (the store of every command: ``pipeline/tracking.py`` ``resolve_store``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from fastvocab.pipeline.commands import (
    add_batch_size,
    add_corpus,
    add_count,
    add_deprecated,
    add_examples,
    add_grid_alias,
    add_length_penalty,
    add_max_len,
    add_mlflow_options,
    add_model,
    add_output,
    add_subcommand,
    command_line,
    int_list,
    load_model,
    mlflow_store,
)
from fastvocab.pipeline.errors import UserError

if TYPE_CHECKING:
    from fastvocab.decoding import Seq2SeqAdapter
    from fastvocab.experiments.fidelity import FidelitySettings

HELP = "measure output-layer methods against full softmax (fidelity yardstick; all methods side by side)"

log = logging.getLogger(__name__)
_S = TypeVar("_S")

EXAMPLES = """\
examples:
  fastvocab bench fidelity --directions en-it --sentences 50
  fastvocab bench methods --directions en-it --methods full,clustered,shortlist --beams 1
  fastvocab bench scope --clusters models/demo-maps --directions it-en --sentences 100
"""

FIDELITY_HELP = "decode with full softmax and clustered methods; report search errors, BLEU, speed"

FIDELITY_EXAMPLES = """\
examples:
  fastvocab bench fidelity --directions en-it --sentences 50
  fastvocab bench fidelity --clusters models/demo-maps --with-shortlist models/demo-maps --sentences 50
"""

FIDELITY_DESCRIPTION = """\
Decode the first --sentences sentences of the --split of each direction with the full projection and with
each clustered method, same search and settings (beam, batch, length penalty), in one process, and report
against full softmax:

  identical      share of sentences whose output equals full softmax's output
  search_errors  share whose output scores lower under the full model than full softmax's output
                 (Hoang et al.; forced decoding with the full projection, the search's length penalty)
  BLEU, chrF     of full softmax and of the method, against the references
  cols/row       vocabulary columns computed per decoder row (a row sent to the full projection counts N)
  certified      share of rows with an exactness certificate (method exact)
  speed          sentences/s and tokens/s of full and the method (median over --repeats) and their ratio

Methods: clustered (no inactive-mass estimate), normaliser, moments, centroid (that --inactive-mass of
fastvocab translate; beam > 1 only), exact (--exact), per-row (--selection per-row).
Writes the JSON record (command, meta, one result per row) to --output and prints the table.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_examples(p, EXAMPLES)
    sub = p.add_subparsers(dest="bench", metavar="BENCHMARK", required=True)
    for name, help, description, examples, add in (
        ("fidelity", FIDELITY_HELP, FIDELITY_DESCRIPTION, FIDELITY_EXAMPLES, add_fidelity_arguments),
        ("methods", METHODS_HELP, METHODS_DESCRIPTION, METHODS_EXAMPLES, add_methods_arguments),
        ("scope", SCOPE_HELP, SCOPE_DESCRIPTION, SCOPE_EXAMPLES, add_scope_arguments),
    ):
        bench = add_subcommand(sub, name, help, description)
        add_examples(bench, examples)
        add(bench)


def fidelity_parser(description: str) -> argparse.ArgumentParser:
    """A standalone parser with the fidelity options (the benchmark script's)."""
    p = argparse.ArgumentParser(description=description, allow_abbrev=False)
    add_fidelity_arguments(p)
    return p


def add_fidelity_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.experiments.fidelity import DEFAULT_METHODS, GRIDS, METHODS, FidelitySettings

    d = FidelitySettings()
    _add_model_corpus(p, d.split)
    p.add_argument(
        "--clusters",
        dest="maps",
        type=Path,
        default=Path("runs/demo/maps"),
        metavar="DIR",
        help="cluster maps root or a map folder (default: %(default)s)",
    )
    add_deprecated(p, "--maps", "--clusters", "maps", type=Path, metavar="DIR")
    grids = "; ".join(f"{k}: beams {v[0]} x batches {v[1]}" for k, v in GRIDS.items())
    p.add_argument(
        "--grid",
        choices=sorted(GRIDS),
        default="quick",
        help=f"beams x batches preset, {grids} (default: %(default)s)",
    )
    p.add_argument("--beams", metavar="B,B", help="comma-separated beam sizes (default: --grid's)")
    p.add_argument("--batches", metavar="N,N", help="comma-separated batch sizes (default: --grid's)")
    p.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        metavar="M,M",
        help=f"comma-separated, of {', '.join(METHODS)} (default: %(default)s)",
    )
    p.add_argument(
        "--selection",
        default=d.selection,
        choices=("union", "per-row"),
        help="clustered selection (default: %(default)s)",
    )
    p.add_argument(
        "--with-shortlist",
        type=Path,
        metavar="DIR",
        help="join the lexical shortlist's candidates for the batch's sentences to every clustered method's "
        "sets, as translate --with-shortlist does: a shortlist table, or a folder holding "
        "shortlist/<src>-<tgt> (models/demo-maps does); union selection only",
    )
    add_count(
        p,
        "--probes",
        "union selection: each row adds the sets of its N nearest clusters (default: the map's)",
    )
    add_count(p, "--sentences", "first N sentences of the split, 0 = all (default: %(default)s)", d.sentences)
    _add_search_and_device(p, d.max_len, d.length_penalty)
    add_count(p, "--repeats", "timed runs per method, median reported (default: %(default)s)", d.repeats)
    add_output(p, "JSON results file (default: fidelity-<date>.json here)")


def _add_model_corpus(p: argparse.ArgumentParser, split: str) -> None:
    """--model, --corpus, --split and --directions, as both benchmarks take them."""
    add_model(p)
    add_corpus(p)
    p.add_argument("--split", default=split, help="corpus split (default: %(default)s)")
    p.add_argument(
        "--directions",
        default="en-it,it-en",
        metavar="SRC-TGT,...",
        help="comma-separated (default: %(default)s)",
    )


def _add_search_and_device(p: argparse.ArgumentParser, max_len: int, length_penalty: float) -> None:
    """--max-len, --length-penalty, --threads and --device, as both benchmarks take them."""
    add_max_len(p, max_len)
    add_length_penalty(p, length_penalty)
    p.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's)")
    p.add_argument("--device", default="cpu", help="torch device (default: %(default)s)")


def run_fidelity_command(
    args: argparse.Namespace, command: str, extra_meta: Callable[[], dict[str, object]] | None = None
) -> int:
    """Run the yardstick as ``args`` say, write the record, print the table. ``extra_meta`` is called
    after the thread count is set (a device name may read it)."""
    from fastvocab.experiments.fidelity import GRIDS, TABLE_HEADER, format_row, run_fidelity

    settings = _fidelity_settings(args, GRIDS[args.grid])
    directions = [d for d in args.directions.split(",") if d]
    shortlists = _fidelity_shortlists(args, settings.methods, directions)
    out = args.output or Path(f"fidelity-{dt.date.today().isoformat()}.json")
    adapter, load_before, t0 = load_model(args)
    print(TABLE_HEADER, file=sys.stderr, flush=True)
    try:
        results = run_fidelity(
            adapter,
            args.corpus,
            args.maps,
            directions,
            settings,
            on_row=lambda row: print(format_row(row), file=sys.stderr, flush=True),
            shortlists=shortlists,
        )
    except ValueError as exc:  # an unknown language
        raise UserError(str(exc)) from exc
    extra = {} if extra_meta is None else extra_meta()
    record = _fidelity_record(
        args, command, results, adapter, settings, directions, shortlists, (load_before, t0)
    )
    record["meta"].update(extra)
    _write_record(out, record)
    _print_table(TABLE_HEADER, [format_row(row) for row in results])
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _fidelity_settings(
    args: argparse.Namespace, grid: tuple[tuple[int, ...], tuple[int, ...]]
) -> FidelitySettings:
    """The yardstick's settings from ``args`` (``grid``: the beams and batches when not given)."""
    from fastvocab.experiments.fidelity import FidelitySettings

    return _settings(
        FidelitySettings,
        args,
        beams=int_list(args.beams, "--beams") or grid[0],
        batches=int_list(args.batches, "--batches") or grid[1],
        methods=tuple(m for m in args.methods.split(",") if m),
        selection=args.selection,
        probes=args.probes,
    )


def _fidelity_record(
    args: argparse.Namespace,
    command: str,
    results: list[dict],
    adapter: Seq2SeqAdapter,
    settings: FidelitySettings,
    directions: list[str],
    shortlists: dict[str, Path],
    started: tuple[tuple[float, float, float], float],
) -> dict:
    """The yardstick's JSON record of ``results`` (``started``: the load average before and the start)."""
    import torch

    from fastvocab.experiments.fidelity import fidelity_record, run_meta

    load_before, t0 = started
    seconds = time.perf_counter() - t0
    return fidelity_record(
        results,
        run_meta(adapter, args.device, load_before, threads=torch.get_num_threads()),
        command=command,
        settings=settings,
        model=str(args.model),
        maps=str(args.maps),
        directions=directions,
        seconds=seconds,
        extra_meta={"shortlists": {d: str(p) for d, p in shortlists.items()}},
    )


def _fidelity_shortlists(
    args: argparse.Namespace, methods: Sequence[str], directions: Sequence[str]
) -> dict[str, Path]:
    """Each direction's shortlist table that ``--with-shortlist`` names (checked before the model loads)."""
    if args.with_shortlist is None:
        return {}
    if args.selection != "union" or "per-row" in methods:
        raise UserError("--with-shortlist needs union selection (drop per-row from --methods)")
    from fastvocab.pipeline.method_choice import resolve_index

    return {d: resolve_index(args.with_shortlist, "shortlist", d, "--with-shortlist") for d in directions}


def _settings(make: Callable[..., _S], args: argparse.Namespace, **fields: object) -> _S:
    """``make(**fields)`` with the options both benchmarks take (--sentences, --split, --max-len,
    --length-penalty, --repeats); a value the settings refuse is a UserError."""
    try:
        return make(
            **fields,
            sentences=args.sentences,
            split=args.split,
            max_len=args.max_len,
            length_penalty=args.length_penalty,
            repeats=args.repeats,
        )
    except ValueError as exc:
        raise UserError(str(exc)) from exc


def _write_record(out: Path, record: dict) -> None:
    """The JSON record at ``out``, its folder made when missing."""
    from fastvocab.artifacts_schema.jsonfile import write_json

    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, record)


def _print_table(header: str, rows: list[str]) -> None:
    """The results table on stdout (the rows went to stderr as they came)."""
    print(header)
    for row in rows:
        print(row)


def run(args: argparse.Namespace) -> int:
    if args.bench == "fidelity":
        return run_fidelity_command(args, command_line(args, "bench", "fidelity", skip=("bench",)))
    if args.bench == "methods":
        return run_methods_command(args, command_line(args, "bench", "methods", skip=("bench",)))
    if args.bench == "scope":
        return run_scope_command(args, command_line(args, "bench", "scope", skip=("bench",)))
    raise UserError(f"unknown benchmark {args.bench!r}")


# ------------------------------------------------------------------------------------------- bench methods

METHODS_HELP = "every output-layer method over a parameter grid: speed vs search errors, memory, build cost"

METHODS_EXAMPLES = """\
examples:
  fastvocab bench methods --directions en-it --methods full,clustered,shortlist --beams 1
  fastvocab bench methods --work-dir runs/demo --directions en-it,it-en --point clustered:probes=2
"""

METHODS_DESCRIPTION = """\
Decode the first --sentences sentences of the --split of each direction with full softmax and with every
point of a parameter grid of each method, same search and settings, in one process
(experiments/bench_methods.py; the decoding and scoring are the fidelity yardstick's), and record per point:

  identical, search_errors  against full softmax's output (Hoang et al.: the output scores lower under
                            the full model)
  BLEU, chrF                of the method, against the references (and of full)
  candidates_per_row        vocabulary columns computed per decoder row
  sent/s, ratio             sentences/s and the ratio to full (median over --repeats), cpu_ratio likewise
  projection_seconds/ratio  time inside the output layer while decoding (selection included), ratio to full
  rss_peak_mib              peak RSS while the method alone decodes the warm-up sentences (VmHWM, reset
                            through /proc/self/clear_refs; else ru_maxrss, a process-lifetime peak)
  build_seconds, bytes      the method's offline artifact (built here, or read from --methods-dir)

Methods: full, clustered (union selection; --maps), per-row (clustered, per-row selection), lsh (SimHash,
points: k), graph (FGD/HNSW, points: k, ef_search), shortlist (lexical, points: k per source subword,
frequent, copy). --grid quick: 30 sentences and 2 points per indexed method; full: 100 sentences, 5-6 points.
--point METHOD:KEY=VALUE,... replaces a method's grid by the points given; a clustered point takes the
projection's options (probes, exact, inactive_mass, shortlist_k, ...), maps=DIR (another maps root than
--maps) and shortlist=DIR (a shortlist table, or a methods root: <DIR>/shortlist/<direction>), e.g.
clustered:maps=runs/k1/maps,shortlist=runs/demo/methods,probes=2.
Writes the JSON record (command, meta with load average, rows, Pareto front) to --output and a PNG of speed
ratio against search error rate beside it, and logs them to MLflow (one parent run, one child run per point):
--tracking-uri, else $MLFLOW_TRACKING_URI, else the default store <work-dir>/mlflow.db (runs/demo without
--work-dir, where `fastvocab run configs/demo.yaml` logs); --no-mlflow logs nothing.
"""


def add_methods_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.experiments.bench_methods import GRIDS, METHODS, SENTENCES, BenchSettings

    d = BenchSettings()
    _add_model_corpus(p, d.split)
    p.add_argument(
        "--clusters",
        dest="maps",
        type=Path,
        metavar="DIR",
        help="cluster maps root or a map folder, for clustered and per-row (default: <work-dir>/maps, "
        "else runs/demo/maps)",
    )
    add_deprecated(p, "--maps", "--clusters", "maps", type=Path, metavar="DIR")
    p.add_argument(
        "--methods-dir",
        type=Path,
        metavar="DIR",
        help="artifacts of lsh/graph/shortlist as the methods stage lays them out (<DIR>/<method>/all, "
        "<DIR>/shortlist/<direction>); those not there are built now (default: <work-dir>/methods)",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        metavar="DIR",
        help="a pipeline work dir: its maps, its methods artifacts and its MLflow store (mlflow.db)",
    )
    sizes = ", ".join(f"{k}: {SENTENCES[k]} sentences" for k in GRIDS)
    p.add_argument(
        "--grid",
        choices=sorted(GRIDS),
        default=d.grid,
        help=f"parameter grid, {sizes} (default: %(default)s)",
    )
    add_grid_alias(p)
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        metavar="M,M",
        help="comma-separated, of %(default)s (default: all)",
    )
    p.add_argument(
        "--point",
        action="append",
        default=[],
        metavar="METHOD:KEY=VALUE,...",
        help="a grid point of METHOD, e.g. shortlist:k=50,frequent=2000 or clustered:exact=true; "
        "repeatable: a method given any --point is measured at those points only, instead of the grid's",
    )
    p.add_argument(
        "--beams", default="1,4", metavar="B,B", help="comma-separated beam sizes (default: %(default)s)"
    )
    add_batch_size(p, d.batch_size)
    add_count(p, "--sentences", "first N sentences of the split, 0 = all (default: the grid's)")
    _add_search_and_device(p, d.max_len, d.length_penalty)
    add_count(p, "--repeats", "timed passes, median reported (default: %(default)s)", d.repeats)
    add_output(p, "JSON record (default: benchmarks/results/methods-<dev>-<date>.json)")
    p.add_argument("--plot", type=Path, metavar="FILE", help="PNG plot (default: the JSON's name with .png)")
    add_mlflow_options(
        p,
        "the default store <work-dir>/mlflow.db (runs/demo/mlflow.db without --work-dir)",
        "fastvocab-bench",
    )


def _default_out(device: str) -> Path:
    base = Path("benchmarks/results")
    kind = "cpu" if device == "cpu" else "gpu"
    name = f"methods-{kind}-{dt.date.today().isoformat()}.json"
    return base / name if base.is_dir() else Path(name)


def run_methods_command(
    args: argparse.Namespace, command: str, extra_meta: Callable[[], dict[str, object]] | None = None
) -> int:
    """Run ``bench methods`` as ``args`` say: the record, the plot, the table, MLflow when asked."""
    from fastvocab.experiments import bench_methods as bm
    from fastvocab.experiments.fidelity import run_meta
    from fastvocab.pipeline.extras import require

    require("bench methods (its plot)", "matplotlib")

    work = args.work_dir
    maps = args.maps or (work / "maps" if work else Path("runs/demo/maps"))
    methods_dir = args.methods_dir or (work / "methods" if work else None)
    points: dict[str, list[dict[str, object]]] = {}
    for text in args.point:
        try:
            method, point = bm.parse_point(text)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        points.setdefault(method, []).append(point)
    settings = _settings(
        bm.BenchSettings,
        args,
        grid=args.grid,
        methods=tuple(m for m in args.methods.split(",") if m),
        beams=int_list(args.beams, "--beams") or (1, 4),
        batch_size=args.batch_size,
        points=points,
    )
    directions = [d for d in args.directions.split(",") if d]
    tracker = None
    store = mlflow_store(args, work)
    if store is not None:  # a bad URI fails before the work
        from fastvocab.pipeline.tracking import Tracker

        tracker = Tracker.open(store, args.experiment_name)
    out = args.output or _default_out(args.device)
    png = args.plot or out.with_suffix(".png")
    adapter, load_before, t0 = load_model(args)
    print(bm.TABLE_HEADER, file=sys.stderr, flush=True)
    try:
        results = bm.run_bench(
            adapter,
            args.corpus,
            maps,
            directions,
            settings,
            methods_dir=methods_dir,
            on_row=lambda row: print(bm.format_row(row), file=sys.stderr, flush=True),
            on_note=lambda msg: log.info("%s", msg),
        )
    except ValueError as exc:  # an unknown language, a missing --maps
        raise UserError(str(exc)) from exc
    meta = {
        **run_meta(adapter, args.device, load_before),
        "model": str(args.model),
        "maps": str(maps),
        "methods_dir": None if methods_dir is None else str(methods_dir),
        "corpus": str(args.corpus),
        "directions": directions,
        "seconds_total": round(time.perf_counter() - t0, 1),
        "speed_note": "wall-clock ratios on a shared machine: see loadavg; cpu_ratio is steadier",
        **(extra_meta() if extra_meta is not None else {}),
    }
    record = bm.bench_record(results, command=command, meta=meta, settings=settings)
    _write_record(out, record)
    bm.plot_speed_vs_errors(results, png, title=f"{args.model} on {meta['device']}: {command[:120]}")
    _print_table(bm.TABLE_HEADER, [bm.format_row(row) for row in results])
    print(f"wrote {out} and {png}", file=sys.stderr)
    if tracker is not None:
        _log_methods_to_mlflow(tracker, record, out, png)
    return 0


def _log_methods_to_mlflow(tracker, record: dict, out: Path, png: Path) -> None:
    """One parent run (the settings as params, the JSON and PNG as artifacts), one child run per point,
    spanning its decoding."""
    from fastvocab.experiments.bench_methods import numeric_metrics, span
    from fastvocab.pipeline.tracking import StageRecord

    meta = record["meta"]
    config = {k: v for k, v in meta.items() if k not in ("points", "artifact_params")}
    tags = {"fastvocab.benchmark": "methods"}
    tracker.start("bench-methods", {"command": record["command"], **config}, tags)
    for row in record["results"]:
        params = {k: row[k] for k in ("direction", "beam", "batch", "method", "label", "artifact")}
        params["options"] = row["options"]
        unit = f"{row['direction']}:beam{row['beam']}:{row['label']}"
        started, ended = span([row])
        metrics = numeric_metrics(row)
        tracker.log_stage(
            StageRecord("bench-methods", unit, "ran", "", params, metrics, started=started, ended=ended)
        )
    tracker.client.log_artifact(tracker.parent_id, str(out))
    tracker.client.log_artifact(tracker.parent_id, str(png))
    tracker.end()
    print(f"MLflow: run {tracker.parent_id} in {tracker.uri}", file=sys.stderr)


# --------------------------------------------------------------------------------------------- bench scope

SCOPE_HELP = "choose per direction between its own map and its target's pooled map, by measurement on dev"

SCOPE_EXAMPLES = """\
examples:
  fastvocab bench scope --clusters models/demo-maps --directions it-en --sentences 100
"""

SCOPE_DESCRIPTION = """\
For each direction, decode the first --sentences sentences of --split (dev: text the maps never saw) with
each map that can serve it under --maps (its own <src>-<tgt>, its target's pooled to-<tgt>), the same search
for both, and choose the one with fewer search errors against full softmax (within one sentence of each
other: the one that computes fewer columns a row). Writes the JSON record to --output; with --publish DIR
(the published maps, e.g. models/demo-maps) also records each choice and why in DIR/maps.json (serves) and
withdraws the maps that lost from DIR, so decoding there takes the winner (a direction without its own
map falls back to its target's pooled map).
"""


def add_scope_arguments(p: argparse.ArgumentParser) -> None:
    add_fidelity_arguments(p)
    p.set_defaults(split="dev", methods="clustered", beams="1", batches="32", sentences=300)
    p.add_argument(
        "--publish",
        type=Path,
        metavar="DIR",
        help="published maps to record the choices in and withdraw the losers from (default: none)",
    )


def run_scope_command(args: argparse.Namespace, command: str) -> int:
    from fastvocab.experiments.scope_choice import choose_maps

    settings = _fidelity_settings(args, ((1,), (32,)))
    directions = [d for d in args.directions.split(",") if d]
    shortlists = _fidelity_shortlists(args, settings.methods, directions)
    out = args.output or Path(f"scope-{dt.date.today().isoformat()}.json")
    adapter, load_before, t0 = load_model(args)
    try:
        choices = choose_maps(adapter, args.corpus, args.maps, directions, settings, shortlists)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    rows = [row for c in choices.values() for row in c.pop("rows")]
    record = _fidelity_record(
        args, command, rows, adapter, settings, directions, shortlists, (load_before, t0)
    )
    record["benchmark"] = "scope"
    record["choices"] = choices
    _write_record(out, record)
    for d, c in choices.items():
        print(f"{d}: {c['map']} ({c['why']})")
    if args.publish is not None:
        from fastvocab.tasks.publish import record_choices

        removed = record_choices(args.publish, choices)
        print(f"recorded in {args.publish}; withdrawn: {', '.join(removed) or 'none'}", file=sys.stderr)
    print(f"wrote {out}", file=sys.stderr)
    return 0
