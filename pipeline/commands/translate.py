"""``fastvocab translate``: translation of a text file or Parquet dataset for one direction.

Input: UTF-8 text (one sentence a line) or Parquet (a file, a folder of files or a glob; column ``text`` or
``source``, optional ``id``). Output: Parquet with the translations schema when it ends in ``.parquet``, a
Parquet dataset of parts when it is named ``DIR/``, else text with one line per input line. Every input takes
the one resumable path (pipeline/bulk_driver.py), in this process or on Ray actors (``--workers``,
``--ray-address``): it is cut into parts of ``--chunk-lines`` lines, each finished part waits in
``OUTPUT.parts/``, the output appears atomically, in input order, only when every part is done (on any error
no output file is left behind), and a rerun of the same command after a kill translates only the parts not
yet done.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from fastvocab.artifacts_schema.atomic import STDIO, copy_to_stream, is_stream
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.decoding.settings import ENGINES, SearchSettings
from fastvocab.pipeline.checks import check_device, check_int8_device, untrained_direction
from fastvocab.pipeline.commands import (
    add_batch_size,
    add_beam,
    add_examples,
    add_length_penalty,
    add_max_len,
    add_mlflow_options,
    add_model,
    mlflow_store,
)
from fastvocab.pipeline.commands.method_flags import add_method_flags, applies_to, chosen_options, given_flags
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.method_choice import clustered_artifacts, implied_method, resolve_index
from fastvocab.pipeline.ray_session import MIN_RAY_LINES
from fastvocab.pipeline.wording import plural

if TYPE_CHECKING:
    from fastvocab.kernels.options import MethodOptions
    from fastvocab.pipeline.bulk_driver import BulkResult
    from fastvocab.pipeline.config import TranslateConfig

HELP = "translate a text file or Parquet dataset for one direction (full, clustered, lsh, graph, shortlist)"

EXAMPLES = """\
examples:
  echo "Free software for everyone." | fastvocab translate --src-lang en --tgt-lang it
  fastvocab translate --src-lang en --tgt-lang it -i input.txt -o output.txt
  fastvocab translate --src-lang en --tgt-lang it -i input.txt -o output.txt --clusters models/demo-maps
  fastvocab translate --src-lang en --tgt-lang it -i data/corpus/en-it/test.parquet --input-column text1 \\
      -o out/ --workers 2
