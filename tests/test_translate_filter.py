"""``fastvocab translate`` as a Unix filter, and user-named outputs that are not plain files."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import threading

import pytest
from conftest import synthetic_sentences

from fastvocab.artifacts_schema.atomic import is_stream, write_text_atomic
from fastvocab.pipeline.cli import main

MAX_LEN = 6


def _args(model_dir, *extra: str) -> list[str]:
    head = ["translate", "--model", str(model_dir), "--src-lang", "en", "--tgt-lang", "it"]
    return [*head, "--max-len", str(MAX_LEN), "--no-progress", *extra]


@pytest.fixture(scope="module")
def lines() -> list[str]:
    return synthetic_sentences("en", 5, seed=3)


@pytest.fixture(scope="module")
def expected(spread_model_dir, lines, tmp_path_factory) -> list[str]:
    """The translations written to a plain file: what every other output must receive."""
    tmp = tmp_path_factory.mktemp("plain")
    (tmp / "in.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(_args(spread_model_dir, "-i", str(tmp / "in.txt"), "-o", str(tmp / "out.txt"))) == 0
    got = (tmp / "out.txt").read_text(encoding="utf-8").splitlines()
    assert len(got) == len(lines) and any(got)
    return got


def test_stdin_to_stdout_in_a_real_process(spread_model_dir, lines, expected):
    proc = subprocess.run(
        [sys.executable, "-m", "fastvocab.pipeline.cli", *_args(spread_model_dir)],
        input="\n".join(lines) + "\n",
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected  # the translations alone: logs go to stderr
    assert "translated 5 lines" in proc.stderr and "-> standard output" in proc.stderr


def test_dash_means_stdin_and_stdout(spread_model_dir, lines, expected, monkeypatch, capsysbinary):
    data = ("\n".join(lines) + "\n").encode()
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(_args(spread_model_dir, "-i", "-", "-o", "-")) == 0
    assert capsysbinary.readouterr().out.decode().splitlines() == expected
    assert not os.path.exists("-")


def test_bad_stdin_is_one_line_naming_standard_input(spread_model_dir, monkeypatch, capsysbinary):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"ok\n\xc3\x28 broken\n")))
    assert main(_args(spread_model_dir)) == 2
    cap = capsysbinary.readouterr()
    assert cap.out == b""  # nothing partial on stdout
    assert cap.err.decode().strip().splitlines() == [
        "fastvocab translate: error: standard input: line 2: invalid UTF-8 (byte 0xc3 at column 1)"
    ]


def test_a_fifo_is_written_through_and_kept(spread_model_dir, lines, expected, tmp_path):
    inp, fifo = tmp_path / "in.txt", tmp_path / "out.fifo"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    try:
        assert main(_args(spread_model_dir, "-i", str(inp), "-o", str(fifo))) == 0
    finally:
        if reader.is_alive():  # unblock the reader if the command failed before opening the FIFO
            with open(fifo, "wb"):
                pass
        reader.join(timeout=60)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert received[0].decode().splitlines() == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "out.fifo"]  # no parts left beside it


def test_a_fifo_input_is_read(spread_model_dir, lines, expected, tmp_path):
    fifo, out = tmp_path / "in.fifo", tmp_path / "out.txt"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("\n".join(lines) + "\n", encoding="utf-8"))
    writer.start()
    assert main(_args(spread_model_dir, "-i", str(fifo), "-o", str(out))) == 0
    writer.join(timeout=60)
    assert out.read_text(encoding="utf-8").splitlines() == expected


def test_a_symlink_is_kept_and_its_file_replaced(spread_model_dir, lines, expected, tmp_path):
    inp, real, link = tmp_path / "in.txt", tmp_path / "real.txt", tmp_path / "link.txt"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    real.write_text("old\n")
    link.symlink_to(real.name)
    assert main(_args(spread_model_dir, "-i", str(inp), "-o", str(link))) == 0
    assert link.is_symlink() and os.readlink(link) == real.name
    assert real.read_text(encoding="utf-8").splitlines() == expected


def test_streams_and_links_in_the_shared_writer(tmp_path):
    """Every command's files go through write_text_atomic / atomic_path: the same rules for all."""
    assert is_stream("-") and is_stream("/dev/null") and not is_stream(tmp_path / "new.json")
    fifo = tmp_path / "f"
    os.mkfifo(fifo)
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    write_text_atomic(fifo, '{"a": 1}\n')
    reader.join(timeout=30)
    assert got == ['{"a": 1}\n'] and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    link.symlink_to(real)
    write_text_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "sub" / "target.json")
    write_text_atomic(dangling, "made")
    assert dangling.is_symlink() and (tmp_path / "sub" / "target.json").read_text() == "made"
    write_text_atomic("/dev/null", "discarded")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
