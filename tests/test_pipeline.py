"""End to end: ``fastvocab run`` on the tiny model with local Ray (one session for the module), 2 directions.

Checks the outputs (hive-partitioned shards that validate, one map per direction with a manifest), the MLflow
store (parent run, child runs, metrics, artifacts), resume (a rerun skips everything and changes no output
file), determinism (same seed and data -> byte-identical centroids and maps) and a corrupt shard.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml

from fastvocab.artifacts_schema.cluster_map import load_cluster_map
from fastvocab.artifacts_schema.hidden_states import validate_direction
from fastvocab.pipeline.cli import main
from fastvocab.pipeline.config import load_config
from fastvocab.pipeline.run import run_pipeline
from fastvocab.pipeline.tracking import SAMPLE_TABLE, TRACKING_FILES
from tests.conftest import write_en_it_split

DIRECTIONS = ["en-it", "it-en"]
STAGES = "corpus,dump,kmeans,maps,translate,evaluate"
FIRST_RUN: dict[str, int] = {}  # what the module's first run logged on the driver


class _CountFingerprints(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.calls = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.calls += "fingerprinted" in record.getMessage()


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_model_dir, ray_session):
    env = pytest.MonkeyPatch()
    env.delenv(
        "MLFLOW_TRACKING_URI", raising=False
    )  # the default store (a SQLite file in work_dir) is tested
    yield _first_run(tmp_path_factory, tiny_model_dir)
    env.undo()


def _first_run(tmp_path_factory, tiny_model_dir):
    root = tmp_path_factory.mktemp("pipeline")
    write_en_it_split(root / "corpus", "train", 60, seed=1)
    cfg = {
        "work_dir": str(root / "work"),
        "model": str(tiny_model_dir),
        "directions": DIRECTIONS,
        "corpus": {"out_dir": str(root / "corpus")},
        "dump": {
            "sentences": 40,
            "stream_sentences": 12,
            "k": 3,
            "batch_size": 8,
            "shard_sentences": 20,
            "max_len": 8,
            "num_workers": 2,
        },
        "kmeans": {"r": 8, "niter": 10, "seed": 7},
        "maps": {"scope": "direction"},
        "translate": {"batch_size": 8, "max_len": 8},
        "eval": {"split": "train", "sentences": 6, "methods": ["full", "clustered", "no-such-method"]},
    }
    cfg_path = root / "run.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    logger = logging.getLogger("fastvocab.artifacts_schema.fingerprint")
    counter, level = _CountFingerprints(), logger.level
    logger.addHandler(counter)
    logger.setLevel(logging.DEBUG)
    try:
        result = run_pipeline(
            load_config(cfg_path), stages=STAGES.split(","), progress=False, log_to_driver=False
        )
    finally:
        logger.removeHandler(counter)
        logger.setLevel(level)
    FIRST_RUN["fingerprint_calls"] = counter.calls
    return cfg_path, load_config(cfg_path), result


def output_hashes(work_dir: Path) -> dict[str, str]:
    out = {}
    for p in sorted(work_dir.rglob("*")):
        rel = p.relative_to(work_dir)
        if p.is_file() and rel.parts[0] not in TRACKING_FILES:
            out[str(rel)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_first_run_writes_valid_shards_and_one_map_per_direction(setup):
    _, cfg, result = setup
    status = {(r.stage, r.unit): r.status for r in result.records}
    for d in DIRECTIONS:
        assert status[("dump", d)] == status[("kmeans", d)] == status[("maps", d)] == "ran"
    states = cfg.work_dir / "states"
    for d in DIRECTIONS:
        files = validate_direction(states, d)
        assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet"]
    # hive partitioning: the direction comes back as a column
    table = ds.dataset(states, format="parquet", partitioning="hive").to_table(columns=["direction", "step"])
    assert set(table.column("direction").to_pylist()) == set(DIRECTIONS)
    per_direction = {d: table.filter(ds.field("direction") == d).num_rows for d in DIRECTIONS}
    assert all(v > 0 for v in per_direction.values())

    for d in DIRECTIONS:
        cmap = load_cluster_map(cfg.work_dir / "maps" / d)
        m = cmap.manifest
        assert (m.direction, m.scope, m.r, m.k, m.niter, m.seed) == (d, "direction", 8, 3, 10, 7)
        assert m.extra["stored_states"] == per_direction[d]
        assert m.extra["streamed_states"] > 0  # 12 further sentences, counted but not stored
        assert m.states_used == m.extra["stored_states"] + m.extra["streamed_states"]
        frac = np.diff(cmap.indptr) / m.n_vocab
        assert m.active_fraction["mean"] == pytest.approx(frac.mean()) and 0 < frac.max() <= 1
        assert int(cmap.counts.sum()) == 3 * m.states_used  # every state adds its K distinct ids once
        assert m.model_fingerprint.startswith("sha256:")
    assert not list(cfg.work_dir.rglob("*.tmp")), "no temporary files left behind"


def test_the_driver_fingerprints_the_model_once_per_run(setup):
    # every stage ran; the workers get the fingerprint from the driver (tests/test_run_context.py)
    _, _, result = setup
    assert {r.status for r in result.records if r.stage != "corpus"} == {"ran"}
    assert FIRST_RUN["fingerprint_calls"] == 1


def test_translate_and_evaluate_use_the_maps(setup):
    _, cfg, result = setup
    by = {(r.stage, r.unit): r for r in result.records}
    for d in DIRECTIONS:
        tr = by[("translate", d)]
        assert tr.status == "ran" and "no-such-method" in tr.message  # unknown method: reported, run goes on
        assert "map:" + d + "/direction/r8/K3" in tr.params["signature_clustered"]
        for method in ("full", "clustered"):
            table = pq.read_table(cfg.work_dir / "translations" / d / f"{method}.parquet")
            assert table.num_rows == 6 and set(table.column("method").to_pylist()) == {method}
        ev = by[("evaluate", d)]
        assert ev.status == "ran" and 0.0 <= ev.metrics["search_error_rate_clustered"] <= 1.0
        scores = json.loads((cfg.work_dir / "eval" / f"{d}.json").read_text())
        assert set(scores["methods"]) == {"full", "clustered"}
        assert (
            scores["methods"]["clustered"]["search_error_rate"] == ev.metrics["search_error_rate_clustered"]
        )


def test_mlflow_parent_run_has_child_runs_metrics_and_artifacts(setup):
    from mlflow import MlflowClient

    _, cfg, result = setup
    client = MlflowClient(result.tracking_uri)
    assert result.tracking_uri == f"sqlite:///{cfg.work_dir.resolve() / 'mlflow.db'}"
    parent = client.get_run(result.parent_run_id)
    assert parent.info.status == "FINISHED"
    assert parent.data.params["kmeans.r"] == "8" and parent.data.tags["fastvocab.all_skipped"] == "false"
    assert [a.path for a in client.list_artifacts(parent.info.run_id)] == ["config.json"]
    exp = parent.info.experiment_id
    children = client.search_runs([exp], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_name = {r.info.run_name: r for r in children}
    assert len(children) == len(result.records) == 6 * len(DIRECTIONS)

    dump = by_name["dump:en-it"]
    assert dump.data.metrics["states_per_s_per_worker"] > 0 and dump.data.metrics["states_dumped"] > 0
    fingerprint = load_cluster_map(cfg.work_dir / "maps" / "en-it").manifest.model_fingerprint
    assert dump.data.params["model_fingerprint"] == fingerprint == mp_fingerprint(by_name)
    km = by_name["kmeans:it-en"]
    history = client.get_metric_history(km.info.run_id, "objective_by_iteration")
    assert 1 <= len(history) <= 10 and history[-1].value <= history[0].value
    assert km.data.params["r"] == "8" and km.data.params["niter"] == "10"
    mp = by_name["maps:en-it"]
    assert 0 < mp.data.metrics["active_fraction_mean"] <= mp.data.metrics["active_fraction_max"] <= 1
    assert mp.data.metrics["active_fraction_mean_k1"] <= mp.data.metrics["active_fraction_mean"]
    arts = {a.path for a in client.list_artifacts(mp.info.run_id)}
    assert {"manifest.json", "active_fraction.png", "active_fraction.csv"} <= arts
    png = Path(client.download_artifacts(mp.info.run_id, "active_fraction.png"))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert by_name["corpus:en-it"].data.tags["fastvocab.status"] == "skipped"  # the test wrote the corpus

    # each child run spans its stage's work (the dump's wall time at least), the parent all of them
    assert dump.info.end_time - dump.info.start_time >= 1000 * dump.data.metrics["stage_wall_seconds"] - 1
    assert parent.info.start_time <= min(r.info.start_time for r in children)
    assert parent.info.end_time >= max(r.info.end_time for r in children)
    assert parent.info.end_time - parent.info.start_time >= 1000 * parent.data.metrics["seconds"] - 1
    tags = parent.data.tags
    assert tags["fastvocab.stages"] == "dump,kmeans,maps,translate,evaluate"  # those that ran
    assert tags["fastvocab.stages_skipped"] == "corpus" and tags["fastvocab.stages_selected"] == STAGES

    # a reviewer reads the translations: source, reference and each method's hypothesis, as a table
    tr = by_name["translate:en-it"]
    sample = json.loads(Path(client.download_artifacts(tr.info.run_id, SAMPLE_TABLE)).read_text())
    assert sample["columns"] == ["id", "source", "reference", "hypothesis_full", "hypothesis_clustered"]
    assert len(sample["data"]) == 6  # eval.sentences, below SAMPLE_ROWS
    full = pq.read_table(cfg.work_dir / "translations" / "en-it" / "full.parquet").to_pylist()
    assert [row[1] for row in sample["data"]] == [r["source"] for r in full]
    assert [row[3] for row in sample["data"]] == [r["translation"] for r in full]
    assert all(row[2] for row in sample["data"])  # the references


def mp_fingerprint(by_name):
    return by_name["maps:en-it"].data.params["model_fingerprint"]


def test_rerun_skips_everything_and_changes_no_output_file(setup, capsys):
    cfg_path, cfg, first = setup
    before = output_hashes(cfg.work_dir)
    assert any(k.startswith("states/direction=en-it/") for k in before)
    assert main(["run", str(cfg_path), "--stages", STAGES, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "0 ran, 12 skipped" in out
    assert "dump      en-it skipped     2 shards valid" in out
    assert output_hashes(cfg.work_dir) == before

    from mlflow import MlflowClient

    client = MlflowClient(first.tracking_uri)
    runs = client.search_runs(
        [client.get_run(first.parent_run_id).info.experiment_id], order_by=["start_time DESC"]
    )
    latest_parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    assert latest_parent.info.run_id != first.parent_run_id
    assert latest_parent.data.tags["fastvocab.all_skipped"] == "true"
    assert latest_parent.data.tags.get("fastvocab.stages", "") == ""  # no stage ran
    assert latest_parent.data.tags["fastvocab.stages_skipped"] == STAGES


def test_same_seed_same_data_gives_byte_identical_centroids_and_maps(setup):
    _, cfg, _ = setup
    w = cfg.work_dir
    files = [w / "kmeans" / d / "centroids.safetensors" for d in DIRECTIONS]
    files += [w / "maps" / d / "map.safetensors" for d in DIRECTIONS]
    before = {f: f.read_bytes() for f in files}
    shutil.rmtree(w / "kmeans")
    shutil.rmtree(w / "maps")
    result = run_pipeline(cfg, stages=["kmeans", "maps"], progress=False, log_to_driver=False)
    assert {r.status for r in result.records} == {"ran"}
    for f, data in before.items():
        assert f.read_bytes() == data, f


def test_map_of_another_model_is_rebuilt_not_an_error(setup):
    _, cfg, _ = setup
    manifest = cfg.work_dir / "maps" / "en-it" / "manifest.json"
    data = json.loads(manifest.read_text())
    good = data["model_fingerprint"]
    data["model_fingerprint"] = "sha256:another-model"
    manifest.write_text(json.dumps(data))
    result = run_pipeline(cfg, stages=["maps"], progress=False, log_to_driver=False)
    assert {r.unit: r.status for r in result.records} == {"en-it": "ran", "it-en": "skipped"}
    assert json.loads(manifest.read_text())["model_fingerprint"] == good


def test_corrupt_shard_is_redone_and_the_run_names_it(setup, capsys):
    cfg_path, cfg, _ = setup
    shard = cfg.work_dir / "states" / "direction=it-en" / "part-00001.parquet"
    good = shard.read_bytes()
    shard.write_bytes(good[: len(good) // 2])  # damaged after it was written: its checksum no longer matches
    assert main(["run", str(cfg_path), "--stages", STAGES, "--no-progress", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "dump      it-en ran" in out and "corrupt shards redone: part-00001.parquet" in out, out
    assert shard.read_bytes() == good  # deterministic decoding: the same bytes again, so nothing else reran
    assert "1 ran, 11 skipped" in out


def test_a_build_killed_between_directions_resumes_without_redoing_the_finished_one(setup, capsys):
    """Killed while dumping it-en (en-it's shards done, it-en's second not yet, no map built): the rerun
    keeps every finished shard, writes only the missing one, and builds both directions' maps."""
    cfg_path, cfg, _ = setup
    w = cfg.work_dir
    gone = w / "states" / "direction=it-en" / "part-00001.parquet"
    gone.unlink()
    (gone.parent / f"_{gone.name}.sha256").unlink()
    for stage in ("kmeans", "maps", "stream", "translations", "eval"):
        shutil.rmtree(w / stage, ignore_errors=True)
    kept = {k: v for k, v in output_hashes(w).items() if k.startswith("states/")}
    assert main(["run", str(cfg_path), "--stages", STAGES, "--no-progress", "--no-mlflow"]) == 0
    out = capsys.readouterr().out
    assert "dump      en-it skipped     2 shards valid" in out, out
    assert "dump      it-en ran         1 of 2 shards written" in out, out
    after = output_hashes(w)
    assert {k: after[k] for k in kept} == kept  # every finished shard, of both directions, untouched
    assert all(load_cluster_map(w / "maps" / d).manifest.direction == d for d in DIRECTIONS)
