"""Maps shipped beside a model: published with their build record, evaluated beside the run's own, refused
for another model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fastvocab.artifacts_schema.cluster_map import load_cluster_map, save_cluster_map
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.tasks.publish import BUILD_FILE, publish_maps
from tests.layers import random_layer, random_map


def _maps(root, fingerprint_of=None, seed=0):
    w, b = random_layer(n_vocab=50, d=8, seed=seed)
    for name in ("en-it", "it-en"):
        cmap = random_map(w, b, r=3, size=5, seed=seed)
        cmap.manifest.direction = name
        save_cluster_map(cmap, root / name)
    return root


def test_published_maps_are_copied_once_with_their_record(tmp_path):
    maps = _maps(tmp_path / "maps")
    out = tmp_path / "shipped"
    record = {"model": "models/x", "command": "fastvocab run c.yaml", "commit": "abc"}
    assert publish_maps(maps, ["en-it", "it-en"], out, record) == ["en-it", "it-en"]
    built = json.loads((out / BUILD_FILE).read_text())
    assert built["command"] == "fastvocab run c.yaml" and set(built["maps"]) == {"en-it", "it-en"}
    assert built["maps"]["en-it"]["r"] == 3
    # shipped compact and compressed, read back as the map it was made from
    assert not (out / "en-it" / "map.safetensors").exists()
    assert (out / "en-it" / "map.safetensors.zst").exists()
    a, b = load_cluster_map(out / "en-it"), load_cluster_map(maps / "en-it")
    assert a.manifest.encoding["plain_digest"] == b.manifest.tensors_digest
    assert built["maps"]["en-it"]["tensors_digest"] == a.manifest.tensors_digest
    assert np.array_equal(a.indices, b.indices) and np.array_equal(a.population(), b.population())
    step = np.abs(b.centroids).max(axis=1, keepdims=True) / 127  # int8 rows: half a step of each row
    assert (np.abs(a.centroids - b.centroids) <= step / 2 * (1 + 1e-5)).all()
    (out / "it-en" / "map.safetensors.zst").write_bytes(b"\0" * 8 + b"garbage")
    with pytest.raises(ArtifactError, match="corrupt cluster map tensors"):
        load_cluster_map(out / "it-en")
    # a damaged copy is not current: published again
    assert publish_maps(maps, ["en-it", "it-en"], out, record) == ["it-en"]
    assert (
        load_cluster_map(out / "it-en").manifest.encoding["plain_digest"]
        == load_cluster_map(maps / "it-en").manifest.tensors_digest
    )
    # a rerun with the same maps changes nothing, not even the record
    stamp = (out / BUILD_FILE).stat().st_mtime_ns
    assert publish_maps(maps, ["en-it", "it-en"], out, {**record, "commit": "def"}) == []
    assert (out / BUILD_FILE).stat().st_mtime_ns == stamp
    # a rebuilt map is copied again, and the record says how it was built now
    _maps(tmp_path / "maps", seed=1)
    assert publish_maps(maps, ["en-it", "it-en"], out, {**record, "commit": "def"}) == ["en-it", "it-en"]
    assert json.loads((out / BUILD_FILE).read_text())["commit"] == "def"


def test_publishing_an_unfinished_map_is_an_error(tmp_path):
    (tmp_path / "maps" / "en-it").mkdir(parents=True)
    with pytest.raises(ArtifactError, match="no cluster map"):
        publish_maps(tmp_path / "maps", ["en-it"], tmp_path / "out", {})
    assert not (tmp_path / "out").exists()


@pytest.fixture
def stage_ctx(tiny_model_dir, tmp_path):
    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.context import StageContext

    def make(shipped):
        cfg = load_config(
            None,
            {
                "model": str(tiny_model_dir),
                "work_dir": str(tmp_path / "work"),
                "directions": ["en-it"],
                "eval.maps": {"shipped": str(shipped)},
            },
        )
        return StageContext(cfg, ray=None, progress=False)

    return make


def test_shipped_maps_run_as_their_own_method(stage_ctx, tmp_path):
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.pipeline.stages.translate import _method_plan, eval_methods

    ctx = stage_ctx(tmp_path / "shipped")
    adapter = Seq2SeqAdapter.load(ctx.cfg.model, device="cpu")
    w, b = adapter.output_weight, adapter.output_bias
    cmap = random_map(w.float(), None if b is None else b.float(), r=3, size=20)
    cmap.manifest.model_fingerprint = ctx.model().fingerprint
    save_cluster_map(cmap, tmp_path / "shipped" / "en-it")
    labels = [label for label, _, _ in eval_methods(ctx)]
    assert labels == ["full", "clustered", "clustered-shipped"]
    options, prov = _method_plan(ctx, "en-it", "clustered", "clustered-shipped", tmp_path / "shipped")
    assert prov["method"] == "clustered-shipped" and str(options.cluster_map) == str(
        tmp_path / "shipped" / "en-it"
    )


def test_shipped_maps_serve_a_direction_without_its_own_from_the_pooled_map(stage_ctx, tmp_path):
    """eval.maps finds maps as decoding does: en-it has no map of its own there, to-it serves it."""
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.pipeline.stages.translate import _method_plan

    ctx = stage_ctx(tmp_path / "shipped")
    adapter = Seq2SeqAdapter.load(ctx.cfg.model, device="cpu")
    w, b = adapter.output_weight, adapter.output_bias
    cmap = random_map(w.float(), None if b is None else b.float(), r=3, size=20)
    cmap.manifest.model_fingerprint = ctx.model().fingerprint
    cmap.manifest.direction, cmap.manifest.scope = "to-it", "target"
    save_cluster_map(cmap, tmp_path / "shipped" / "to-it")
    options, prov = _method_plan(ctx, "en-it", "clustered", "clustered-shipped", tmp_path / "shipped")
    assert str(options.cluster_map) == str(tmp_path / "shipped" / "to-it") and prov["map"] == "to-it"


def test_shipped_maps_of_another_model_are_refused_with_the_fingerprint_error(stage_ctx, tmp_path):
    from fastvocab.pipeline.stages.translate import _method_plan

    w, b = random_layer(n_vocab=50, d=8)
    save_cluster_map(random_map(w, b, r=3, size=5), tmp_path / "other" / "en-it")
    ctx = stage_ctx(tmp_path / "other")
    with pytest.raises(
        ArtifactError, match=r"was built for model sha256:\S+, but the loaded model is"
    ) as err:
        _method_plan(ctx, "en-it", "clustered", "clustered-shipped", tmp_path / "other")
    assert "\n" not in str(err.value)


def test_maps_published_by_separate_runs_keep_their_own_records(tmp_path):
    """Directions built by different runs (other text, other settings) share one shipped folder."""
    w, b = random_layer(n_vocab=50, d=8, seed=0)
    runs = {}
    for run, name in (("a", "en-it"), ("b", "en-de")):
        cmap = random_map(w, b, r=3, size=5, seed=0)
        cmap.manifest.direction = name
        save_cluster_map(cmap, tmp_path / run / name)
        runs[run] = {
            "model_fingerprint": cmap.manifest.model_fingerprint,
            "command": f"fastvocab run {run}.yaml",
            "commit": run,
            "sources": {name: {"rows": len(run)}},
        }
    out = tmp_path / "shipped"
    assert publish_maps(tmp_path / "a", ["en-it"], out, runs["a"]) == ["en-it"]
    assert publish_maps(tmp_path / "b", ["en-de"], out, runs["b"]) == ["en-de"]
    built = json.loads((out / BUILD_FILE).read_text())
    assert set(built["maps"]) == {"en-it", "en-de"}
    assert built["maps"]["en-it"]["build"]["command"] == "fastvocab run a.yaml"
    assert built["maps"]["en-de"]["build"]["command"] == "fastvocab run b.yaml"
    assert built["maps"]["en-de"]["build"]["sources"] == {"en-de": {"rows": 1}}
    # another model's record does not carry the earlier entries over
    other = runs["b"] | {"model_fingerprint": "sha256:other"}
    (out / "en-de" / "manifest.json").unlink()  # force a copy
    publish_maps(tmp_path / "b", ["en-de"], out, other)
    assert set(json.loads((out / BUILD_FILE).read_text())["maps"]) == {"en-de"}


def test_no_map_error_names_the_maps_there_and_the_build_command(tmp_path):
    from fastvocab.artifacts_schema.cluster_map import resolve_map_dir

    maps = _maps(tmp_path / "work" / "maps")
    # a work dir is accepted as well as its maps/ folder
    assert resolve_map_dir(tmp_path / "work", "en", "it") == maps / "en-it"
    with pytest.raises(ArtifactError) as exc:
        resolve_map_dir(tmp_path / "work", "en", "de")
    msg = str(exc.value)
    assert "\n" not in msg and "no cluster map for en-de" in msg
    assert "it has maps for en-it, it-en" in msg and "--set 'directions=[en-de]'" in msg


def test_a_direction_without_its_own_map_takes_its_targets_pooled_map(tmp_path):
    from fastvocab.artifacts_schema.cluster_map import resolve_map_dir

    w, b = random_layer(n_vocab=50, d=8, seed=0)
    for name in ("de-en", "to-en"):
        cmap = random_map(w, b, r=3, size=5, seed=0)
        cmap.manifest.direction = name
        save_cluster_map(cmap, tmp_path / name)
    assert resolve_map_dir(tmp_path, "es", "en") == tmp_path / "to-en"  # no es-en: the pooled map
    assert resolve_map_dir(tmp_path, "de", "en") == tmp_path / "de-en"  # its own map first
    with pytest.raises(ArtifactError, match="it has maps for de-en, to-en"):
        resolve_map_dir(tmp_path, "en", "es")
