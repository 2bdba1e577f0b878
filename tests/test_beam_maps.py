"""Maps for the beams users decode with: ``maps.beams`` dumps (and streams) along each beam in one run, the
map records what it covers, and translate says when a map does not cover its beam.

One pipeline run on the tiny model (local Ray, one direction) with ``maps.beams: [1, 2]``; the CLI tests use
hand-made maps of the same model.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import yaml

from fastvocab.artifacts_schema.cluster_map import (
    MAP_SCHEMA_VERSION,
    ClusterMap,
    MapManifest,
    load_cluster_map,
    load_manifest,
    save_cluster_map,
)
from fastvocab.artifacts_schema.hidden_states import read_shard_meta, shard_beam, validate_direction
from fastvocab.artifacts_schema.kmeans_result import load_kmeans
from fastvocab.artifacts_schema.stream_counts import read_stream_arrays
from fastvocab.pipeline.cli import main
from fastvocab.pipeline.config import load_config
from fastvocab.pipeline.run import run_pipeline
from tests.conftest import synthetic_sentences, write_en_it_split

STAGES = ["corpus", "dump", "kmeans", "maps", "translate", "evaluate"]


@pytest.fixture(scope="module")
def beam_run(tmp_path_factory, tiny_model_dir):
    ray = pytest.importorskip("ray")
    env = pytest.MonkeyPatch()
    env.delenv("MLFLOW_TRACKING_URI", raising=False)
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    root = tmp_path_factory.mktemp("beam_maps")
    write_en_it_split(root / "corpus", "train", 40, seed=2)
    cfg = {
        "work_dir": str(root / "work"),
        "model": str(tiny_model_dir),
        "directions": ["en-it"],
        "corpus": {"out_dir": str(root / "corpus")},
        # k: 3 is below what beam 2 needs (4): the run raises it, no refusal
        "dump": {
            "sentences": 16,
            "stream_sentences": 8,
            "k": 3,
            "batch_size": 8,
            "shard_sentences": 8,
            "max_len": 6,
        },
        "kmeans": {"r": 4, "niter": 5, "seed": 3},
        "maps": {"beams": [1, 2]},
        "translate": {"beam": 2, "batch_size": 8, "max_len": 6},
        "eval": {"split": "train", "sentences": 4, "methods": ["full", "clustered"]},
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    try:
        yield path, run_pipeline(load_config(path), stages=STAGES, progress=False, log_to_driver=False)
    finally:
        env.undo()
        if started:
            ray.shutdown()


def test_one_run_dumps_along_both_beams_and_one_map_names_both(beam_run):
    path, result = beam_run
    cfg = load_config(path)
    states = cfg.work_dir / "states"
    greedy = validate_direction(states, "en-it")
    beam2 = validate_direction(states / "beam=2", "en-it")
    assert [f.name for f in greedy] == [f.name for f in beam2] == ["part-00000.parquet", "part-00001.parquet"]
    assert {shard_beam(f) for f in greedy} == {1} and {shard_beam(f) for f in beam2} == {2}
    assert {read_shard_meta(f).k for f in greedy + beam2} == {4}  # dump.k raised to 2 x 2
    rows = {1: sum(map(_rows, greedy)), 2: sum(map(_rows, beam2))}
    assert rows[2] > rows[1] > 0  # several hypotheses per step
    assert sorted(p.parent.parent.name for p in (cfg.work_dir / "stream" / "en-it").rglob("part-*")) == [
        "beam=2",
        "en-it",
    ]  # the streamed sentences' counts, one shard per beam

    cmap = load_cluster_map(cfg.work_dir / "maps" / "en-it")
    m = cmap.manifest
    assert m.schema_version == MAP_SCHEMA_VERSION and m.beams == [1, 2] and m.k == 4
    assert set(m.beam_states) == {"1", "2"} and sum(m.beam_states.values()) == m.states_used
    assert m.extra["stored_states"] == rows[1] + rows[2]
    assert m.beam_states["2"] > rows[2]  # stored plus streamed
    by = {(r.stage, r.unit): r for r in result.records}
    assert by[("maps", "en-it")].params["beams"] == "1,2" and by[("dump", "en-it")].params["beams"] == "1,2"
    assert by[("maps", "en-it")].message.endswith("; beams 1, 2")
    assert by[("translate", "en-it")].status == "ran"


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def test_streaming_along_a_beam_counts_what_storing_its_states_would(beam_run, tmp_path):
    """The beam-2 stream shard's (cluster, token) counts equal those of the same sentences dumped and stored
    along beam 2, assigned to the same centroids."""
    from fastvocab.pipeline.context import StageContext
    from fastvocab.pipeline.stages.dump import stream_specs
    from fastvocab.tasks.context import RunContext, describe_model
    from fastvocab.tasks.dump import DumpDecoder, run_dump_shard
    from fastvocab.tasks.maps import count_shards
    from fastvocab.tasks.row_shards import as_shard_spec

    path, _ = beam_run
    cfg = load_config(path)
    (spec,) = stream_specs(StageContext(cfg, ray=None), "en-it")  # type: ignore[arg-type]
    streamed = read_stream_arrays(
        cfg.work_dir / "stream" / "en-it" / "beam=2" / "direction=en-it" / "part-00000.safetensors"
    )
    assert streamed is not None
    decoder = DumpDecoder(RunContext(describe_model(cfg.model), torch_threads=1), cfg.dump.settings(2))
    run_dump_shard(decoder, as_shard_spec(spec), tmp_path / "stored")
    centroids, _ = load_kmeans(cfg.work_dir / "kmeans" / "en-it")
    stored = count_shards(validate_direction(tmp_path / "stored", "en-it"), centroids, 4, decoder.n_vocab)
    assert int(streamed["shape"][2]) == stored.states > spec.sentences
    np.testing.assert_array_equal(streamed["keys"], stored.keys)
    np.testing.assert_array_equal(streamed["counts"], stored.counts)


def test_rerun_skips_every_beam_and_translate_warns_for_an_uncovered_beam(beam_run, caplog):
    path, _ = beam_run
    with caplog.at_level(logging.WARNING, logger="fastvocab.pipeline.stages.translate"):
        again = run_pipeline(load_config(path), stages=STAGES, progress=False, log_to_driver=False)
    assert {r.status for r in again.records if r.stage != "corpus"} == {"skipped"}
    assert not [r for r in caplog.records if "cluster map" in r.getMessage()]  # beam 2 is covered: silent

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastvocab.pipeline.stages.translate"):
        run_pipeline(
            load_config(path, {"translate.beam": 3}),
            stages=["translate"],
            progress=False,
            log_to_driver=False,
        )
    (line,) = [r.getMessage() for r in caplog.records if "cluster map" in r.getMessage()]
    assert "built for beams [1, 2] (K=4): at beam 3 more outputs may differ from full softmax" in line
    assert "maps.beams=[1, 2, 3]" in line


def test_maps_probes_is_recorded_in_the_map_and_translate_decodes_with_it(beam_run, tmp_path, capsys):
    import shutil

    path, _ = beam_run
    work = shutil.copytree(load_config(path).work_dir, tmp_path / "work")
    before = load_cluster_map(work / "maps" / "en-it")
    assert before.manifest.probes == 1

    def maps_stage(probes: int):
        cfg = load_config(path, {"work_dir": str(work), "maps.probes": probes})
        (rec,) = run_pipeline(cfg, stages=["maps"], progress=False, log_to_driver=False).records
        return rec, load_cluster_map(work / "maps" / "en-it")

    rec, cmap = maps_stage(3)
    assert rec.status == "ran" and rec.params["probes"] == 3 and "; decoded with 3 probes" in rec.message
    assert cmap.manifest.probes == 3
    np.testing.assert_array_equal(cmap.indices, before.indices)  # the sets are as counted
    assert maps_stage(3)[0].status == "skipped"

    def translate_stage() -> str:
        cfg = load_config(path, {"work_dir": str(work), "maps.probes": 3})
        (rec,) = run_pipeline(cfg, stages=["translate"], progress=False, log_to_driver=False).records
        return rec.status

    # the tensors are the same, the decoding is not: translations made with probes 1 are redone, once
    assert translate_stage() == "ran" and translate_stage() == "skipped"

    # fastvocab translate reads the map's probes unless --probes says otherwise
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.pipeline.cli import build_parser
    from fastvocab.pipeline.commands.translate import _check_args
    from fastvocab.tasks.projections import method_projection

    argv = ["translate", "--src-lang", "en", "--tgt-lang", "it", "-i", "x", "-o", "y"]
    argv += ["--method", "clustered", "--clusters", str(work / "maps")]
    adapter = Seq2SeqAdapter.load(load_config(path).model)
    for flags, want in (((), 3), (("--probes", "2"), 2)):
        args = build_parser("translate").parse_args([*argv, *flags])
        options = _check_args(args)  # the map folder resolved, as translate does before the job
        assert method_projection(adapter, options).probes == want

    rec, cmap = maps_stage(1)
    assert rec.status == "ran" and cmap.manifest.probes == 1


# ---- translate's warning, with hand-made maps ----


def _map(model_dir: Path, root: Path, beams: list[int], k: int) -> Path:
    """A map of the tiny model covering every id (so it decodes), recording ``beams`` and ``k``."""
    from fastvocab.tasks.context import describe_model

    ref = describe_model(model_dir)
    r = 2
    centroids = np.random.default_rng(0).standard_normal((r, ref.d)).astype(np.float32)
    ids = np.tile(np.arange(ref.n_vocab, dtype=np.int32), r)
    manifest = MapManifest(
        model_fingerprint=ref.fingerprint,
        direction="en-it",
        scope="direction",
        r=r,
        k=k,
        d=ref.d,
        n_vocab=ref.n_vocab,
        niter=1,
        seed=0,
        states_used=10 * len(beams),
        beams=beams,
        beam_states={str(b): 10 for b in beams},
    )
    indptr = np.arange(r + 1, dtype=np.int64) * ref.n_vocab
    cmap = ClusterMap(manifest, centroids, (centroids**2).sum(1), indptr, ids, np.ones(len(ids), np.int32))
    return save_cluster_map(cmap, root / "en-it")


def _translate(capsys, model_dir: Path, maps: Path, tmp_path: Path, beam: int) -> str:
    inp, out = tmp_path / "in.txt", tmp_path / f"out-{beam}.txt"
    inp.write_text("\n".join(synthetic_sentences("en", 3, seed=9)) + "\n", encoding="utf-8")
    argv = ["translate", "--model", str(model_dir), "--src-lang", "en", "--tgt-lang", "it", "-i", str(inp)]
    argv += ["-o", str(out), "--max-len", "5", "--beam", str(beam), "--method", "clustered"]
    rc = main([*argv, "--clusters", str(maps), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 0 and len(out.read_text(encoding="utf-8").splitlines()) == 3, err
    assert "Traceback" not in err
    return err


def _warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("warning:")]


def test_translate_warns_for_an_uncovered_beam_and_is_silent_for_a_covered_one(
    tiny_model_dir, tmp_path, capsys
):
    maps = tmp_path / "maps"
    _map(tiny_model_dir, maps, beams=[1, 2], k=4)
    for beam in (1, 2):
        assert _warnings(_translate(capsys, tiny_model_dir, maps, tmp_path, beam)) == []
    (line,) = _warnings(_translate(capsys, tiny_model_dir, maps, tmp_path, 3))
    assert f"cluster map {maps / 'en-it'} was built for beams [1, 2] (K=4)" in line
    assert "at beam 3 more outputs may differ from full softmax" in line
    assert line.endswith("rebuild it with fastvocab run CONFIG --set 'maps.beams=[1, 2, 3]'")

    # the beam is covered, but K is below the 2 x beam ids beam search keeps per hypothesis
    small = tmp_path / "small"
    _map(tiny_model_dir, small, beams=[1, 2], k=3)
    (line,) = _warnings(_translate(capsys, tiny_model_dir, small, tmp_path, 2))
    assert "with K=3, below the 4 ids beam 2 needs" in line
    assert _warnings(_translate(capsys, tiny_model_dir, small, tmp_path, 1)) == []


def test_an_old_map_without_beams_gets_the_rebuild_hint_not_a_traceback(tiny_model_dir, tmp_path, capsys):
    maps = tmp_path / "maps"
    folder = _map(tiny_model_dir, maps, beams=[1], k=4)
    manifest = folder / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["beams"], data["beam_states"]
    data["schema_version"] = 3  # as every map before maps recorded their beams
    manifest.write_text(json.dumps(data))
    assert load_manifest(folder).beams == [] and load_cluster_map(folder).manifest.schema_version == 3
    assert _warnings(_translate(capsys, tiny_model_dir, maps, tmp_path, 1)) == []  # greedy maps, as built
    (line,) = _warnings(_translate(capsys, tiny_model_dir, maps, tmp_path, 4))
    assert "does not record which beams it was built for" in line
    assert "rebuild it with fastvocab run CONFIG --set 'maps.beams=[1, 4]'" in line


def test_maps_normaliser_rank_defaults_to_the_kernels_rank_and_a_config_overrides_it():
    from fastvocab.kernels.clustered_load import DEFAULT_NORMALISER_RANK
    from fastvocab.pipeline.config import MapsConfig

    assert MapsConfig().params(dump_k=8).normaliser_rank == DEFAULT_NORMALISER_RANK
    assert MapsConfig(normaliser_rank=64).params(dump_k=8).normaliser_rank == 64
    assert MapsConfig(normaliser_rank=0).params(dump_k=8).normaliser_rank == 0  # isotropic only, not "unset"
