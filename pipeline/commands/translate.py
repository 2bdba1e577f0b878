"""``fastvocab translate``: bulk translation of a text file or Parquet dataset for one direction.

Input: UTF-8 text (one sentence a line) or Parquet (a file or a dataset folder; column ``source``, optional
``id``). Output: Parquet with the translations schema when it ends in ``.parquet``, else text with one line
per input line. The output is written atomically at the end: on any error no output file is left behind.
A text input is streamed in chunks (``--chunk-lines``): memory holds one chunk, finished chunks wait in
``OUTPUT.parts/``, and a rerun of the same command after a kill translates only the chunks not yet done.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.checks import check_device, check_map_direction, check_output_file
from fastvocab.pipeline.commands import (
    add_batch_size,
    add_beam,
    add_inactive_mass,
    add_length_penalty,
    add_max_len,
    add_mlflow_options,
    add_model,
)
from fastvocab.pipeline.config import TranslateConfig
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.wording import plural
from fastvocab.tasks.methods import INDEXED_METHODS

if TYPE_CHECKING:
    from fastvocab.pipeline.bulk_driver import BulkResult

HELP = "translate a text file or Parquet dataset for one direction (full, clustered, lsh, graph, shortlist)"

log = logging.getLogger(__name__)

_DTYPES = ("float32", "float16", "bfloat16", "int8")
# option -> the methods it applies to
_METHOD_FLAGS = {
    "index": INDEXED_METHODS,
    "candidates": INDEXED_METHODS,
    "bits": ("lsh",),
    "ef_search": ("graph",),
    "frequent": ("shortlist",),
    "scope": ("shortlist",),
    "probes": ("clustered",),
}


def _stopping_rule(value: str) -> bool | str | None:
    from fastvocab.decoding.search import parse_early_stopping

    try:
        return parse_early_stopping(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.decoding.steppers import GRAPHS
    from fastvocab.kernels import available_projections
    from fastvocab.tasks.projections import BEAM_INACTIVE_MASS

    d = TranslateConfig()
    add_model(p)
    p.add_argument("--src-lang", required=True, metavar="XX", help="source language code, e.g. en")
    p.add_argument("--tgt-lang", required=True, metavar="YY", help="target language code, e.g. it")
    p.add_argument(
        "-i",
        "--input",
        required=True,
        type=Path,
        metavar="FILE",
        help="a text file (one sentence a line), or Parquet: a file, a folder of files (hive partitions "
        "too) or a glob",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="FILE",
        help="output: FILE.parquet, DIR/ (with the trailing /: a Parquet dataset of parts, "
        "id/source/translation), else text, one line per input line; a missing folder is created",
    )
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
    p.add_argument(
        "--method",
        default="full",
        choices=available_projections(),
        help="output-layer method (default: %(default)s)",
    )
    p.add_argument("--clusters", type=Path, metavar="DIR", help="cluster map folder, or a folder of them")
    p.add_argument(
        "--index",
        type=Path,
        metavar="DIR",
        help="lsh, graph, shortlist: the method's offline artifact: its folder (manifest.json), or a methods "
        "root (<DIR>/<method>/all for lsh and graph, <DIR>/shortlist/<src>-<tgt>), or a pipeline work dir "
        "(its methods/ root; built with methods.build). Required for shortlist; without it lsh hashes W "
        "and graph builds its HNSW index in memory at start (graph: tens of seconds)",
    )
    p.add_argument(
        "--candidates",
        type=int,
        metavar="K",
        help="lsh: vocabulary entries per decoder row by Hamming distance; graph: top-K of the graph search; "
        "shortlist: target subwords per source subword, at most what the table holds "
        "(default: lsh 128, graph 10, shortlist all)",
    )
    p.add_argument(
        "--bits",
        type=int,
        metavar="C",
        help="lsh without --index: hash bits, an index fixes them (default: 256)",
    )
    p.add_argument(
        "--ef-search", type=int, metavar="N", help="graph: HNSW search queue, >= K is used (default: 64)"
    )
    p.add_argument(
        "--frequent",
        type=int,
        metavar="N",
        help="shortlist: most frequent target subwords always candidates, at most the table's (default: all)",
    )
    p.add_argument(
        "--scope",
        choices=("sentence", "batch"),
        help="shortlist: each row picks only from its own sentence's candidates (sentence), or from the "
        "batch's union (batch: Marian's and CTranslate2's behaviour) (default: sentence)",
    )
    p.add_argument(
        "--selection",
        default=d.selection,
        choices=["union", "per-row"],
        help="clustered: every row of a batch gets the union of the batch's clusters' columns (union), or "
        "only its own cluster's (per-row) (default: %(default)s)",
    )
    p.add_argument(
        "--probes",
        type=int,
        metavar="N",
        help="clustered, union selection: each row adds the sets of its N nearest clusters to the union, not "
        "only its nearest's (fewer misses for states between clusters, more columns) (default: the map's "
        "own, which its builder chose, maps.probes; 1 for maps that do not record one)",
    )
    add_inactive_mass(
        p,
        d.inactive_mass,
        "clustered: estimate of the probability mass of the columns not computed, so beam scores stay "
        f"comparable (auto: {BEAM_INACTIVE_MASS} for --beam > 1, the fewest search errors measured, from "
        "the normaliser stored in the map; none for greedy, which reads logits only) (default: %(default)s)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="clustered: certify each decoder row (a bound on every column not computed) and give rows "
        "without a certificate the full projection: output identical to --method full; prints the "
        "certified share of rows",
    )
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
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads; on CPU, N batches are decoded at once on one thread each (faster than N threads "
        "on one batch; each batch in flight holds its own decoder cache) (default: torch's)",
    )
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
        default=None,
        metavar="N",
        help="translate N lines at a time; memory holds one chunk, each finished chunk is kept as a part "
        "(in OUTPUT.parts/, or in the dataset folder), and a rerun after a kill resumes there "
        "(default: 10000)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    g = p.add_argument_group("bulk translation on Ray (a text file, a Parquet file, folder or glob)")
    g.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="decode on N Ray actors, each loading the model once and pulling ranges of --chunk-lines lines "
        "from one queue; finished parts are kept and a rerun resumes; 1 without --ray-address: in this "
        "process (default: 1)",
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
    add_mlflow_options(p, "$MLFLOW_TRACKING_URI; neither: the job is not logged", "fastvocab-bulk")


def _check_args(args: argparse.Namespace, parts: bool = False) -> None:
    """Everything that can be refused before the model loads; ``parts``: the parts path (its output is
    checked by pipeline/bulk_driver.py)."""
    for flag in ("beam", "batch_size", "max_len", "max_input_tokens", "chunk_lines"):
        if flag == "chunk_lines" and args.chunk_lines is None:
            continue
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads must be >= 1, got {args.threads}")
    if args.dtype == "int8" and torch_device_type(args.device) != "cpu":
        raise UserError(f"--dtype int8 runs on CPU only (dynamic quantisation), not --device {args.device}")
    if args.src_lang == args.tgt_lang:
        raise UserError(f"--src-lang and --tgt-lang are both {args.src_lang}: nothing to translate")
    if args.method == "clustered" and args.clusters is None:
        raise UserError("--method clustered needs --clusters (a cluster map folder, or a folder of them)")
    if args.exact and args.method != "clustered":
        raise UserError(f"--exact applies to --method clustered, not --method {args.method}")
    for flag, methods in _METHOD_FLAGS.items():
        if getattr(args, flag) is not None and args.method not in methods:
            name = "--" + flag.replace("_", "-")
            raise UserError(f"{name} applies to --method {' or '.join(methods)}, not --method {args.method}")
    for flag in ("candidates", "bits", "ef_search", "frequent", "probes"):
        value = getattr(args, flag)
        if value is not None and value < (0 if flag == "frequent" else 1):
            raise UserError(
                f"--{flag.replace('_', '-')} must be >= {0 if flag == 'frequent' else 1}, got {value}"
            )
    if (args.probes or 1) > 1 and args.selection != "union":
        raise UserError("--probes above 1 needs --selection union (per-row groups rows by their one cluster)")
    if args.method == "shortlist" and args.index is None:
        raise UserError(
            "--method shortlist needs --index (a shortlist table of this model and direction: build it with "
            "fastvocab run, methods.build: [shortlist])"
        )
    if args.output.resolve() == args.input.resolve():
        raise UserError(f"--output {args.output} would overwrite the input")
    if not parts:
        check_output_file(args.output, "--output")
    check_device(args.device, "--device")
    if args.method == "clustered":
        from fastvocab.artifacts_schema.cluster_map import coverage_problem, resolve_map_dir

        # only the manifest is read here; the model and the map's tensors load after every check passed
        map_dir = resolve_map_dir(args.clusters, args.src_lang, args.tgt_lang)
        manifest = check_map_direction(map_dir, args.src_lang, args.tgt_lang)
        # a map not built for this beam still decodes; one line says so, and how to rebuild it
        warning = coverage_problem(manifest, args.beam, map_dir)
        if warning is not None:
            print(f"warning: {warning}", file=sys.stderr)
    if args.method in INDEXED_METHODS and args.index is not None:
        resolve_index(args.index, args.method, f"{args.src_lang}-{args.tgt_lang}")


def resolve_index(path: Path, method: str, direction: str) -> Path:
    """The artifact folder ``--index`` names for ``method`` and ``direction``: the folder itself when it
    holds a manifest, else the pipeline's layout under it (``tasks.methods.index_dir``) or under its
    ``methods/``. Only the manifest is read: another method or direction is an ArtifactError before the
    model loads."""
    from fastvocab.artifacts_schema.method_index import ANY_DIRECTION, MANIFEST_FILE, load_index_manifest
    from fastvocab.tasks.methods import METHODS_DIR, MODEL_WIDE, index_dir

    unit = ANY_DIRECTION if method in MODEL_WIDE else direction
    tried = [path, index_dir(path, method, unit), index_dir(path / METHODS_DIR, method, unit)]
    found = next((p for p in tried if (p / MANIFEST_FILE).is_file()), None)
    if found is None:
        raise UserError(
            f"--index {path}: no {method} artifact there "
            f"(looked for {', '.join(str(p / MANIFEST_FILE) for p in tried)}); "
            f"build one with fastvocab run (methods.build: [{method}])"
        )
    m = load_index_manifest(found)
    if m.method != method:
        raise ArtifactError(
            f"--index {found} is a {m.method} artifact, not a {method} one (--method {method})"
        )
    if m.direction not in (ANY_DIRECTION, direction):
        raise ArtifactError(f"--index {found} is a {method} artifact for {m.direction}, not for {direction}")
    return found


def torch_device_type(device: str) -> str:
    """``cuda`` for ``cuda:0`` etc., without importing torch."""
    return device.split(":", 1)[0]


def _projection_options(args: argparse.Namespace) -> dict[str, object]:
    """The flags as projection options (``tasks.projections.method_options``), the artifact located first."""
    from fastvocab.tasks.projections import method_options

    direction = f"{args.src_lang}-{args.tgt_lang}"
    artifact: Path | None = None
    if args.method == "clustered":
        from fastvocab.artifacts_schema.cluster_map import resolve_map_dir

        artifact = resolve_map_dir(args.clusters, args.src_lang, args.tgt_lang)
    elif args.method in INDEXED_METHODS and args.index is not None:
        artifact = resolve_index(args.index, args.method, direction)
    return method_options(
        args.method,
        direction,
        beam=args.beam,
        artifact=artifact,
        selection=args.selection,
        inactive_mass=args.inactive_mass,
        exact=args.exact,
        probes=args.probes,
        candidates=args.candidates,
        bits=args.bits,
        ef_search=args.ef_search,
        frequent=args.frequent,
        scope=args.scope,
    )


def wants_bulk(args: argparse.Namespace, output: str) -> bool:
    """The parts path (pipeline/bulk_driver.py): several workers, a cluster, a Parquet input (file, folder
    or glob), a dataset output (``output`` as typed: a trailing ``/`` names a folder), or ``--tracking-uri``
    (the job's MLflow run). A text file into a file otherwise stays on the in-process chunked path
    (``tasks.text_chunks``)."""
    from fastvocab.pipeline.bulk_driver import output_layout
    from fastvocab.tasks.bulk import is_parquet_input

    return (
        args.workers != 1
        or args.ray_address is not None
        or args.tracking_uri is not None
        or output_layout(output)[0] == "dataset"
        or is_parquet_input(args.input)
    )


def log_to_mlflow(result: BulkResult, uri: str, experiment: str, run_name: str) -> str:
    """One MLflow run for the job (a parent with the job's child record, as the report reads pipelines)."""
    import tempfile

    from fastvocab.pipeline.tracking import Tracker

    tracker = Tracker(uri, experiment)
    tracker.start(run_name, {"bulk": result.params}, {"fastvocab.kind": "bulk"})
    with tempfile.TemporaryDirectory() as tmp:
        tracker.log_stage(result.record(artifacts_dir=Path(tmp)))
    tracker.end("FINISHED", {"lines": result.lines, "tokens_per_s": result.tokens_per_second})
    return str(tracker.parent_id)


def run_command(args: argparse.Namespace, output: str, options: dict[str, object]) -> int:
    """``fastvocab translate`` on the parts path: the flags as a :class:`BulkRequest`, the job, its summary
    line and its MLflow run. ``options``: the method's projection options, its artifact located."""
    import os

    from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk
    from fastvocab.pipeline.tracking import check_tracking_uri
    from fastvocab.tasks.bulk import PART_LINES
    from fastvocab.tasks.translate import SearchSettings

    uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        check_tracking_uri(uri, "--tracking-uri" if args.tracking_uri else "MLFLOW_TRACKING_URI")
    request = BulkRequest(
        str(args.input),
        output,
        args.model,
        args.src_lang,
        args.tgt_lang,
        method=args.method,
        options=options,
        search=SearchSettings(**{f.name: getattr(args, f.name) for f in fields(SearchSettings)}),
        dtype=args.dtype,
        device=args.device,
        workers=args.workers,
        ray_address=args.ray_address,
        num_cpus_per_worker=args.threads or args.num_cpus_per_worker,
        num_gpus_per_worker=args.num_gpus_per_worker,
        threads=args.threads,
        lines_per_part=args.chunk_lines or PART_LINES,
        text_column=args.input_column,
        id_column=args.id_column,
    )
    result = run_bulk(request, progress=not args.no_progress)
    if args.workers == 1 and args.ray_address is None:
        import torch

        where = f"{plural(torch.get_num_threads(), 'thread')}, in this process"
    else:
        where = (
            f"{plural(request.num_cpus_per_worker, 'thread')} a worker, "
            f"{plural(len(result.workers), 'Ray worker')} used of {args.workers}"
        )
    busy = [w["tokens"] / w["seconds"] for w in result.workers.values() if w["seconds"] > 0]
    per_worker = f" ({sum(busy) / len(busy):.0f} a worker while busy)" if busy else ""
    print(
        f"translated {result.summary()} in {result.seconds:.2f} s, {result.tokens_per_second:.0f} tokens/s"
        f"{per_worker} "
        f"[{args.method}, beam {args.beam}, batch {args.batch_size}, {args.device}, {args.dtype}, {where}] "
        f"-> {output}",
        file=sys.stderr,
    )
    if uri:
        run_id = log_to_mlflow(result, uri, args.experiment_name, f"translate {result.params['direction']}")
        print(f"MLflow run {run_id} in {uri}", file=sys.stderr)
    return 0


def run(args: argparse.Namespace) -> int:
    typed = args.output  # as typed: DIR/ names a dataset folder
    args.output = Path(typed)
    parts = wants_bulk(args, typed)
    _check_args(args, parts)
    if parts:  # Ray workers, a Parquet input, or a dataset output: row-range parts (pipeline/bulk_driver.py)
        return run_command(args, typed, _projection_options(args))
    import torch

    from fastvocab.tasks.inputs import iter_text_lines
    from fastvocab.tasks.projections import INT8_METHODS, make_projection
    from fastvocab.tasks.text_chunks import translate_text_file
    from fastvocab.tasks.translate import SearchSettings

    # A text file into a file, in this process: checked (streamed) first, so bad input fails before the
    # model loads; then streamed in chunks, resumable.
    try:
        n_lines = sum(1 for _ in iter_text_lines(args.input))
    except ValueError as exc:
        raise UserError(str(exc)) from exc

    from transformers.utils import logging as hf_logging

    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    hf_logging.disable_progress_bar()  # the weights-loading bar is noise on a CLI
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    int8 = args.dtype == "int8"
    dtype = torch.float32 if int8 else getattr(torch, args.dtype)
    adapter = Seq2SeqAdapter.load(args.model, device=args.device, dtype=dtype)
    if int8:
        adapter.quantize_int8()
    try:
        adapter.check_language(args.src_lang)
        adapter.check_language(args.tgt_lang)
        options = _projection_options(args)
        if int8 and args.method in INT8_METHODS:
            options["int8"] = True
        projection = make_projection(adapter, args.method, **options)
        # the flags are named as SearchSettings' fields (--beam, --batch-size, ...)
        search = SearchSettings(**{f.name: getattr(args, f.name) for f in fields(SearchSettings)})
        result = translate_text_file(
            adapter,
            projection,
            args.input,
            args.output,
            args.src_lang,
            args.tgt_lang,
            search=search,
            setting=f"{projection.signature()}|dtype:{args.dtype}",
            method=args.method,
            progress=not args.no_progress,
            **({"chunk_lines": args.chunk_lines} if args.chunk_lines is not None else {}),
        )
    except ArtifactError:  # a missing or mismatched map or index: the CLI reports it as it is
        raise
    except ValueError as exc:  # unknown language, bad method options, over-long line
        raise UserError(str(exc)) from exc

    setting = (
        f"[{args.method}, beam {args.beam}, batch {args.batch_size}, {args.device}, {args.dtype}, "
        f"{plural(torch.get_num_threads(), 'thread')}] -> {args.output}"
    )
    if n_lines == 0:
        print(f"translated 0 lines: the input is empty; wrote an empty output {setting}", file=sys.stderr)
        return 0
    print(
        f"translated {plural(n_lines, 'line')} ({result.sentences} non-empty, {result.target_tokens} target "
        f"tokens, {plural(result.empty_outputs, 'empty output')}) in {result.seconds:.2f} s: "
        f"{result.sentences_per_second:.1f} sentences/s, {result.tokens_per_second:.0f} tokens/s {setting}",
        file=sys.stderr,
    )
    stats = projection.stats()
    if stats["active_columns_per_row"] is not None:
        line = f"clustered: {stats['active_columns_per_row']:.0f} active columns per decoder row"
        if stats["certified_fraction"] is not None:
            line += (
                f", {100 * stats['certified_fraction']:.1f}% of rows certified exact "
                "(the others used the full projection)"
            )
        if stats["full_fraction"]:
            line += (
                f", {100 * stats['full_fraction']:.1f}% of rows computed every column "
                "(at their batch's rows the map's union costs more)"
            )
        print(line, file=sys.stderr)
    return 0
