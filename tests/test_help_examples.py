"""Every subcommand's --help ends with examples (pipeline/commands add_examples) that run as written after
`make demo`: each parses with the real command line, so a renamed or removed option fails here, and the quick
ones (a line from standard input, a text file, eval) run on the demo model."""

from __future__ import annotations

import argparse

import pytest

from fastvocab.pipeline.cli import build_parser
from tests.test_cli_vocabulary import _parsers
from tests.test_readme_commands import SOURCE, command_lines, parse_line, run_as_written

QUICK = (
    'echo "Free software for everyone." | fastvocab translate --src-lang en --tgt-lang it',
    "fastvocab translate --src-lang en --tgt-lang it -i input.txt -o output.txt",
    "fastvocab eval --hyp output.txt --ref reference.txt --tgt-lang it",
)


def examples() -> dict[str, list[str]]:
    """Each subcommand ("fastvocab bench fidelity") and the command lines of its epilog."""
    out = {}
    for name, parser in _parsers(build_parser()):
        if name == "fastvocab":
            continue
        epilog = parser.epilog or ""
        assert epilog.startswith("examples:\n"), f"{name} --help has no examples"
        out[name] = command_lines(epilog.removeprefix("examples:\n"))
    return out


def test_every_subcommand_shows_one_to_four_examples_of_itself():
    found = examples()
    assert {"fastvocab run", "fastvocab tune", "fastvocab bench scope", "fastvocab experiment paper"} <= set(
        found
    )
    for name, lines in found.items():
        assert 1 <= len(lines) <= 4, (name, lines)
        assert any(line.split(" | ")[-1].startswith(name) for line in lines), (name, lines)


def test_the_help_prints_the_examples_as_written(capsys):
    with pytest.raises(SystemExit):
        build_parser("bench").parse_args(["bench", "fidelity", "--help"])
    text = capsys.readouterr().out
    assert "\nexamples:\n  fastvocab bench fidelity --directions en-it --sentences 50\n" in text


@pytest.mark.parametrize("name", sorted(examples()))
def test_every_example_parses_with_the_real_command_line(name):
    for line in examples()[name]:
        args = parse_line(line)
        assert isinstance(args, argparse.Namespace), line


def test_a_renamed_option_is_caught():
    with pytest.raises(AssertionError, match="does not parse"):
        parse_line("fastvocab tune --src-lang en --tgt-lang it --budgets 5%")


def test_the_quick_examples_run_as_written(tmp_path):
    every = {line for lines in examples().values() for line in lines}
    assert set(QUICK) <= every, sorted(every)
    outputs = run_as_written(list(QUICK), tmp_path)
    assert outputs[QUICK[0]].strip()  # the line from standard input, on standard output
    translated = (tmp_path / "output.txt").read_text().splitlines()
    assert len(translated) == len(SOURCE) and all(translated)
    assert "BLEU" in outputs[QUICK[2]]
