"""One module per ``fastvocab`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``; here the
argument helpers several of them share."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastvocab.pipeline.errors import UserError

if TYPE_CHECKING:
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.pipeline.tracking import Store

# The CLI's vocabulary, the same in every subcommand: an option with a default says it as "(default: X)",
# a count's metavar is N, the output is -o/--output, the MLflow store --tracking-uri and its experiment
# --experiment-name. Every parser is built with allow_abbrev=False: argparse would otherwise take any unique
# prefix (--out for --output) as the option, and each such prefix becomes a spelling that has to keep working.


def add_output(
    p: argparse.ArgumentParser, help: str, *, metavar: str = "FILE", default: Path | None = None
) -> None:
    """``-o/--output`` (``args.output``, a Path)."""
    p.add_argument("-o", "--output", type=Path, default=default, metavar=metavar, help=help)


def add_subcommand(
    sub: argparse._SubParsersAction, name: str, help: str, description: str
) -> argparse.ArgumentParser:
    """Subcommand ``name`` of ``sub`` (``bench fidelity``, ``experiment paper``): ``help`` in its parent's
    list, ``description`` printed by its --help as written (its line breaks kept)."""
    return sub.add_parser(
        name, help=help, description=description, formatter_class=HelpFormatter, allow_abbrev=False
    )


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """A description or epilog written on several lines is printed as written (a table, the examples); one
    written on one line is wrapped to the terminal, as argparse does by default."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" not in text.strip():
            return argparse.HelpFormatter._fill_text(self, text, width, indent)
        return super()._fill_text(text, width, indent)


def add_examples(p: argparse.ArgumentParser, examples: str) -> None:
    """``examples`` ("examples:", then one command line an indented line; a trailing ``\\`` continues it)
    as the epilog of ``p``'s --help. Each runs as written after `make demo`, from the project root;
    tests/test_help_examples.py parses every one with the real parser."""
    p.epilog = examples
    p.formatter_class = HelpFormatter


def add_count(p: argparse.ArgumentParser, flag: str, help: str, default: int | None = None) -> None:
    """An integer option ``flag N`` (``help`` says its default)."""
    p.add_argument(flag, type=int, default=default, metavar="N", help=help)


DEMO_MODEL = Path("models/demo")
# Why an installed package has no default model: the demo model is not package data (~28 MB of weights in
# a wheel of 0.5 MB, installed on every Ray node and GPU image that translates with its own model), so it
# is found in the source checkout only.
NO_DEMO_MODEL = (
    "--model is required: this install of fastvocab has no demo model (it is models/demo of the source "
    "checkout); pass --model DIR, a Hugging Face model folder such as CHECKOUT/models/demo"
)


def source_checkout() -> Path | None:
    """The source checkout fastvocab runs from, or None (installed from a wheel).

    Installed in editable mode (``make setup``: strict, this file a link into the checkout; or the default
    mode, this file in the checkout itself), the room ``pipeline/`` is a folder of the checkout, beside
    ``pyproject.toml``; in a wheel's install this file is ``site-packages/fastvocab/pipeline/...``.
    """
    root = Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "fastvocab").is_dir() else None


def default_model() -> Path | None:
    """``models/demo`` of the current folder, else the demo model of the source checkout fastvocab runs
    from (so a command works from any folder), else None: an installed package ships no demo model, and
    ``--model`` is then required (:func:`check_model`)."""
    if DEMO_MODEL.is_dir():
        return DEMO_MODEL
    checkout = source_checkout()
    if checkout is not None and (checkout / DEMO_MODEL).is_dir():
        return checkout / DEMO_MODEL
    return None


def add_model(p: argparse.ArgumentParser) -> None:
    """``--model DIR``, the model folder (default: the demo model, :func:`default_model`; none where it is
    not found, and then the option is required)."""
    default = default_model()
    said = "(default: %(default)s, the demo model)" if default else "(required: no demo model installed)"
    p.add_argument(
        "--model", type=Path, default=default, metavar="DIR", help=f"a local Hugging Face model folder {said}"
    )


