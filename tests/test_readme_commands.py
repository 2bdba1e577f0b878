"""The README's "Using it" lines run as written: every line parses with the real command line, and the quick
ones (a line from standard input, a file with the shipped maps, eval) run on the demo model. The long ones
(the corpus fetch, training, the pipeline, the paper's experiment, tune) run in tests/release_check.sh."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fastvocab.pipeline.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
QUICK = (
    "echo 'Free software.' | fastvocab translate",
    "-i input.txt -o output.txt",
    "--clusters models/demo-maps",
    "fastvocab eval",
)


def command_lines(block: str) -> list[str]:
    """The fastvocab command lines of a shell block: continuation lines joined, comments dropped."""
    joined = block.replace("\\\n", " ")
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if "fastvocab" in line]


def using_it() -> list[str]:
    """The README's "Using it" commands."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Using it\n\n```bash\n(.*?)```", text, re.S)
    assert block, "README.md has a 'Using it' code block"
    return command_lines(block.group(1))


def parse_line(line: str) -> argparse.Namespace | None:
    """``line`` (after a ``... |``) parsed by the real command line, as the shell would split it; None for
    ``fastvocab --help``. An option the parser does not know fails the test with the line."""
    argv = shlex.split(line.split(" | ", 1)[-1])
    assert argv[0] == "fastvocab", line
    if argv[1:] == ["--help"]:
        return None
    try:
        args = build_parser(load=argv[1]).parse_args(argv[1:])
    except SystemExit as exc:
        raise AssertionError(f"does not parse: {line}") from exc
    assert args.command == argv[1], line
    return args


SOURCE = ["Free software for everyone.", "The package provides a library."]


def run_as_written(lines: list[str], folder: Path) -> dict[str, str]:
    """Run each line in ``folder`` as a user would from the project root after `make demo`: the venv's bin
    first on the path, ``models/`` there, and the files the lines read (input.txt and in.txt: two English
    lines; reference.txt: their Italian). Returns each line's standard output."""
    (folder / "models").symlink_to(ROOT / "models")
    for name in ("input.txt", "in.txt"):
        (folder / name).write_text("\n".join(SOURCE) + "\n")
    (folder / "reference.txt").write_text("Software libero per tutti.\nIl pacchetto fornisce una libreria.\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["FASTVOCAB_CACHE_DIR"] = str(folder / "cache")  # a user's cache folder: engine auto exports there
    outputs = {}
    for line in lines:
        proc = subprocess.run(
            line, shell=True, cwd=folder, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-2000:]}"
        outputs[line] = proc.stdout
    return outputs


def test_every_line_parses_with_the_real_command_line():
    lines = using_it()
    assert len(lines) >= 10
    for line in lines:
        parse_line(line)


def test_the_quick_lines_run_as_written(tmp_path):
    quick = [line for line in using_it() if any(q in line for q in QUICK)]
    assert len(quick) == len(QUICK), quick
    outputs = run_as_written(quick, tmp_path)
    for name in ("output.txt", "out.txt"):
        translated = (tmp_path / name).read_text().splitlines()
        assert len(translated) == len(SOURCE) and all(translated), name
    assert outputs[quick[0]].strip()  # the line from standard input, on standard output
    assert "BLEU" in outputs[quick[-1]]


@pytest.mark.parametrize("script", ["release_check.sh"])
def test_the_release_script_runs_every_long_line(script):
    body = (ROOT / "tests" / script).read_text()
    long_lines = [
        line for line in using_it() if not any(q in line for q in QUICK) and line != "fastvocab --help"
    ]
    for line in long_lines:
        head = " ".join(shlex.split(line)[:2])
        assert head in body, f"{script} does not run: {line}"
