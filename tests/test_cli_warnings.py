"""What a run says on standard error besides its result: outputs cut at --max-len and a direction the model
was not trained on are warned about; third-party loaders stay quiet at INFO."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fastvocab.pipeline.cli import main

DEMO_MODEL = Path(__file__).resolve().parent.parent / "models" / "demo"

DEMO_MODEL = Path(__file__).resolve().parent.parent / "models" / "demo"


@pytest.fixture(scope="module")
def trained_model(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with a training summary that lists en-it and it-en only."""
    folder = tmp_path_factory.mktemp("trained") / "model"
    shutil.copytree(tiny_model_dir, folder)
    (folder / "training_summary.json").write_text(json.dumps({"directions": ["en-it", "it-en"]}))
    return folder


def _translate(model: Path, tmp_path: Path, lines: list[str], *extra: str) -> int:
    inp = tmp_path / "in.txt"
    inp.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    argv = [
        "translate",
        "--model",
        str(model),
        "-i",
        str(inp),
        "-o",
        str(tmp_path / "out.txt"),
        "--no-progress",
    ]
    return main([*argv, *extra])


def test_outputs_that_reach_max_len_are_counted_with_their_lines(trained_model, tmp_path, caplog):
    lines = ["the package for data", "", "a tool", "the server client network"]
    with caplog.at_level(logging.WARNING):
        rc = _translate(
            trained_model, tmp_path, lines, "--src-lang", "en", "--tgt-lang", "it", "--max-len", "1"
        )
    assert rc == 0
    # at one token a line, every non-empty line's output is cut; the empty line decodes nothing
    (warning,) = [r.getMessage() for r in caplog.records if "--max-len" in r.getMessage()]
    assert warning.startswith("3 outputs reached --max-len 1") and "(input lines 1, 3, 4)" in warning


def test_a_long_enough_max_len_warns_of_nothing(tmp_path, caplog):
    # the demo model, trained: it ends a short line well before the limit (the tiny one's weights are random)
    if not (DEMO_MODEL / "config.json").exists():
        pytest.skip("models/demo is not built")
    with caplog.at_level(logging.WARNING):
        rc = _translate(DEMO_MODEL, tmp_path, ["Free software."], "--src-lang", "en", "--tgt-lang", "it")
    assert rc == 0
    assert not [r.getMessage() for r in caplog.records if "may be cut" in r.getMessage()]


@pytest.mark.parametrize(("src", "tgt", "warned"), [("fr", "de", True), ("en", "it", False)])
def test_a_direction_the_model_was_not_trained_on_is_warned_about(
    trained_model, tmp_path, capsys, src, tgt, warned
):
    rc = _translate(trained_model, tmp_path, ["a"], "--src-lang", src, "--tgt-lang", tgt, "--max-len", "4")
    err = capsys.readouterr().err
    assert rc == 0
    assert (f"was not trained on {src}-{tgt} (its directions: en-it, it-en)" in err) is warned


@pytest.mark.parametrize("verbose", [False, True])
def test_the_faiss_loader_says_nothing_at_info(verbose):
    code = (
        "from fastvocab.pipeline.cli import configure_logging\n"
        f"configure_logging({verbose})\n"
        "import logging\n"
        "logging.getLogger('faiss.loader').info('loading faiss')\n"
        "logging.getLogger('fastvocab.x').info('ours')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    err = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stderr
    assert "fastvocab.x: ours" in err
    assert ("faiss.loader: loading faiss" in err) is verbose