def check_model(args: argparse.Namespace) -> None:
    """A command with ``--model`` (:func:`add_model`) run without it where there is no demo model: one
    line (argparse's ``required`` would print the command's whole usage first)."""
    if "model" in vars(args) and args.model is None:
        raise UserError(NO_DEMO_MODEL)


def add_corpus(p: argparse.ArgumentParser, help: str = "corpus folder (default: %(default)s)") -> None:
    """``--corpus DIR``, the corpus folder (default: data/corpus)."""
    p.add_argument("--corpus", type=Path, default=Path("data/corpus"), metavar="DIR", help=help)


def add_beam(p: argparse.ArgumentParser, default: int) -> None:
    """``--beam N``, the beam size (1: greedy)."""
    add_count(p, "--beam", "beam size; 1 = greedy (default: %(default)s)", default)


def add_batch_size(p: argparse.ArgumentParser, default: int) -> None:
    """``--batch-size N``, sentences a batch."""
    add_count(p, "--batch-size", "sentences a batch (default: %(default)s)", default)


def add_max_len(p: argparse.ArgumentParser, default: int) -> None:
    """``--max-len N``, the most target tokens a sentence."""
    add_count(p, "--max-len", "max target tokens (default: %(default)s)", default)


def add_length_penalty(p: argparse.ArgumentParser, default: float) -> None:
    """``--length-penalty P``, beam search's length penalty."""
    p.add_argument(
        "--length-penalty",
        type=float,
        default=default,
        metavar="P",
        help="beam length penalty (default: %(default)s)",
    )


def add_inactive_mass(p: argparse.ArgumentParser, default: str, help: str) -> None:
    """``--inactive-mass``: auto or one of the clustered method's estimates (``kernels.clustered``)."""
    from fastvocab.kernels.clustered_parts import INACTIVE_MASS

    p.add_argument("--inactive-mass", default=default, choices=("auto", *INACTIVE_MASS), help=help)


def add_grid_alias(p: argparse.ArgumentParser) -> None:
    """``--quick``, hidden: ``--grid quick``, which is the default, kept so earlier command lines parse."""
    p.add_argument(
        "--quick",
        dest="grid",
        action="store_const",
        const="quick",
        default=argparse.SUPPRESS,
        help=argparse.SUPPRESS,
    )


# What follows --tracking-uri in the MLflow store's one precedence (pipeline/tracking.py resolve_store), as
# every --help says it; the command's default store comes last.
STORE_DEFAULT = "$MLFLOW_TRACKING_URI, else"


def add_mlflow_options(
    p: argparse.ArgumentParser,
    store: str,
    experiment: str | None,
    no_mlflow: str = "log nothing to MLflow, whatever --tracking-uri or $MLFLOW_TRACKING_URI say",
) -> None:
    """``--tracking-uri URI`` (``store`` names the default store), ``--experiment-name NAME`` (default
    ``experiment``; None: the config's, and --tracking-uri sets the config's store) and ``--no-mlflow``
    (``no_mlflow``: its help), the same three wherever MLflow is used, with the store's precedence in the
    help."""
    # experiment None: the command reads a config, whose mlflow_tracking_uri --tracking-uri sets
    config = "the config's mlflow_tracking_uri, else " if experiment is None else ""
    p.add_argument("--no-mlflow", action="store_true", help=no_mlflow)
    p.add_argument(
        "--tracking-uri",
        metavar="URI",
        help="MLflow store: sqlite:///FILE, http(s)://HOST:PORT, file:DIR "
        f"(default: {config}{STORE_DEFAULT} {store})",
    )
    p.add_argument(
        "--experiment-name",
        default=experiment,
        metavar="NAME",
        help="MLflow experiment "
        + ("(default: %(default)s)" if experiment else "(default: the config's mlflow_experiment)"),
    )


