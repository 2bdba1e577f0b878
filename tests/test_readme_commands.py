"""The README's "Using it" lines run as written: every line parses with the real command line, and the quick
ones (a line from standard input, a file with the shipped maps, eval) run on the demo model. The long ones
(the corpus fetch, training, the pipeline, the paper's experiment, tune) run in tests/release_check.sh."""

from __future__ import annotations

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
    "--with-shortlist models/demo-maps",
    "fastvocab eval",
)


def using_it() -> list[str]:
    """The README's "Using it" commands, continuation lines joined, comments dropped."""
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Using it\n\n```bash\n(.*?)```", text, re.S)
    assert block, "README.md has a 'Using it' code block"
    joined = block.group(1).replace("\\\n", " ")
    lines = [re.sub(r"\s+#\s.*$", "", line).strip() for line in joined.splitlines()]
    return [line for line in lines if "fastvocab" in line]


def test_every_line_parses_with_the_real_command_line():
    lines = using_it()
    assert len(lines) >= 10
    for line in lines:
        argv = shlex.split(line.split(" | ", 1)[-1])
        assert argv[0] == "fastvocab", line
        if argv[1:] == ["--help"]:
            continue
        args = build_parser(load=argv[1]).parse_args(argv[1:])
        assert args.command == argv[1], line


def test_the_quick_lines_run_as_written(tmp_path):
    quick = [line for line in using_it() if any(q in line for q in QUICK)]
    assert len(quick) == len(QUICK), quick
    (tmp_path / "models").symlink_to(ROOT / "models")
    lines = ["Free software for everyone.", "The package provides a library."]
    for name in ("input.txt", "in.txt"):
        (tmp_path / name).write_text("\n".join(lines) + "\n")
    (tmp_path / "reference.txt").write_text(
        "Software libero per tutti.\nIl pacchetto fornisce una libreria.\n"
    )
    # as a user runs them: the venv's bin first on the path, the lines unchanged
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    outputs = {}
    for line in quick:
        proc = subprocess.run(
            line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, f"{line}\n{proc.stderr[-2000:]}"
        outputs[line] = proc.stdout
    for name in ("output.txt", "out.txt"):
        translated = (tmp_path / name).read_text().splitlines()
        assert len(translated) == len(lines) and all(translated), name
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
