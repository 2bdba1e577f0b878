"""One module per ``fastvocab`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``; here the
argument helpers several of them share."""

from __future__ import annotations

import argparse
from pathlib import Path

from fastvocab.pipeline.errors import UserError

# The CLI's vocabulary, the same in every subcommand: an option with a default says it as "(default: X)",
# a count's metavar is N, the output is -o/--output, the MLflow store --tracking-uri and its experiment
# --experiment-name. Earlier spellings (--out, --mlflow, --experiment) still parse, hidden from --help.


def add_output(
    p: argparse.ArgumentParser, help: str, *, metavar: str = "FILE", default: Path | None = None
) -> None:
    """``-o/--output`` (``args.output``, a Path), and its earlier spelling ``--out``, hidden."""
    p.add_argument("-o", "--output", type=Path, default=default, metavar=metavar, help=help)
    p.add_argument("--out", dest="output", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)


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


def add_mlflow_options(p: argparse.ArgumentParser, store: str, experiment: str) -> None:
    """``--tracking-uri URI`` (``store`` says what it defaults to) and ``--experiment-name NAME`` (default
    ``experiment``), and their earlier spellings ``--mlflow`` and ``--experiment``, hidden."""
    p.add_argument(
        "--tracking-uri",
        metavar="URI",
        help=f"MLflow store: sqlite:///FILE, http(s)://HOST:PORT, file:DIR (default: {store})",
    )
    p.add_argument("--mlflow", dest="tracking_uri", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument(
        "--experiment-name",
        default=experiment,
        metavar="NAME",
        help="MLflow experiment (default: %(default)s)",
    )
    p.add_argument("--experiment", dest="experiment_name", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


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