"""

log = logging.getLogger(__name__)

_DTYPES = ("float32", "float16", "bfloat16", "int8")


def _stopping_rule(value: str) -> bool | str | None:
    from fastvocab.decoding.search import parse_early_stopping

    try:
        return parse_early_stopping(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.artifacts_schema.bulk_parts import PART_LINES
    from fastvocab.pipeline.config import TranslateConfig

    d = TranslateConfig()
    add_examples(p, EXAMPLES)
    add_model(p)
    p.add_argument("--src-lang", required=True, metavar="XX", help="source language code, e.g. en")
    p.add_argument("--tgt-lang", required=True, metavar="YY", help="target language code, e.g. it")
    p.add_argument(
        "-i",
        "--input",
        default=STDIO,
        metavar="FILE",
        help="a text file (one sentence a line), or Parquet: a file, a folder of files (hive partitions "
        "too) or a glob; - or a pipe (/dev/stdin, <(...)): text, read whole first "
        "(default: -, standard input)",
    )
    p.add_argument(
        "-o",
        "--output",
        default=STDIO,
        metavar="FILE",
        help="output: FILE.parquet, DIR/ (with the trailing /: a Parquet dataset of parts, "
        "id/source/translation), else text, one line per input line; a missing folder is created; an "
        "existing file is replaced atomically, a symlink's file too (the link kept); -, /dev/stdout (or "
        "any descriptor the shell opened: /dev/fd/N), a pipe or a device is written through, where it "
        "stands, once every line is translated (default: -, standard output)",
    )
    _add_search_arguments(p, d)
    _add_method_arguments(p)
    _add_load_arguments(p, d)
    p.add_argument(
        "--input-column",
        default=None,
        metavar="NAME",
        help="Parquet input: text column (default: text, else source)",
    )
    p.add_argument(
        "--id-column",
        default="id",
        metavar="NAME",
        help="Parquet input: id column, used when present (default: %(default)s)",
    )
    p.add_argument(
        "--chunk-lines",
        type=int,
        default=PART_LINES,
        metavar="N",
        help="lines a part: memory holds one part a worker, each finished part is kept (in OUTPUT.parts/, "
        "or in the dataset folder), and a rerun after a kill resumes there (default: %(default)s)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_ray_arguments(p)
    add_mlflow_options(
        p,
        "nothing: translate logs only to a store named one of these two ways (the default store, "
        "runs/demo/mlflow.db, would make a one-line translate seconds slower)",
        "fastvocab-bulk",
    )


def _add_search_arguments(p: argparse.ArgumentParser, d: TranslateConfig) -> None:
    """The search: beam, batches, lengths, stopping rule, CUDA graphs."""
    from fastvocab.decoding.steppers import GRAPHS

    add_beam(p, d.beam)
    add_batch_size(p, d.batch_size)
    add_max_len(p, d.max_len)
    p.add_argument(
        "--max-input-tokens",
        type=int,
        default=d.max_input_tokens,
        metavar="N",
        help="longer source lines are an error, never cut (default: %(default)s)",
    )
    add_length_penalty(p, d.length_penalty)
    p.add_argument(
        "--early-stopping",
        type=_stopping_rule,
        default=None,
        metavar="{model,true,false,never}",
        help="beam search's stopping rule, as generate's early_stopping: true ends a sentence once --beam "
        "hypotheses are finished (CTranslate2's rule, fewer steps), false also waits until no live beam "
        "could beat them, never judges that live beam at --max-len (canonical beam search); model: the "
        "model's generation config (default: model)",
    )
    p.add_argument(
        "--graphs",
        choices=GRAPHS,
        default=d.graphs,
        help="the whole decoding step in CUDA graphs: on = the fixed-shape step (captured on CUDA, run "
        "eagerly on CPU; the same outputs; needs the static engine and --method full or clustered with "
        "union selection); off = the eager step; auto = captured on CUDA where the step can be (the "
        "static engine, full or union-mode clustered), eager otherwise (default: %(default)s)",
    )


def _add_method_arguments(p: argparse.ArgumentParser) -> None:
    """``--method`` and the methods' options, made from their dataclasses (method_flags.py)."""
    from fastvocab.kernels.registry import available_projections, options_types

    g = p.add_argument_group("the output-layer method and its options")
    g.add_argument(
        "--method",
        default=None,
        choices=available_projections(),
        help="output-layer method (default: clustered with --clusters, else full)",
    )
    add_method_flags(g, options_types())
    g.add_argument(
        "--no-shortlist",
        action="store_true",
        help="clustered: decode with the clusters' sets alone, not with the shortlist tables found beside "
        "the maps (outputs may then differ from full softmax on many more lines)",
    )


def _add_load_arguments(p: argparse.ArgumentParser, d: TranslateConfig) -> None:
    """Where and how the model runs: device, dtype, engine, threads."""
    p.add_argument(
        "--device", default=d.device, help="torch device, e.g. cpu or cuda:0 (default: %(default)s)"
    )
    p.add_argument(
        "--dtype",
        default="float32",
        choices=_DTYPES,
        help="model dtype; int8: CPU dynamic quantisation of the encoder and decoder linear layers and of "
        "the full or clustered projection (outputs may differ from float32 on a few %% of lines) "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--engine",
        default="auto",
        choices=ENGINES,
        help="the decoder step: static = fastvocab's lean preallocated-cache step; onnx = the same layers, "
        "and the encoder's, run by ONNX Runtime (CPU; exported once per model into the cache folder, "
        "seconds at most the first time; with --dtype int8 ONNX Runtime's own int8, so outputs differ from "
        "static int8 on some lines); hf = the Hugging Face decoder; auto = onnx on CPU in float32 (and "
        "int8) where ONNX Runtime is installed and the cache folder is writable, else static (also with "
        "--graphs on), where the model's family has it, else hf (default: %(default)s)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads; on CPU, N batches are decoded at once on one thread each, in forked worker "
        "processes (faster than N threads on one batch; each batch in flight holds its own decoder cache; "
        "threads with --engine onnx from 32 rows a batch) (default: torch's)",
    )


