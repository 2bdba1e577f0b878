"""Reliability: bad input is refused before any work, one run per work dir, clean stops on
SIGTERM/SIGINT, MLflow stores that fail fast and follow a copied work dir, shard checksums.

Most tests stop at validation and need no Ray; the one that does (a real SIGTERM mid-dump) runs
``fastvocab run`` in a subprocess.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from fastvocab.artifacts_schema.cluster_map import ClusterMap, MapManifest, save_cluster_map
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import (
    ShardMeta,
    checksum_path,
    shard_is_current,
    shard_path,
    shard_status,
    shard_table,
    validate_direction,
    write_shard,
)
from fastvocab.artifacts_schema.lock import LOCK_FILE, WorkDirBusy, WorkDirLock, read_lock
from fastvocab.pipeline.cli import main
from fastvocab.pipeline.errors import Interrupted
from tests.conftest import write_en_it_split

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------- helpers


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if "error" in line]


def _write_corpus(root: Path, n: int = 40) -> Path:
    write_en_it_split(root, "train", n, seed=1)
    return root


def _config(tmp: Path, model: Path, corpus: Path, **over: object) -> Path:
    cfg: dict[str, object] = {
        "work_dir": str(tmp / "work"),
        "model": str(model),
        "directions": ["en-it"],
        "corpus": {"out_dir": str(corpus)},
        "dump": {"sentences": 40, "k": 3, "batch_size": 8, "shard_sentences": 5, "max_len": 8},
        "kmeans": {"r": 4, "niter": 4},
        "eval": {"split": "train", "sentences": 4, "methods": ["full"]},
        "ray_num_cpus": 2,
    }
    cfg.update(over)
    path = tmp / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture
def corpus(tmp_path_factory) -> Path:
    return _write_corpus(tmp_path_factory.mktemp("corpus") / "corpus")


@pytest.fixture
def no_mlflow_env(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


@pytest.fixture(scope="module")
def model_info(tiny_model_dir) -> tuple[str, int, int]:
    """(fingerprint, d, N) of the tiny model."""
    from fastvocab.tasks.context import describe_model

    ref = describe_model(tiny_model_dir)
    return ref.fingerprint, ref.d, ref.n_vocab


def _save_map(root: Path, name: str, direction: str, scope: str, info: tuple[str, int, int]) -> Path:
    fingerprint, d, n_vocab = info
    centroids = np.random.default_rng(0).standard_normal((2, d)).astype(np.float32)
    indptr = np.array([0, n_vocab, 2 * n_vocab], dtype=np.int64)
    indices = np.concatenate([np.arange(n_vocab), np.arange(n_vocab)]).astype(np.int32)
    manifest = MapManifest(fingerprint, direction, scope, 2, 1, d, n_vocab, 1, 0, 0)
    cmap = ClusterMap(
        manifest, centroids, (centroids**2).sum(1), indptr, indices, np.ones(len(indices), np.int32)
    )
    return save_cluster_map(cmap, root / name)


def _translate(model: Path, inp: Path, out: Path, src: str, tgt: str, *extra: str) -> list[str]:
    return [
        "translate",
        "--model",
        str(model),
        "--src-lang",
        src,
        "--tgt-lang",
        tgt,
        "-i",
        str(inp),
        "-o",
        str(out),
        "--max-len",
        "4",
        "--no-progress",
        *extra,
    ]


# ------------------------------------------------------------------ 9: --set through a plain value


def test_set_through_a_value_is_a_one_line_error(tiny_model_dir, corpus, tmp_path, capsys):
    cfg = _config(tmp_path, tiny_model_dir, corpus)
    for key in ("work_dir.x=1", "dump.k.x=1", "nothing.x=1"):
        rc, _, err = _cli(capsys, "run", str(cfg), "--set", key, "--no-mlflow")
        assert rc == 2 and len(_error_lines(err)) == 1, err
        assert key.split("=")[0] in err and "Traceback" not in err
    assert not (tmp_path / "work").exists()


# ------------------------------------------------ 4: unsupported directions refused before any stage


def test_unsupported_direction_is_refused_before_the_corpus_stage(tiny_model_dir, tmp_path, capsys):
    empty_corpus = tmp_path / "corpus"
    # zz is no language of the model: refused by the model check, before the corpus stage would build
    # (and rewrite corpus.json for) a Debian corpus
    cfg = _config(tmp_path, tiny_model_dir, empty_corpus, directions=["en-zz"])
    rc, _, err = _cli(capsys, "run", str(cfg), "--no-mlflow")
    assert rc == 2 and len(_error_lines(err)) == 1 and "unknown language 'zz'" in err, err
    assert not empty_corpus.exists() and not (tmp_path / "work").exists()


@pytest.mark.parametrize("directions", [["en-en"], ["en"], ["en-it", "en-it"]])
def test_malformed_directions_are_config_errors(tiny_model_dir, tmp_path, capsys, directions):
    cfg = _config(tmp_path, tiny_model_dir, tmp_path / "corpus", directions=directions)
    rc, _, err = _cli(capsys, "run", str(cfg), "--no-mlflow")
    assert rc == 2 and len(_error_lines(err)) == 1 and "directions" in err, err
    assert not (tmp_path / "corpus").exists() and not (tmp_path / "work").exists()


def test_translate_refuses_source_equal_to_target(tiny_model_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("the package\n")
    rc, _, err = _cli(capsys, *_translate(tiny_model_dir, inp, out, "en", "en"))
    assert rc == 2 and "both en" in err and not out.exists()


# ---------------------------------------------------------------- 1: a map of another direction


def test_translate_refuses_a_map_of_another_direction(tiny_model_dir, model_info, tmp_path, capsys):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("il pacchetto\n")
    en_it = _save_map(tmp_path / "maps", "en-it", "en-it", "direction", model_info)
    flags = ("--method", "clustered", "--clusters", str(en_it))
    rc, _, err = _cli(capsys, *_translate(tiny_model_dir, inp, out, "it", "en", *flags))
    assert rc == 2 and len(_error_lines(err)) == 1 and "built for en-it, not it-en" in err, err
    assert not out.exists()
    # a target-scope map into it serves any source into it
    to_it = _save_map(tmp_path / "maps", "to-it", "to-it", "target", model_info)
    flags = ("--method", "clustered", "--clusters", str(to_it))
    rc, _, err = _cli(capsys, *_translate(tiny_model_dir, inp, out, "fr", "it", *flags))
    assert rc == 0 and out.exists(), err
    rc, _, err = _cli(capsys, *_translate(tiny_model_dir, inp, tmp_path / "o2.txt", "it", "en", *flags))
    assert rc == 2 and "built for to-it, not it-en" in err


def test_pipeline_refuses_a_map_of_another_direction(tiny_model_dir, model_info, tmp_path):
    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.context import StageContext
    from fastvocab.pipeline.ray_session import RaySession
    from fastvocab.pipeline.stages.translate import _method_plan

    cfg = load_config(_config(tmp_path, tiny_model_dir, tmp_path / "corpus", directions=["en-it", "it-en"]))
    ctx = StageContext(cfg, RaySession(None, 1))
    _save_map(ctx.maps_root, "en-it", "en-it", "direction", model_info)
    shutil.copytree(ctx.maps_root / "en-it", ctx.maps_root / "it-en")  # copied into the wrong place
    assert isinstance(_method_plan(ctx, "en-it", "clustered"), tuple)
    with pytest.raises(ArtifactError, match="built for en-it, not it-en"):
        _method_plan(ctx, "it-en", "clustered")


# ---------------------------------------------------------------- 7: unusable output, checked first


def test_translate_output_that_cannot_be_written_fails_before_translating(tmp_path, capsys):
    inp = tmp_path / "in.txt"
    inp.write_text("the package\n")
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    missing_model = tmp_path / "no-model"  # the output check comes first: the model is never looked at
    cases = {
        tmp_path: "is a folder",
        a_file / "out.txt": "is not a folder",
        Path("/proc/fastvocab-out.txt"): "cannot write in /proc",
    }
    for out, message in cases.items():
        rc, _, err = _cli(capsys, *_translate(missing_model, inp, out, "en", "it"))
        assert rc == 2 and len(_error_lines(err)) == 1 and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "in.txt"]


# ---------------------------------------------------------------------- 8: devices this machine lacks


def test_unknown_or_absent_device_is_a_one_line_error(tmp_path, capsys):
    import torch

    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("the package\n")
    cases = {"gpu": "not a device", "cuda:x": "not a device"}
    if not torch.backends.mps.is_available():
        cases["mps"] = "no Apple MPS device"
    if not torch.cuda.is_available():
        cases["cuda:0"] = "no CUDA GPU"
    for device, message in cases.items():
        rc, _, err = _cli(
            capsys, *_translate(tmp_path / "no-model", inp, out, "en", "it", "--device", device)
        )
        assert rc == 2 and len(_error_lines(err)) == 1 and message in err, (device, err)
    assert not out.exists()


def test_config_device_name_is_checked_at_load(tiny_model_dir, corpus, tmp_path, capsys):
    cfg = _config(tmp_path, tiny_model_dir, corpus)
    rc, _, err = _cli(capsys, "run", str(cfg), "--set", "translate.device=gpu", "--no-mlflow")
    assert rc == 2 and "translate.device" in err and not (tmp_path / "work").exists()


def test_config_early_stopping_reaches_the_search_settings(tmp_path):
    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.errors import UserError

    assert load_config(None).translate.search().early_stopping is None  # the model's own rule
    cfg = tmp_path / "c.yaml"
    for text, want in (("true", True), ("false", False), ("never", "never")):
        cfg.write_text(f"translate:\n  early_stopping: {text}\n")
        assert load_config(cfg).translate.search().early_stopping == want
    with pytest.raises(UserError, match=r"translate\.early_stopping"):
        load_config(None, {"translate.early_stopping": "sometimes"})


def test_config_engine_reaches_the_translate_stage_workers(tmp_path, tiny_model_dir):
    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.context import StageContext
    from fastvocab.pipeline.errors import UserError

    assert load_config(None).translate.engine == "auto"
    demo = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"
    assert load_config(demo).translate.engine == "onnx"  # make demo shows the ONNX Runtime engine
    with pytest.raises(UserError, match=r"translate\.engine"):
        load_config(None, {"translate.engine": "fast"})
    cfg = load_config(None, {"translate.engine": "static", "model": str(tiny_model_dir)})
    ctx = StageContext(cfg, ray=None, progress=False)  # type: ignore[arg-type]  # no stage runs here
    assert ctx.run_context("cpu", 1, cfg.translate.engine).load_adapter().engine == "static"


# ------------------------------------------------------------------------------ 2: work-dir lock


@pytest.fixture
def other_process():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def _fake_lock(work: Path, pid: int, **extra: str) -> None:
    work.mkdir(parents=True, exist_ok=True)
    info = {
        "pid": pid,
        "host": socket.gethostname(),
        "started": "2026-01-01T00:00:00",
        "command": "fastvocab run other.yaml",
        "extra": extra,
    }
    (work / LOCK_FILE).write_text(json.dumps(info))


def test_lock_is_taken_released_and_refused_while_its_owner_lives(tmp_path, other_process):
    with WorkDirLock(tmp_path) as lock:
        assert read_lock(tmp_path / LOCK_FILE).pid == os.getpid() and lock.stale is None
    assert not (tmp_path / LOCK_FILE).exists()
    _fake_lock(tmp_path, other_process.pid)
    with pytest.raises(WorkDirBusy, match=f"pid {other_process.pid}"):
        WorkDirLock(tmp_path).acquire()
    assert read_lock(tmp_path / LOCK_FILE).pid == other_process.pid  # left as it was


def test_second_run_on_a_locked_work_dir_fails_at_once(
    tiny_model_dir, corpus, tmp_path, capsys, other_process, no_mlflow_env, caplog
):
    cfg = _config(tmp_path, tiny_model_dir, corpus)
    work = tmp_path / "work"
    _fake_lock(work, other_process.pid)
    t0 = time.perf_counter()
    rc, _, err = _cli(capsys, "run", str(cfg), "--stages", "corpus", "--no-progress")
    assert rc == 2 and len(_error_lines(err)) == 1, err
    assert f"in use by fastvocab pid {other_process.pid} on {socket.gethostname()}" in err
    assert time.perf_counter() - t0 < 30
    assert sorted(p.name for p in work.iterdir()) == [LOCK_FILE]  # nothing else written

    # the owner dies (SIGKILL: it could not clean up): its lock is stale and taken over, and the MLflow run
    # it left RUNNING is closed as KILLED
    from fastvocab.pipeline.tracking import Tracker, resolve_store

    tracker = Tracker.open(resolve_store(None, work), "fastvocab")
    dead_run = tracker.start("killed run", {}, {})
    other_process.kill()
    other_process.wait()
    _fake_lock(work, other_process.pid, mlflow_run_id=dead_run, mlflow_uri=tracker.uri)
    caplog.set_level("WARNING", logger="fastvocab.pipeline.run")
    rc, _, err = _cli(capsys, "run", str(cfg), "--stages", "corpus", "--no-progress")
    assert rc == 0, err
    assert any("taking over the lock" in r.getMessage() for r in caplog.records)
    assert tracker.client.get_run(dead_run).info.status == "KILLED"
    assert not (work / LOCK_FILE).exists()


# ------------------------------------------------------------------- 6 and 10: SIGTERM and SIGINT


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_the_run_closes_mlflow_as_killed_and_releases_the_lock(
    tiny_model_dir, corpus, tmp_path, capsys, monkeypatch, no_mlflow_env, sig
):
    import fastvocab.pipeline.run as run_module

    cfg = _config(tmp_path, tiny_model_dir, corpus)

    def stage(ctx):  # a stage busy when the scheduler (or the user) stops the run
        os.kill(os.getpid(), sig)
        time.sleep(30)
        return []

    monkeypatch.setattr(run_module, "stage_function", lambda name: stage)
    previous = signal.getsignal(sig)
    rc, _, err = _cli(capsys, "run", str(cfg), "--stages", "dump", "--no-progress")
    assert rc == 128 + sig and f"stopped by {signal.Signals(sig).name}" in err, err
    assert signal.getsignal(sig) == previous  # handlers restored
    work = tmp_path / "work"
    assert not (work / LOCK_FILE).exists()
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{work.resolve() / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("fastvocab").experiment_id])
    assert run.info.status == "KILLED"


def test_sigterm_mid_dump_in_a_real_process_exits_143_and_the_next_run_resumes(tiny_model_dir, tmp_path):
    """The real thing: ``fastvocab run`` with local Ray, SIGTERM while the dump workers decode.

    100 shards of 2 sentences: on a fast machine 20 shards were all written between the second one and
    the signal's arrival, leaving nothing to resume."""
    pytest.importorskip("ray")
    shards = 100
    corpus = _write_corpus(tmp_path / "corpus", n=2 * shards)
    dump = {"sentences": 2 * shards, "k": 3, "batch_size": 2, "shard_sentences": 2, "max_len": 8}
    cfg = _config(tmp_path, tiny_model_dir, corpus, dump={**dump, "num_workers": 1})
    work = tmp_path / "work"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = [
        sys.executable,
        "-m",
        "fastvocab.pipeline.cli",
        "run",
        str(cfg),
        "--stages",
        "dump",
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    states = work / "states" / "direction=en-it"
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if len(list(states.glob("_part-*.sha256"))) >= 2:
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    t0 = time.perf_counter()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    stop_seconds = time.perf_counter() - t0
    assert proc.returncode == 143, err[-3000:]
    assert "stopped by SIGTERM" in err and "Traceback" not in err, err[-3000:]
    assert stop_seconds < 60
    assert not (work / LOCK_FILE).exists()
    assert not list(work.rglob("*.tmp")), "no temporary files left behind"
    done = sorted(p.name for p in states.glob("part-*.parquet"))
    print(f"{len(done)} of {shards} shards written before the signal")
    assert 2 <= len(done) < shards
    from mlflow import MlflowClient

    client = MlflowClient(f"sqlite:///{work.resolve() / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fastvocab").experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]

    mtimes = {p.name: p.stat().st_mtime_ns for p in states.glob("part-*.parquet")}
    res = subprocess.run(
        [*cmd, "--no-mlflow"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"{shards - len(done)} of {shards} shards written" in res.stdout, res.stdout
    assert {p: (states / p).stat().st_mtime_ns for p in mtimes} == mtimes  # finished shards kept
    validate_direction(work / "states", "en-it")


# --------------------------------------------------------------------- 5: a bad tracking URI, fast


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "uri, message",
    [
        ("http://127.0.0.1:{port}", "not reachable"),
        ("bogus://somewhere", "unknown scheme 'bogus'"),
        ("sqlite:////no/such/folder/mlflow.db", "does not exist"),
    ],
)
def test_bad_tracking_uri_is_a_fast_one_line_error(
    tiny_model_dir, corpus, tmp_path, capsys, monkeypatch, uri, message
):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(port=_closed_port()))
    cfg = _config(tmp_path, tiny_model_dir, corpus)
    t0 = time.perf_counter()
    rc, _, err = _cli(capsys, "run", str(cfg), "--no-progress")
    assert rc == 2 and len(_error_lines(err)) == 1 and message in err, err
    assert "MLFLOW_TRACKING_URI" in err and time.perf_counter() - t0 < 15
    assert not (tmp_path / "work").exists()