def mlflow_store(
    args: argparse.Namespace, work_dir: Path | None = None, *, by_default: bool = True
) -> Store | None:
    """Where a command logs to MLflow (pipeline/tracking.py :func:`resolve_store`, ``work_dir``'s default
    store): None with --no-mlflow, and, for a command that logs only when asked (``by_default`` False),
    when neither --tracking-uri nor $MLFLOW_TRACKING_URI names a store. Imports no MLflow; refuses a store
    where MLflow (or matplotlib, for the figures a run logs) is not installed (pipeline/extras.py)."""
    from fastvocab.pipeline.extras import require
    from fastvocab.pipeline.tracking import resolve_store

    if args.no_mlflow:
        return None
    store = resolve_store(args.tracking_uri, work_dir)
    if store.is_default and not by_default:
        return None
    require(f"logging to MLflow ({store.source})", "mlflow", "matplotlib", instead="or --no-mlflow")
    return store


class _Deprecated(argparse.Action):
    """An earlier spelling of an option: parsed as the new one (``convert`` turns its value into the new
    options' values), with a one-line warning on standard error. Hidden from --help."""

    def __init__(self, option_strings, dest, *, new: str, convert=None, **kwargs) -> None:
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)
        self.new, self.convert = new, convert

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        import sys

        print(
            f"{parser.prog}: warning: {option_string} is deprecated and will be removed in the next release; "
            f"use {self.new}",
            file=sys.stderr,
        )
        if self.convert is None:
            setattr(namespace, self.dest, values)
            return
        try:
            converted = self.convert(values)
        except argparse.ArgumentTypeError as exc:
            parser.error(str(exc))
        for dest, value in converted.items():
            setattr(namespace, dest, value)


def add_deprecated(
    p: argparse.ArgumentParser, old: str, new: str, dest: str, convert=None, **kwargs: Any
) -> None:
    """``old``, kept one release: stores into ``dest`` as ``new`` does (or ``convert(value)``: a dict of
    destinations and values), warning once on standard error that ``new`` replaces it."""
    p.add_argument(
        old, dest=dest, action=_Deprecated, new=new, convert=convert, default=argparse.SUPPRESS, **kwargs
    )


def split_direction(text: str, flag: str = "--direction") -> dict[str, str]:
    """``"en-it"`` -> ``{"src_lang": "en", "tgt_lang": "it"}`` (the --src-lang/--tgt-lang destinations)."""
    src, sep, tgt = text.partition("-")
    if not (src and sep and tgt):
        raise argparse.ArgumentTypeError(f"{flag} takes SRC-TGT, e.g. en-it, got {text!r}")
    return {"src_lang": src, "tgt_lang": tgt}


def load_model(args: argparse.Namespace) -> tuple[Seq2SeqAdapter, tuple[float, float, float], float]:
    """What a measuring command does before it decodes: --threads set (when given), the load average and
    the start time noted, then ``--model`` loaded on ``--device``. Returns (adapter, load average, start)."""
    import os
    import time

    import torch

    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    return Seq2SeqAdapter.load(args.model, device=args.device), load_before, t0


def int_list(text: str | None, flag: str) -> tuple[int, ...] | None:
    """``"1,2,4"`` -> ``(1, 2, 4)``; None when the option was not given; a one-line error naming ``flag``."""
    if text is None:
        return None
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError as exc:
        raise UserError(f"{flag} takes comma-separated integers, got {text!r}") from exc


def command_line(args: argparse.Namespace, *words: str, skip: tuple[str, ...] = ()) -> str:
    """``fastvocab WORDS`` with every option given spelled out, so a results record says how to rerun it."""
    skipped = {"command", "verbose", "_module", *skip}
    parts = ["fastvocab", *words]
    for key, value in sorted(vars(args).items()):
        if key in skipped or value is None or value is False:
            continue
        parts += [f"--{key.replace('_', '-')}"] + ([] if value is True else [str(value)])
    return " ".join(parts)