def _add_ray_arguments(p: argparse.ArgumentParser) -> None:
    """The Ray actors that translate the parts instead of this process."""
    g = p.add_argument_group("on Ray: the same parts, translated by Ray actors")
    g.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="decode on N Ray actors, each loading the model once and pulling ranges of --chunk-lines lines "
        "from one queue; finished parts are kept and a rerun resumes; 1 without --ray-address: in this "
        "process, and so is an input below --min-ray-lines (default: 1)",
    )
    g.add_argument(
        "--min-ray-lines",
        type=int,
        default=MIN_RAY_LINES,
        metavar="N",
        help="--workers > 1 without --ray-address: an input of fewer lines is decoded in this process, with "
        "the workers' CPUs as threads, which finishes before a local Ray and its actors (each loading the "
        "model) would start; the same parts and outputs; a named cluster (--ray-address, $RAY_ADDRESS) and "
        "GPU workers always get Ray; 0: always Ray (default: %(default)s)",
    )
    g.add_argument(
        "--ray-address",
        default=None,
        metavar="ADDRESS",
        help="Ray cluster to attach to ('auto', 'HOST:PORT', 'ray://HOST:10001'; 'local': a private Ray on "
        "this machine, also for --workers 1); on a cluster the input, the output and any map must be on "
        "storage every node sees (default: a local Ray when --workers > 1)",
    )
    g.add_argument(
        "--num-cpus-per-worker",
        type=int,
        default=1,
        metavar="N",
        help="CPUs (torch threads) each actor reserves (default: 1)",
    )
    g.add_argument(
        "--num-gpus-per-worker",
        type=float,
        default=0.0,
        metavar="G",
        help="GPUs each actor reserves; > 0 decodes on the actor's GPU (default: 0)",
    )


