"""One module per ``fastvocab`` subcommand: ``add_arguments(parser)`` and ``run(args) -> int``; here the
argument helpers several of them share."""

from __future__ import annotations

import argparse

from fastvocab.pipeline.errors import UserError


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
