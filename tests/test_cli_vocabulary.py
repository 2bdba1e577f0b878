"""One CLI vocabulary across the ``fastvocab`` subcommands: defaults shown as ``(default: X)``, counts with a
metavar, the same flag names for the output and the MLflow store, and no other spelling of them (no earlier
names, no prefixes)."""

from __future__ import annotations

import argparse

import pytest

from fastvocab.pipeline.cli import build_parser

# options that take no value: their "default" is the flag being absent
_FLAG_ACTIONS = (
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
    argparse._HelpAction,
    argparse._VersionAction,
)


def _parsers(parser: argparse.ArgumentParser, name: str = "fastvocab"):
    """Every parser and subparser, with its command words."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from _parsers(sub, f"{name} {sub_name}")


def _options():
    for name, parser in _parsers(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.help != argparse.SUPPRESS:
                yield name, action


def test_every_default_is_shown_one_way_and_every_count_has_a_metavar():
    unshown, no_metavar = [], []
    for name, action in _options():
        if isinstance(action, _FLAG_ACTIONS):
            continue
        text = (action.help or "") % {"default": action.default}
        if action.default not in (None, []) and "(default: " not in text:  # []: a repeatable option
            unshown.append(f"{name} {action.option_strings[-1]}")
        if action.type in (int, float) and action.metavar is None:
            no_metavar.append(f"{name} {action.option_strings[-1]}")
    assert not unshown, f"options whose default the help does not show as (default: X): {unshown}"
    assert not no_metavar, f"numeric options without a metavar: {no_metavar}"


def test_the_output_and_the_mlflow_store_have_one_name_each():
    flags: dict[str, set[str]] = {}
    for name, action in _options():
        flags.setdefault(name, set()).update(action.option_strings)
    for name, names in flags.items():
        assert "--out" not in names and "--mlflow" not in names and "--experiment" not in names, name
        assert "--quick" not in names or name == "fastvocab experiment paper", name  # a preset there


@pytest.mark.parametrize(
    "argv",
    [
        ["corpus", "--out", "c"],
        ["train-demo", "--out", "m"],
        ["report", "latest", "--out", "r.html"],
        ["translate", "--src-lang", "en", "--tgt-lang", "it", "-i", "s.txt", "-o", "t.txt", "--out", "u.txt"],
        ["bench", "methods", "--out", "x.json"],
        ["bench", "methods", "--mlflow", "sqlite:///x.db"],
        ["bench", "methods", "--experiment", "e"],
        ["tune", "--mlflow", "sqlite:///x.db"],
        ["experiment", "paper", "--out", "p"],
        ["run", "c.yaml", "--stage", "dump"],  # a prefix of --stages
    ],
)
def test_earlier_spellings_and_prefixes_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser(argv[0]).parse_args(argv)
    assert exc.value.code == 2
    assert f"unrecognized arguments: {argv[-2]}" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["bench", "methods", "--quick"], ["tune", "--quick"]])
def test_quick_still_names_the_default_grid(argv):
    assert build_parser(argv[0]).parse_args(argv).grid == "quick"


def test_one_name_for_the_direction_the_maps_and_mlflow_in_every_command():
    flags: dict[str, set[str]] = {}
    for name, action in _options():
        flags.setdefault(name, set()).update(action.option_strings)
    for name, names in flags.items():
        assert "--direction" not in names and "--maps" not in names, name  # --src-lang/--tgt-lang, --clusters
        if "--tracking-uri" in names and name != "fastvocab report":  # report reads a run: MLflow or nothing
            assert "--no-mlflow" in names, f"{name}: MLflow without --no-mlflow"
    assert {"--src-lang", "--tgt-lang"} <= flags["fastvocab tune"]
    assert (
        "--clusters" in flags["fastvocab bench fidelity"] and "--clusters" in flags["fastvocab bench methods"]
    )
    assert "--no-mlflow" in flags["fastvocab translate"]


@pytest.mark.parametrize(
    ("argv", "old", "new", "want"),
    [
        (
            ["tune", "--direction", "de-en"],
            "--direction",
            "--src-lang and --tgt-lang",
            {"src_lang": "de", "tgt_lang": "en"},
        ),
        (["bench", "fidelity", "--maps", "m"], "--maps", "--clusters", {"maps": "m"}),
        (["bench", "methods", "--maps", "m"], "--maps", "--clusters", {"maps": "m"}),
        (["experiment", "paper", "--maps", "m"], "--maps", "--clusters", {"maps": "m"}),
    ],
)
def test_an_earlier_name_still_works_one_release_with_a_warning(argv, old, new, want, capsys):
    args = build_parser(argv[0]).parse_args(argv)
    assert {k: str(getattr(args, k)) for k in want} == want
    (line,) = capsys.readouterr().err.splitlines()
    assert f"warning: {old} is deprecated" in line and f"use {new}" in line


def test_a_malformed_earlier_direction_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser("tune").parse_args(["tune", "--direction", "enit"])
    assert exc.value.code == 2 and "--direction takes SRC-TGT" in capsys.readouterr().err


def test_without_an_earlier_name_nothing_is_warned(capsys):
    args = build_parser("tune").parse_args(["tune", "--src-lang", "fr", "--tgt-lang", "en"])
    assert (args.src_lang, args.tgt_lang) == ("fr", "en") and capsys.readouterr().err == ""