def _check_args(args: argparse.Namespace) -> MethodOptions:
    """What the method and search flags can be refused for before the model loads (the input, the output
    and the job's counts are checked by pipeline/bulk_driver.py); returns the options of the method chosen,
    with its map, table or index found and checked here, once for the job (only manifests are read: the
    model and the artifacts' tensors load after every check passed)."""
    from fastvocab.kernels.clustered_parts import ClusteredOptions
    from fastvocab.kernels.registry import options_types

    for flag in ("beam", "batch_size", "max_len", "max_input_tokens"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    check_int8_device(args.dtype, args.device)
    if args.src_lang == args.tgt_lang:
        raise UserError(f"--src-lang and --tgt-lang are both {args.src_lang}: nothing to translate")
    types = options_types()
    args.method = implied_method(args.method, args.clusters)
    given_flags(args, types, args.method)  # a flag of another method: refused before anything is read
    if args.no_shortlist and args.method != "clustered":
        raise applies_to(["--no-shortlist"], ["clustered"], args.method)
    check_device(args.device, "--device")
    untrained = untrained_direction(args.model, args.src_lang, args.tgt_lang)
    if untrained is not None:
        print(f"warning: {untrained}", file=sys.stderr)
    direction = f"{args.src_lang}-{args.tgt_lang}"
    found: dict[str, object] = {}
    if args.method == "clustered" and args.clusters is not None:
        found["cluster_map"], found["shortlist"] = clustered_artifacts(
            args.clusters,
            args.src_lang,
            args.tgt_lang,
            beam=args.beam,
            selection=args.selection or ClusteredOptions.selection,
            with_shortlist=args.with_shortlist,
            no_shortlist=args.no_shortlist,
        )
    if args.method == "shortlist":
        found["direction"] = direction  # the table is per direction: a foreign one is refused at load
    if args.index is not None:
        found["index"] = resolve_index(args.index, args.method, direction)
    return chosen_options(args, types, args.method, **found)


def log_to_mlflow(
    result: BulkResult, uri: str, experiment: str, run_name: str, started: float | None = None
) -> str:
    """One MLflow run for the job (a parent with the job's child record, as the report reads pipelines),
    from ``started`` (seconds since the epoch: when the command started; default the job's start) to now;
    the child holds the job's first lines as a table (source and translation)."""
    import tempfile

    from fastvocab.pipeline.tracking import Tracker

    tracker = Tracker(uri, experiment)  # a new experiment in a SQLite store: artifacts beside the .db
    tracker.start(
        run_name,
        {"bulk": result.params},
        {"fastvocab.kind": "bulk"},
        started=result.started_at if started is None else started,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tracker.log_stage(result.record(artifacts_dir=Path(tmp)))
    tracker.end("FINISHED", {"lines": result.lines, "tokens_per_s": result.tokens_per_second})
    return str(tracker.parent_id)


def run(args: argparse.Namespace) -> int:
    """The flags as a :class:`~fastvocab.pipeline.bulk_driver.BulkRequest`, the job, its summary line (and
    the method's counts when it ran in this process) and, with a tracking URI, its MLflow run."""
    import time

    from fastvocab.pipeline.extras import require
    from fastvocab.pipeline.tracking import check_tracking_uri

    started = time.time()
    options = _check_args(args)
    if args.method == "graph":
        require("--method graph", "faiss")
    store = mlflow_store(args, by_default=False)
    uri = store.uri if store is not None else None
    if store is not None:
        check_tracking_uri(store.uri, store.source)
    with through_files(args.input, args.output) as (input_path, output_path, shown):
        try:
            result = _translate(args, options, input_path, output_path)
        except (UserError, ArtifactError, FileNotFoundError) as exc:
            raise type(exc)(shown(str(exc))) from exc
        result.output = Path(shown(str(result.output)))
    _summarise(args, result)
    if uri:
        name = f"translate {result.params['direction']}"
        run_id = log_to_mlflow(result, uri, args.experiment_name, name, started)
        print(f"MLflow run {run_id} in {uri}", file=sys.stderr)
    return 0


@contextlib.contextmanager
def through_files(input: str, output: str) -> Iterator[tuple[str, str, Callable[[str], str]]]:
    """(input, output, rename): the paths the job reads and writes, and a function that puts the user's
    names back into a message.

    The job resumes part by part from files beside its output, so it needs real files: standard input and
    pipes (``-``, ``/dev/stdin``, ``<(...)``) are read whole into a private folder first, and standard
    output, devices and FIFOs are written through from a file there once every line is translated (a
    failed job writes nothing to them). Such a job does not resume after a kill.
    """
    if not is_stream(input) and not is_stream(output):
        yield input, output, lambda text: text
        return
    with tempfile.TemporaryDirectory(prefix=".fastvocab-translate.") as tmp:
        names: dict[str, str] = {}
        if is_stream(input):
            spooled = Path(tmp) / "input.txt"
            if input == STDIO and sys.stdin.isatty():
                print("reading standard input (Ctrl-D ends it)", file=sys.stderr)
            with spooled.open("wb") as dst:
                if input == STDIO:
                    shutil.copyfileobj(sys.stdin.buffer, dst)
                else:
                    with open(input, "rb") as src:
                        shutil.copyfileobj(src, dst)
            names[str(spooled.resolve())] = names[str(spooled)] = (
                "standard input" if input == STDIO else input
            )
            input = str(spooled)
        target = output
        if is_stream(output):
            # keep the name's suffix: it says text or Parquet
            suffix = ".parquet" if output.endswith(".parquet") else ".txt"
            output = str(Path(tmp) / f"output{suffix}")
            names[output] = "standard output" if target == STDIO else target

        def shown(text: str) -> str:
            for path, name in names.items():
                text = text.replace(path, name)
            return text

        yield input, output, shown
        if output != target and Path(output).is_file():
            copy_to_stream(Path(output), target)


def _translate(
    args: argparse.Namespace, options: MethodOptions, input_path: str, output_path: str
) -> BulkResult:
    from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk

    request = BulkRequest(
        input_path,
        output_path,  # as typed: a trailing / names a dataset folder
        args.model,
        args.src_lang,
        args.tgt_lang,
        options=options,
        # the flags are named as SearchSettings' fields (--beam, --batch-size, ...)
        search=SearchSettings(**{f.name: getattr(args, f.name) for f in fields(SearchSettings)}),
        dtype=args.dtype,
        engine=args.engine,
        device=args.device,
        workers=args.workers,
        ray_address=args.ray_address,
        num_cpus_per_worker=args.threads or args.num_cpus_per_worker,
        num_gpus_per_worker=args.num_gpus_per_worker,
        threads=args.threads,
        lines_per_part=args.chunk_lines,
        text_column=args.input_column,
        id_column=args.id_column,
        min_ray_lines=args.min_ray_lines,
    )
    return run_bulk(request, progress=not args.no_progress)


def _summarise(args: argparse.Namespace, result: BulkResult) -> None:
    """The job's line on standard error (its output may be standard output)."""
    if not result.on_ray:
        import torch

        where = plural(torch.get_num_threads(), "thread")
    else:
        where = (
            f"{plural(args.threads or args.num_cpus_per_worker, 'thread')} a worker, "
            f"{plural(len(result.workers), 'Ray worker')} used of {args.workers}"
        )
    if result.lines == 0:
        print(f"translated {result.summary()}", file=sys.stderr)
    else:
        speed = f"{result.translating_tokens_per_second:.0f} tokens/s translating"
        busy = [w["tokens"] / w["seconds"] for w in result.workers.values() if w["seconds"] > 0]
        if busy and result.decode_seconds > 0:
            speed += (
                f" ({sum(busy) / len(busy):.0f} a worker while busy, "
                f"{result.sentences / result.decode_seconds:.1f} sentences/s decoding)"
            )
        print(
            f"translated {result.summary()} in {result.seconds:.2f} s (load {result.load_seconds:.2f} s, "
            f"translating {result.translate_seconds:.2f} s), {speed} "
            f"[{args.method}, beam {args.beam}, batch {args.batch_size}, {args.device}, {args.dtype}, "
            f"engine {result.params.get('engine', args.engine)}, "
            f"{where}] -> {'standard output' if args.output == STDIO else args.output}",
            file=sys.stderr,
        )
    _print_method_stats(result.method_stats)


def _print_method_stats(stats: dict[str, float | None]) -> None:
    """The clustered method's counts: active columns per decoder row, certified and full rows."""
    active, certified, full = (
        stats.get(k) for k in ("active_columns_per_row", "certified_fraction", "full_fraction")
    )
    if active is None:
        return
    line = f"clustered: {active:.0f} active columns per decoder row"
    if certified is not None:
        line += (
            f", {100 * certified:.1f}% of the rows the certificate examined certified exact "
            "(the others used the full projection)"
        )
    if full:
        why = (
            "the certificate certified too few rows to pay"
            if certified is not None
            else "at their batch's rows the map's union costs more"
        )
        line += f", {100 * full:.1f}% of rows computed every column ({why})"
    print(line, file=sys.stderr)