# ------------------------------------------------------ 11: a copied work dir logs into its own store


def test_copied_work_dir_logs_artifacts_into_the_copy(tmp_path, no_mlflow_env):
    from fastvocab.pipeline.tracking import Tracker, resolve_store

    first, copy = tmp_path / "first", tmp_path / "copy"
    t = Tracker.open(resolve_store(None, first), "fastvocab")
    t.start("first", {"a": 1}, {})
    t.end()
    shutil.copytree(first, copy)
    before = sorted(p for p in (first / "mlartifacts").rglob("*") if p.is_file())

    t2 = Tracker.open(resolve_store(None, copy), "fastvocab")
    run_id = t2.start("in the copy", {"a": 2}, {})
    t2.end()
    assert sorted(p for p in (first / "mlartifacts").rglob("*") if p.is_file()) == before
    assert list((copy / "mlartifacts").rglob(f"{run_id}/artifacts/config.json"))
    # the copy's old runs name the copy's artifacts too
    old_run = t2.client.get_run(t.parent_id)
    assert old_run.info.artifact_uri.startswith((copy / "mlartifacts").resolve().as_uri())


# ------------------------------------------------------------------ 12: shard content checksums


def _shard(root: Path, index: int = 0) -> tuple[Path, ShardMeta, dict[str, object]]:
    rng = np.random.default_rng(index)
    meta = ShardMeta("sha256:model", 16, 3, "en-it")
    n = 400
    table = shard_table(
        meta,
        np.arange(n),
        np.zeros(n, np.int32),
        rng.standard_normal((n, 16)).astype(np.float16),
        rng.integers(0, 50, (n, 3)).astype(np.int32),
    )
    plan = {"index": index, "sentences_digest": "x"}
    path = write_shard(table, plan, shard_path(root, "en-it", index), row_group_size=1000)
    return path, meta, plan


def test_flipped_bytes_inside_a_shard_are_found_on_resume_and_on_read(tmp_path):
    path, meta, plan = _shard(tmp_path)
    assert checksum_path(path).exists() and shard_is_current(path, meta, plan)
    assert shard_status(path, meta, plan) == "current"
    data = bytearray(path.read_bytes())
    middle = len(data) // 2  # inside the hidden-state data pages: the footer and metadata still parse
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))
    assert shard_status(path, meta, plan).startswith("corrupt: its SHA-256 does not match")
    with pytest.raises(ArtifactError, match=r"part-00000\.parquet"):
        shard_is_current(path, meta, plan)
    with pytest.raises(ArtifactError, match=r"corrupt hidden-state shard .*part-00000\.parquet"):
        validate_direction(tmp_path, "en-it")
    # a shard whose checksum file is missing (killed between the two writes) is not current: redone
    path2, meta2, plan2 = _shard(tmp_path, 1)
    checksum_path(path2).unlink()
    assert shard_status(path2, meta2, plan2) == "stale"


def test_interrupted_is_a_base_exception_with_the_exit_code():
    exc = Interrupted(signal.SIGTERM)
    assert exc.exit_code == 143 and not isinstance(exc, Exception) and "SIGTERM" in str(exc)
