"""A two-node Ray cluster on this machine (`ray start --head` + a second `ray start`), as a user runs one.

`fastvocab run --ray-address` and `ray job submit` against it: the dump's workers land on both nodes, a worker
killed mid-dump is restarted and its shard redone, and every output equals a local run's (every
(sent_id, step) exactly once). Slow (three pipeline runs and a cluster start, ~1-2 minutes on 2 cores).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml

from fastvocab.artifacts_schema.cluster_map import load_manifest
from tests.conftest import write_en_it_split

BIN = Path(sys.executable).parent
DIRECTIONS = ["en-it", "it-en"]
STAGES = "corpus,dump,kmeans,maps"
# Ray enables token authentication when ~/.ray/auth_token exists (a local ray.init writes one); the nodes and
# drivers started here must agree, so the test names the mode instead of depending on that file.
RAY_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{BIN}:{os.environ['PATH']}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_") and k != "MLFLOW_TRACKING_URI"}
    return env | RAY_ENV | extra


def _ray(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / "ray"), *args], env=_env(), capture_output=True, text=True, timeout=timeout, check=True
    )


def _cmdline(pid: int | str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _cluster_workers(temp_dir: str) -> list[tuple[int, int]]:
    """(pid, raylet pid) of this cluster's dump workers: Ray names an actor's process ``ray::DecoderWorker``,
    and its parent, the raylet of its node, names the cluster's temp dir (other Ray sessions may run here)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if _cmdline(pid).startswith(b"ray::DecoderWorker"):
            try:
                ppid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            except (OSError, IndexError):
                continue
            if temp_dir.encode() in _cmdline(ppid):
                pids.append((int(pid), int(ppid)))
    return pids


