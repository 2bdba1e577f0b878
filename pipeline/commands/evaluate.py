"""``fastvocab eval``: BLEU and chrF (sacrebleu, signatures printed) of hypotheses against references.

Each of ``--hyp``, ``--ref`` and ``--baseline`` is a UTF-8 text file (one sentence a line) or Parquet (a
``hypothesis`` column for outputs of ``fastvocab translate``; ``--ref-column`` for references). With
``--baseline`` (the full-softmax output of the same model and settings) the search error rate is reported too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastvocab.pipeline.errors import UserError

HELP = "score hypotheses against references with sacrebleu (BLEU, chrF; signatures printed)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hyp", required=True, type=Path, metavar="FILE", help="hypotheses: text or Parquet")
    p.add_argument("--ref", required=True, type=Path, metavar="FILE", help="references: text or Parquet")
    p.add_argument("--tgt-lang", metavar="YY", help="target language (sacrebleu picks zh/ja/ko tokenizers)")
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="full-softmax output of the same model and settings: also report the search error rate",
    )
    p.add_argument(
        "--hyp-column",
        default="hypothesis",
        metavar="NAME",
        help="Parquet column of hypotheses (default: %(default)s)",
    )
    p.add_argument(
        "--ref-column",
        default="reference",
        metavar="NAME",
        help="Parquet column of references (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _read(path: Path, column: str) -> list[str]:
    from fastvocab.tasks.inputs import is_parquet, read_parquet_column, read_text_lines

    if is_parquet(path):
        return read_parquet_column(path, column)[0]
    return read_text_lines(path)


def run(args: argparse.Namespace) -> int:
    from fastvocab.tasks.evaluate import score, search_error_rate

    try:
        hyps = _read(args.hyp, args.hyp_column)
        refs = _read(args.ref, args.ref_column)
        if len(hyps) != len(refs):
            raise UserError(f"{args.hyp} has {len(hyps)} lines but {args.ref} has {len(refs)}")
        result = score(hyps, refs, tgt_lang=args.tgt_lang)
        if args.baseline is not None:
            base = _read(args.baseline, args.hyp_column)
            if len(base) != len(hyps):
                raise UserError(f"{args.hyp} has {len(hyps)} lines but {args.baseline} has {len(base)}")
            result["search_error_rate"] = search_error_rate(hyps, base)
    except UserError:
        raise
    except ValueError as exc:
        raise UserError(str(exc)) from exc

    if args.json:
        print(json.dumps(result, sort_keys=True))
        return 0
    print(f"BLEU = {result['bleu']:.2f}  {result['signatures']['bleu']}")
    print(f"chrF = {result['chrf']:.2f}  {result['signatures']['chrf']}")
    if "search_error_rate" in result:
        print(f"search errors = {100 * result['search_error_rate']:.1f}% of {result['sentences']} sentences")
    return 0
