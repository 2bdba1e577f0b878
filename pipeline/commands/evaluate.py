"""``fastvocab eval``: BLEU and chrF (sacrebleu, signatures printed) of hypotheses against references.

Each of ``--hyp``, ``--ref`` and ``--baseline`` is a UTF-8 text file (one sentence a line) or Parquet: a file,
or a dataset folder such as ``fastvocab translate -o DIR/`` writes (its parts in order). Hypotheses are read
from the ``translation`` column that translate writes (or ``hypothesis``, its earlier name; ``--hyp-column``
names another), references from ``--ref-column``. With
``--baseline`` (the full-softmax output of the same model and settings) the search error rate is reported too.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from fastvocab.pipeline.commands import add_examples
from fastvocab.pipeline.errors import UserError

HELP = "score hypotheses against references with sacrebleu (BLEU, chrF; signatures printed)"

EXAMPLES = """\
examples:
  fastvocab translate --src-lang en --tgt-lang it -i input.txt -o output.txt
  fastvocab eval --hyp output.txt --ref reference.txt --tgt-lang it
  fastvocab eval --hyp out/ --ref data/corpus/en-it/test.parquet --ref-column text2 --tgt-lang it
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_examples(p, EXAMPLES)
    p.add_argument(
        "--hyp",
        required=True,
        type=Path,
        metavar="FILE",
        help="hypotheses: text, Parquet, or a dataset folder (fastvocab translate -o DIR/)",
    )
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
        default=None,
        metavar="NAME",
        help="Parquet column of hypotheses (default: translation, what fastvocab translate writes, else "
        "hypothesis)",
    )
    p.add_argument(
        "--ref-column",
        default="reference",
        metavar="NAME",
        help="Parquet column of references (default: %(default)s)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def _read(path: Path, column: str | None) -> list[str]:
    """The lines of a text file, or a Parquet file's or dataset folder's ``column`` (None: the translations'
    column, under either of its names)."""
    from fastvocab.artifacts_schema.translations import TRANSLATION_COLUMNS, translation_column
    from fastvocab.tasks.inputs import is_parquet, parquet_names, read_parquet_column, read_text_lines

    if is_parquet(path):
        if column is None:
            column = translation_column(parquet_names(path)) or TRANSLATION_COLUMNS[0]
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