def _stop_session(temp_dir: str) -> None:
    """Kill this cluster's processes only (`ray stop` would stop every Ray on the machine): its GCS server
    and raylets name the temp dir on their command lines, and every other process of it descends from them
    (the agents rename themselves, so they are found through their parents)."""
    parent = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            parent[int(pid)] = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    doomed = {pid for pid in parent if temp_dir.encode() in _cmdline(pid)} - {os.getpid()}
    while True:
        more = {pid for pid, ppid in parent.items() if ppid in doomed} - doomed
        if not more:
            break
        doomed |= more
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("ray")
    # Short path: Ray's Unix sockets live under the temp dir (108-byte limit on socket paths).
    temp_dir = tempfile.mkdtemp(prefix="fvray", dir="/tmp")
    port, dash = _free_port(), _free_port()
    try:
        _ray(
            "start", "--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={temp_dir}",
            "--disable-usage-stats",
        )  # fmt: skip
        _ray("start", f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", "--num-cpus=1")
        yield {"gcs": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}", "temp_dir": temp_dir}
    finally:
        _stop_session(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("multinode")
    write_en_it_split(root / "corpus", "train", 60, seed=3)
    return root, tiny_model_dir


def _config(root: Path, model: Path, name: str) -> Path:
    cfg = {
        "work_dir": str(root / name),
        "model": str(model),
        "directions": DIRECTIONS,
        "corpus": {"out_dir": str(root / "corpus")},
        # Many small shards, so a worker killed mid-dump still has work left to lose.
        "dump": {"sentences": 48, "stream_sentences": 0, "k": 3, "batch_size": 4, "shard_sentences": 4,
                 "max_len": 8, "num_workers": 2, "torch_threads": 1},
        "kmeans": {"r": 6, "niter": 8, "seed": 7},
    }  # fmt: skip
    path = root / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _fastvocab(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "fastvocab"), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _rows(work_dir: Path) -> dict[str, list[tuple]]:
    """Every recorded state per direction, sorted: (sent_id, step, top-K ids, hidden bytes)."""
    table = ds.dataset(work_dir / "states", format="parquet", partitioning="hive").to_table()
    out: dict[str, list[tuple]] = {}
    for row in table.to_pylist():
        key = (row["sent_id"], row["step"], tuple(row["topk_ids"]), tuple(row["hidden"]))
        out.setdefault(row["direction"], []).append(key)
    return {d: sorted(v) for d, v in out.items()}


def _map_digests(work_dir: Path) -> dict[str, str]:
    return {d: load_manifest(work_dir / "maps" / d).tensors_digest for d in DIRECTIONS}


@pytest.fixture(scope="module")
def local_run(inputs):
    root, model = inputs
    cfg = _config(root, model, "local")
    proc = _fastvocab("run", str(cfg), "--stages", STAGES, "--no-mlflow", "--no-progress", env=_env())
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    return root / "local"


def _finished_shards(states: Path) -> list[Path]:
    """The dump's finished shard files (one folder level down: the writer's temporary folders beside them come
    and go while this looks, and a recursive walk into one that vanished raised FileNotFoundError)."""
    try:
        return list(states.glob("direction=*/part-*.parquet"))
    except FileNotFoundError:  # the states folder itself, or a direction's, not yet created
        return []


def test_run_on_two_nodes_survives_a_killed_worker_and_equals_a_local_run(cluster, inputs, local_run):
    root, model = inputs
    cfg = _config(root, model, "cluster")
    proc = _fastvocab(
        "run", str(cfg), "--stages", STAGES, "--no-mlflow", "--no-progress", "--ray-address", cluster["gcs"],
        env=_env(),
    )  # fmt: skip
    # Kill one dump worker once the dump has written its first shard (the others are still to come), and
    # note on which nodes (raylets) the workers run.
    try:
        killed, nodes = None, set()
        deadline = time.time() + 600
        while proc.poll() is None and time.time() < deadline:
            workers = _cluster_workers(cluster["temp_dir"])
            nodes |= {raylet for _, raylet in workers}
            if killed is None and workers and _finished_shards(root / "cluster" / "states"):
                killed = workers[0][0]
                os.kill(killed, signal.SIGKILL)
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert killed is not None, f"the dump finished before a worker could be killed:\n{out}"
    assert len(nodes) == 2, f"the dump's workers ran on {len(nodes)} node(s), not on both"
    local, remote = _rows(local_run), _rows(root / "cluster")
    for d in DIRECTIONS:
        keys = [(r[0], r[1]) for r in remote[d]]
        assert len(keys) == len(set(keys)) > 0, f"{d}: a (sent_id, step) is missing or recorded twice"
        assert remote[d] == local[d], f"{d}: the cluster run recorded other states than the local run"
    assert _map_digests(root / "cluster") == _map_digests(local_run)


def test_ray_job_submit_runs_the_pipeline_on_the_cluster(cluster, inputs, local_run):
    root, model = inputs
    cfg = _config(root, model, "job")
    # The job's driver runs on the head; it finds the cluster through the RAY_ADDRESS the job sets.
    for _ in range(20):
        result = subprocess.run(
            [str(BIN / "ray"), "job", "submit", "--address", cluster["dashboard"], "--",
             str(BIN / "fastvocab"), "run", str(cfg), "--stages", STAGES, "--no-mlflow", "--no-progress"],
            env=_env(), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        # The head's job agent starts after the dashboard answers; until then Ray refuses the submission
        # and asks to try again (seen on a loaded 2-core machine).
        if "No available agent to submit job" not in result.stderr:
            break
        time.sleep(3)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "succeeded" in result.stdout, result.stdout
    assert _rows(root / "job") == _rows(local_run)
    assert _map_digests(root / "job") == _map_digests(local_run)


def test_bulk_translation_on_two_nodes_equals_the_in_process_run(cluster, inputs, tmp_path):
    """``fastvocab translate --workers 2 --ray-address`` on the two-node cluster (one actor per node: each
    node has 1 CPU): the text assembled from the actors' parts is the in-process run's, line for line."""
    from tests.conftest import synthetic_sentences

    _, model = inputs
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(synthetic_sentences("en", 30, seed=4)) + "\n", encoding="utf-8")
    proc = _fastvocab(
        "translate", "--model", str(model), "--src-lang", "en", "--tgt-lang", "it", "-i", str(inp),
        "-o", str(tmp_path / "cluster.txt"), "--max-len", "6", "--chunk-lines", "5", "--no-progress",
        "--workers", "2", "--ray-address", cluster["gcs"], env=_env(),
    )  # fmt: skip
    # meanwhile, the in-process run (fastvocab translate without Ray, the same parts)
    from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk
    from fastvocab.tasks.translate import SearchSettings

    local = tmp_path / "local.txt"
    request = BulkRequest(
        str(inp), str(local), model, "en", "it", search=SearchSettings(max_len=6), lines_per_part=5
    )
    run_bulk(request, progress=False)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "6 of 6 parts translated" in out and "2 Ray workers used of 2" in out, out
    assert (tmp_path / "cluster.txt").read_text() == local.read_text()
