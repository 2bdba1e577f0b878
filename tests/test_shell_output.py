"""``translate`` in a shell script: an output that is the shell's own redirect, and SIGTERM.

Real processes under bash, because the defects these guard against live between the shell and the process:
a reopened ``/dev/stdout`` truncates the file the shell opened (``> log 2>&1`` lost every translation,
``>>`` erased the log, a group's header vanished), and Ray's SIGTERM handler crashed a bulk run with a
native stack dump instead of exiting 143.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import synthetic_sentences

from fastvocab.artifacts_schema.atomic import held_descriptor, is_stream

BIN = Path(sys.executable).parent
# a private local Ray per driver: no token file shared with other tests' sessions
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "MLFLOW_TRACKING_URI"}
    return env | RAY_ENV | {"PYTHONUNBUFFERED": "1", "PATH": f"{BIN}:{env['PATH']}"}


def _translate(model: Path, inp: Path, out: str, *extra: str) -> str:
    argv = [
        str(BIN / "fastvocab"),
        "translate",
        "--model",
        str(model),
        "--src-lang",
        "en",
        "--tgt-lang",
        "it",
    ]
    return shlex.join([*argv, "-i", str(inp), "-o", out, "--max-len", "6", "--no-progress", *extra])


def _bash(script: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-c", script], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=300
    )


@pytest.fixture(scope="module")
def job(spread_model_dir, tmp_path_factory):
    """(model, input, the reference translations: what ``-o FILE`` writes)."""
    root = tmp_path_factory.mktemp("shell")
    inp = root / "in.txt"
    inp.write_text("\n".join(synthetic_sentences("en", 5, seed=4)) + "\n", encoding="utf-8")
    ref = root / "ref.txt"
    res = _bash(_translate(spread_model_dir, inp, str(ref)), root)
    assert res.returncode == 0, res.stderr
    return spread_model_dir, inp, ref.read_text(encoding="utf-8")


def _forms(command: str) -> dict[str, tuple[str, str, Callable[[str, str], bool]]]:
    """name -> (set-up, script, check of the file ``f`` against the reference)."""
    return {
        # stdout and stderr into one new file: every translation there, the summary line too
        "> f 2>&1": (
            "",
            f"{command} > f 2>&1",
            lambda text, ref: ref in text and "translated 5 lines" in text,
        ),
        # appended to a log: its earlier lines kept, the translations after them
        ">> f": (
            "printf 'OLD-1\\nOLD-2\\n' > f",
            f"{command} >> f",
            lambda text, ref: text == f"OLD-1\nOLD-2\n{ref}",
        ),
        # a group's redirect: the header before, the footer after, nothing overwritten
        "{ ...; } > f": (
            "",
            f"{{ echo HEADER; {command}; echo FOOTER; }} > f",
            lambda text, ref: text == f"HEADER\n{ref}FOOTER\n",
        ),
    }


@pytest.mark.parametrize(
    "form, target",
    [("> f 2>&1", "/dev/stdout"), (">> f", "/dev/stdout"), ("{ ...; } > f", "/proc/self/fd/1")],
)
def test_output_to_the_shells_stdout_keeps_every_line(job, tmp_path, form, target):
    model, inp, ref = job
    setup, script, check = _forms(_translate(model, inp, target))[form]
    res = _bash(f"{setup}\n{script}", tmp_path)
    assert res.returncode == 0, res.stderr
    data = (tmp_path / "f").read_bytes()
    assert b"\0" not in data
    assert check(data.decode("utf-8"), ref), data.decode("utf-8", "replace")


def test_output_to_the_shells_stdout_with_two_ray_workers_keeps_every_line(job, tmp_path):
    """The three forms in one: appended to a log, stderr there too, inside a group. Ray's log lines and
    the summary go to the same file as the translations: no NUL bytes (a truncated file written at a stale
    offset), nothing lost."""
    pytest.importorskip("ray")
    model, inp, ref = job
    command = _translate(
        model, inp, "/dev/stdout", "--workers", "2", "--chunk-lines", "2", "--min-ray-lines", "0"
    )
    res = _bash(f"echo OLD > f\n{{ echo HEADER; {command}; echo FOOTER; }} >> f 2>&1", tmp_path)
    assert res.returncode == 0, res.stderr
    data = (tmp_path / "f").read_bytes()
    assert b"\0" not in data
    text = data.decode("utf-8")
    assert text.startswith("OLD\nHEADER\n") and text.endswith("FOOTER\n"), text
    assert ref in text, text
    assert "translated 5 lines" in text


def test_held_descriptors_are_written_through_and_other_files_replaced(tmp_path):
    """What decides between writing through and replacing: the descriptors this process holds."""
    out = tmp_path / "out.txt"
    out.write_text("x")
    assert not is_stream(out) and held_descriptor(out) is None
    assert not is_stream(tmp_path / "missing.txt")
    assert held_descriptor("-") == 1 and is_stream("-")
    assert is_stream("/dev/null")  # a device: written through, not replaced
    with out.open("ab") as f:
        assert held_descriptor(f"/dev/fd/{f.fileno()}") == f.fileno()
        assert held_descriptor(f"/proc/{os.getpid()}/fd/{f.fileno()}") == f.fileno()
    assert held_descriptor("/dev/fd/987") is None  # not open
    # a regular file that is where stdout goes (``-o out.txt > out.txt``): written to fd 1 as it stands
    script = (
        "from fastvocab.artifacts_schema.atomic import held_descriptor, write_text_atomic; import sys;"
        "print(held_descriptor(sys.argv[1]), flush=True); write_text_atomic(sys.argv[1], 'body\\n')"
    )
    with out.open("wb") as f:
        subprocess.run([sys.executable, "-c", script, str(out)], stdout=f, check=True, timeout=60)
    assert out.read_text() == "1\nbody\n"


def _ray_actors() -> list[int]:
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::TranslateWorker"):
                pids.append(int(pid))
        except OSError:
            continue
    return pids


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_mid_job_exits_143_releases_the_lock_and_the_rerun_resumes(job, tmp_path, workers):
    """What ``timeout``, Slurm and Kubernetes send: exit 143, no crash dump, Ray's actors gone, the lock
    released, the finished parts kept, and a rerun translates only the rest into the same output."""
    if workers > 1:
        pytest.importorskip("ray")
    model, _, _ = job
    inp = tmp_path / "long.txt"
    inp.write_text("\n".join(synthetic_sentences("en", 400, seed=9)) + "\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    ray = ("--workers", str(workers), "--min-ray-lines", "0")  # on Ray even for these few lines
    command = _translate(model, inp, str(out), "--chunk-lines", "4", "--beam", "2", *ray)
    proc = subprocess.Popen(
        shlex.split(command),
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    parts = tmp_path / "out.txt.parts"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None and len(list(parts.glob("part-*.parquet"))) < 2:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM" in err, err[-3000:]
    assert "Traceback" not in err and "SIGTERM received at time" not in err, err[-3000:]
    assert not (parts / ".fastvocab.lock").exists()
    assert not out.exists()
    done = {p.name: p.stat().st_mtime_ns for p in parts.glob("part-*.parquet")}
    assert 2 <= len(done) < 100
    deadline = time.time() + 30
    while _ray_actors() and time.time() < deadline:  # Ray reaps its workers asynchronously
        time.sleep(0.5)
    assert not _ray_actors()

    res = _bash(_translate(model, inp, str(out), "--chunk-lines", "4", "--beam", "2"), tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"{100 - len(done)} of 100 parts translated" in res.stderr, res.stderr
    assert len(out.read_text(encoding="utf-8").splitlines()) == 400
