"""``fastvocab translate``: bulk translation of a text file or Parquet dataset for one direction.

Input: UTF-8 text (one sentence a line) or Parquet (a file or a dataset folder; column ``source``, optional
``id``). Output: Parquet with the translations schema when it ends in ``.parquet``, else text with one line
per input line. The output is written atomically at the end: on any error no output file is left behind.
"""

from __future__ import annotations

import argparse
import logging
import sys
from dataclasses import asdict, fields
from pathlib import Path

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.checks import check_device, check_map_direction, check_output_file
from fastvocab.pipeline.config import TranslateConfig
from fastvocab.pipeline.errors import UserError

HELP = "translate a text file or Parquet dataset for one direction (full or clustered projection)"

log = logging.getLogger(__name__)

_DTYPES = ("float32", "float16", "bfloat16", "int8")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fastvocab.kernels import available_projections

    d = TranslateConfig()
    p.add_argument(
        "--model", type=Path, default=Path("models/demo"), help="model folder (default models/demo)"
    )
    p.add_argument("--src-lang", required=True, metavar="XX", help="source language code, e.g. en")
    p.add_argument("--tgt-lang", required=True, metavar="YY", help="target language code, e.g. it")
    p.add_argument("-i", "--input", required=True, type=Path, metavar="FILE", help="text file, or Parquet")
    p.add_argument(
        "-o", "--output", required=True, type=Path, metavar="FILE", help="output: .parquet, else text"
    )
    p.add_argument("--beam", type=int, default=d.beam, help=f"beam size; 1 = greedy (default {d.beam})")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help=f"sentences a batch ({d.batch_size})")
    p.add_argument("--max-len", type=int, default=d.max_len, help=f"max target tokens ({d.max_len})")
    p.add_argument(
        "--max-input-tokens",
        type=int,
        default=d.max_input_tokens,
        help=f"longer source lines are an error, never cut ({d.max_input_tokens})",
    )
    p.add_argument("--length-penalty", type=float, default=d.length_penalty, help="beam length penalty")
    p.add_argument(
        "--method", default="full", choices=available_projections(), help="output-layer method (full)"
    )
    p.add_argument("--clusters", type=Path, metavar="DIR", help="cluster map folder, or a folder of them")
    p.add_argument(
        "--selection",
        default=d.selection,
        choices=["union", "per-row"],
        help="clustered: every row of a batch gets the union of the batch's clusters' columns (union), or "
        f"only its own cluster's (per-row) (default {d.selection})",
    )
    p.add_argument(
        "--inactive-mass",
        default="auto",
        choices=["auto", "none", "centroid", "moments"],
        help="clustered: estimate of the probability mass of the columns not computed, so beam scores stay "
        "comparable (auto: moments for --beam > 1, the fewest search errors measured; none for greedy)",
    )
    p.add_argument(
        "--exact",
        action="store_true",
        help="clustered: certify each decoder row (a bound on every column not computed) and give rows "
        "without a certificate the full projection: output identical to --method full; prints the "
        "certified share of rows",
    )
    p.add_argument("--device", default=d.device, help="torch device, e.g. cpu or cuda:0 (default cpu)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=_DTYPES,
        help="model dtype (default float32); int8: CPU dynamic quantisation of the encoder and decoder "
        "linear layers and of the full projection (outputs may differ from float32 on a few %% of lines)",
    )
    p.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="CPU threads for torch (torch.set_num_threads; torch's default)",
    )
    p.add_argument("--input-column", default="source", help="Parquet input: text column (default source)")
    p.add_argument("--id-column", default="id", help="Parquet input: id column, used when present (id)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check_args(args: argparse.Namespace) -> None:
    for flag in ("beam", "batch_size", "max_len", "max_input_tokens"):
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
    if args.output.resolve() == args.input.resolve():
        raise UserError(f"--output {args.output} would overwrite the input")
    check_output_file(args.output, "--output")
    check_device(args.device, "--device")
    if args.method == "clustered":
        from fastvocab.artifacts_schema.cluster_map import resolve_map_dir

        # only the manifest is read here; the model and the map's tensors load after every check passed
        check_map_direction(
            resolve_map_dir(args.clusters, args.src_lang, args.tgt_lang), args.src_lang, args.tgt_lang
        )


def torch_device_type(device: str) -> str:
    """``cuda`` for ``cuda:0`` etc., without importing torch."""
    return device.split(":", 1)[0]


def _projection_options(args: argparse.Namespace) -> dict[str, object]:
    if args.method != "clustered":
        return {}
    from fastvocab.artifacts_schema.cluster_map import resolve_map_dir

    map_dir = resolve_map_dir(args.clusters, args.src_lang, args.tgt_lang)
    mass = args.inactive_mass
    if mass == "auto":
        mass = "moments" if args.beam > 1 else "none"
    options: dict[str, object] = {"cluster_map": map_dir, "selection": args.selection, "inactive_mass": mass}
    if args.exact:  # greedy needs the top-1 certified; beam search the 2 x beam candidates it keeps per row
        options["exact_k"] = 1 if args.beam == 1 else 2 * args.beam
    return options


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    import torch

    from fastvocab.artifacts_schema.translations import write_translations
    from fastvocab.tasks.translate import (
        SearchSettings,
        is_parquet,
        make_projection,
        read_parquet_column,
        read_text_lines,
        translate,
    )

    # Read the input first: bad input fails in a second, before the model loads.
    ids = None
    try:
        if is_parquet(args.input):
            lines, ids = read_parquet_column(args.input, args.input_column, args.id_column)
        else:
            lines = read_text_lines(args.input)
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
        projection = make_projection(adapter, args.method, **_projection_options(args))
        if int8:
            from fastvocab.decoding.int8 import quantize_projection

            projection = quantize_projection(projection)
        # the flags are named as SearchSettings' fields (--beam, --batch-size, ...)
        search = SearchSettings(**{f.name: getattr(args, f.name) for f in fields(SearchSettings)})
        result = translate(
            adapter,
            projection,
            lines,
            args.src_lang,
            args.tgt_lang,
            **asdict(search),
            progress=not args.no_progress,
        )
    except ArtifactError:  # a missing or mismatched cluster map: the CLI reports it as it is
        raise
    except ValueError as exc:  # unknown language, bad method options, over-long line
        raise UserError(str(exc)) from exc

    write_translations(
        args.output,
        result.hypotheses,
        sources=lines,
        ids=ids,
        direction=f"{args.src_lang}-{args.tgt_lang}",
        method=args.method,
    )
    print(
        f"translated {len(lines)} lines ({result.sentences} non-empty, {result.target_tokens} target tokens) "
        f"in {result.seconds:.2f} s: {result.sentences_per_second:.1f} sentences/s, "
        f"{result.tokens_per_second:.0f} tokens/s [{args.method}, beam {args.beam}, batch {args.batch_size}, "
        f"{args.device}] -> {args.output}",
        file=sys.stderr,
    )
    counters = getattr(projection, "counters", None)
    if counters and counters.get("rows"):
        line = f"clustered: {counters['columns'] / counters['rows']:.0f} active columns per decoder row"
        if getattr(projection, "certified_fraction", None) is not None:
            line += (
                f", {100 * projection.certified_fraction:.1f}% of rows certified exact "
                "(the others used the full projection)"
            )
        print(line, file=sys.stderr)
    return 0
