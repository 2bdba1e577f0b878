"""The ``fastvocab`` command. Each subcommand lives in ``pipeline/commands/<name>.py`` and provides
``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``; errors are raised, and this module
is the one place that turns them into a one-line message and an exit code.
"""

from __future__ import annotations

import argparse
import logging
import sys

from fastvocab import __version__
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.commands import (
    bench,
    check_model,
    corpus,
    evaluate,
    experiment,
    report,
    run,
    train_demo,
    translate,
    tune,
)
from fastvocab.pipeline.errors import Interrupted, UserError
from fastvocab.pipeline.extras import MODULES, installed, missing
from fastvocab.pipeline.signals import stop_on_signals

# Subcommand name -> its module. The modules import nothing heavy (torch, Ray, MLflow load inside their
# functions): only the chosen subcommand's arguments are added (build_parser's ``load``), which may.
COMMANDS = {
    "corpus": corpus,
    "train-demo": train_demo,
    "translate": translate,
    "eval": evaluate,
    "run": run,
    "report": report,
    "bench": bench,
    "experiment": experiment,
    "tune": tune,
}

_HELP = {
    "corpus": "build a parallel corpus from Debian's description translations, or from your own files",
    "train-demo": "train the small many-to-many demo model (M2M100 architecture) on the corpus",
    "translate": "translate a text file or Parquet dataset for one direction "
    "(full, clustered, lsh, graph, shortlist), in this process or on N Ray workers",
    "eval": "score hypotheses against references with sacrebleu (BLEU, chrF; signatures printed)",
    "run": "run the pipeline from a config: "
    "corpus -> dump -> kmeans -> maps -> methods -> translate -> evaluate (-> bulk, when configured)",
    "report": "write a self-contained HTML report (tables, embedded figures) of an MLflow run",
    "bench": "benchmarks: fidelity (clustered vs full softmax), methods (every output-layer method)",
    "experiment": "experiments of Amer et al. on your model (tables and figures logged to MLflow)",
    "tune": "choose the clustered map's settings that decode fastest within a search-error budget",
}


def build_parser(load: str | None = "*") -> argparse.ArgumentParser:
    """The argument parser; ``load`` names the one subcommand whose arguments to add ("*": all)."""
    parser = argparse.ArgumentParser(
        prog="fastvocab",
        description="Clustered vocabulary projection for fast multilingual MT decoding (Amer et al. 2022).",
        allow_abbrev=False,  # one spelling an option (pipeline/commands/__init__.py)
    )
    parser.add_argument("--version", action="version", version=f"fastvocab {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module in COMMANDS.items():
        p = sub.add_parser(name, help=_HELP[name], description=_HELP[name], allow_abbrev=False)
        if load in ("*", name):
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


# Third-party loggers that report at INFO what only a debugging user wants (faiss: which SIMD build it
# loaded, six lines opening every run that imports it); at WARNING unless -v.
QUIET_LOGGERS = ("faiss", "faiss.loader")


def configure_logging(verbose: bool) -> None:
    """Log records on standard error: DEBUG with ``verbose``, else INFO with :data:`QUIET_LOGGERS` at
    WARNING."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.NOTSET if verbose else logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # Only the chosen subcommand's arguments: adding them may import torch (the methods' options).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    args = build_parser(load=chosen).parse_args(argv)
    configure_logging(args.verbose)
    try:
        # SIGTERM (timeout, Slurm, Kubernetes) stops every command as SIGINT does: Ray's actors stopped,
        # locks released, finished work kept, exit 143 (pipeline/signals.py)
        with stop_on_signals():
            check_model(args)
            return int(args._module.run(args) or 0)
    except (UserError, ArtifactError, FileNotFoundError, UnicodeDecodeError) as exc:
        print(f"fastvocab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        # a module of the pipeline extra that a command imported without checking first (pipeline/extras.py)
        top = (exc.name or "").partition(".")[0]
        if top not in MODULES or installed(top):
            raise
        print(f"fastvocab {args.command}: error: {missing([top])}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"fastvocab {args.command}: {exc}; rerun the same command to resume", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"fastvocab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
