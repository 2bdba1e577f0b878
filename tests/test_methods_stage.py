"""The methods stage and its task: artifacts of lsh and graph built from the tiny model, skipped when valid,
rebuilt when settings change or bytes rot, refused for another model; the ``methods:`` config section; the
records the driver logs to MLflow (their fields; the logging itself is tests/test_pipeline.py's)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fastvocab.artifacts_schema.method_index import MANIFEST_FILE, TENSORS_FILE, load_method_index
from fastvocab.kernels.lsh import LshParams
from fastvocab.kernels.shortlist import ShortlistOptions
from fastvocab.pipeline.config import load_config
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.stages import STAGES
from fastvocab.tasks import methods as tm
from tests.conftest import write_en_it_split

pytest.importorskip("faiss")


class InlineRay:
    """The RaySession surface the stage uses, running every task in this process."""

    def run_tasks(self, fn, calls, bar, *, num_cpus=1, num_gpus=0):
        out = {}
        for name, (args, kwargs) in calls.items():
            out[name] = fn(*args, **kwargs)
            bar.update(1)
        return out

    def shutdown(self) -> None:
        return None


@pytest.fixture(scope="module")
def adapter(tiny_model_dir):
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    return Seq2SeqAdapter.load(tiny_model_dir)


def config(tmp_path: Path, model: Path, **overrides):
    base = {
        "work_dir": str(tmp_path / "work"),
        "model": str(model),
        "directions": ["en-it"],
        "methods.build": ["lsh", "graph"],
        "methods.lsh.bits": 64,
        "methods.graph.m": 8,
        "methods.graph.ef_construction": 40,
    }
    return load_config(None, {**base, **overrides})


def run_stage(cfg):
    from fastvocab.pipeline.stages.methods import run

    return {r.unit: r for r in run(StageContext(cfg, InlineRay(), progress=False))}


# ---------------------------------------------------------------------------------------------- the task


@pytest.mark.parametrize(("method", "params"), [("lsh", LshParams(bits=32)), ("graph", None)])
def test_build_method_index_saves_what_the_projection_loads(tmp_path, adapter, method, params):
    from fastvocab.kernels.graph import GraphParams
    from fastvocab.tasks.projections import make_projection

    params = params or GraphParams(m=8, ef_construction=40)
    out = tm.index_dir(tmp_path, method)
    assert out == tmp_path / method / "all"
    index = tm.build_method_index(method, tm.BuildInputs.from_adapter(adapter), params, out)
    loaded = load_method_index(out, method, expect_fingerprint=adapter.fingerprint, direction="it-en")
    assert loaded.manifest.params == tm.params_dict(params) and loaded.manifest.direction == "*"
    assert loaded.nbytes == index.nbytes > 0
    proj = make_projection(adapter, method, k=5, index=out)
    assert proj(adapter.output_weight[:3]).ids.shape[0] == 3
    assert tm.index_current(out, method, params, adapter.fingerprint, "*") is not None
    assert tm.index_current(out, method, params, "sha256:other", "*") is None


def test_unknown_or_missing_builders_and_wrong_directions_are_refused(adapter, monkeypatch):
    inputs = tm.BuildInputs.from_adapter(adapter)
    with pytest.raises(ValueError, match="no offline artifact for method 'full'"):
        tm.build_method_index("full", inputs, None)
    per_direction = tm.BuildInputs.from_adapter(adapter, direction="en-it")
    with pytest.raises(ValueError, match="direction must be"):
        tm.build_method_index("lsh", per_direction, LshParams())
    assert tm.directions_for("lsh", ["en-it", "it-en"]) == ["*"]
    assert tm.directions_for("shortlist", ["en-it", "it-en"]) == ["en-it", "it-en"]
    assert tm.index_dir("r", "shortlist", "en-it") == Path("r/shortlist/en-it")


def test_shortlist_hook_builds_one_index_per_direction_from_the_corpus(tmp_path, adapter):
    shortlist = pytest.importorskip("fastvocab.tasks.shortlist")
    write_en_it_split(tmp_path / "corpus", "train", 40, seed=0)
    inputs = tm.BuildInputs.from_adapter(adapter, "en-it", tmp_path / "corpus")
    out = tm.index_dir(tmp_path / "methods", "shortlist", "en-it")
    params = shortlist.ShortlistParams(k=5, frequent=10, iterations=2)
    tm.build_method_index("shortlist", inputs, params, out)
    loaded = load_method_index(out, "shortlist", expect_fingerprint=adapter.fingerprint, direction="en-it")
    assert loaded.manifest.params == tm.params_dict(params)
    with pytest.raises(ValueError, match="needs the adapter and the corpus"):
        tm.build_method_index("shortlist", tm.BuildInputs.from_adapter(adapter, "en-it"), params)


# ---------------------------------------------------------------------------------------------- the config


def test_config_section_defaults_to_nothing_and_is_typed(tmp_path):
    cfg = load_config(None)
    assert cfg.methods.build == []
    assert STAGES.index("maps") < STAGES.index("methods") < STAGES.index("translate")
    cfg = load_config(None, {"methods.build": ["lsh"], "methods.lsh.bits": 512, "methods.lsh.rotate": True})
    assert cfg.methods.params("lsh") == LshParams(bits=512, seed=0, rotate=True)
    assert cfg.methods.params("graph").m == 32
    with pytest.raises(UserError, match="no offline artifact for clustered"):
        load_config(None, {"methods.build": ["clustered"]})
    with pytest.raises(UserError, match=r"methods\.graph\.M"):
        load_config(None, {"methods.graph.M": 3})


def test_stage_without_methods_does_nothing(tmp_path, tiny_model_dir):
    assert run_stage(config(tmp_path, tiny_model_dir, **{"methods.build": []})) == {}
    assert not (tmp_path / "work" / "methods").exists()


# ---------------------------------------------------------------------------------------------- the stage


def test_stage_builds_skips_and_rebuilds(tmp_path, tiny_model_dir):
    cfg = config(tmp_path, tiny_model_dir)
    first = run_stage(cfg)
    assert {u: r.status for u, r in first.items()} == {"lsh:all": "ran", "graph:all": "ran"}
    root = tmp_path / "work" / "methods"
    for unit, method in (("lsh:all", "lsh"), ("graph:all", "graph")):
        rec = first[unit]
        assert rec.metrics["index_bytes"] > 0 and rec.metrics["build_seconds"] >= 0
        assert rec.artifacts == [root / method / "all" / MANIFEST_FILE]
        assert rec.params["method"] == method and rec.params["direction"] == "*"
    assert first["lsh:all"].params["bits"] == 64 and first["graph:all"].params["m"] == 8

    again = run_stage(cfg)
    assert {r.status for r in again.values()} == {"skipped"}

    changed = run_stage(config(tmp_path, tiny_model_dir, **{"methods.lsh.bits": 128}))
    assert changed["lsh:all"].status == "ran" and changed["graph:all"].status == "skipped"
    assert load_method_index(root / "lsh" / "all", "lsh").manifest.params["bits"] == 128

    data = bytearray((root / "graph" / "all" / TENSORS_FILE).read_bytes())
    data[-1] ^= 0xFF
    (root / "graph" / "all" / TENSORS_FILE).write_bytes(bytes(data))
    rotten = run_stage(config(tmp_path, tiny_model_dir, **{"methods.lsh.bits": 128}))
    assert rotten["graph:all"].status == "ran" and rotten["lsh:all"].status == "skipped"
    assert not list(root.glob("**/*.tmp*"))  # atomic writes leave nothing behind


def test_stage_builds_one_shortlist_per_direction_from_the_config(tmp_path, tiny_model_dir):
    pytest.importorskip("fastvocab.tasks.shortlist")
    corpus = tmp_path / "corpus"
    write_en_it_split(corpus, "train", 40, seed=0)
    overrides = {
        "corpus.out_dir": str(corpus),
        "directions": ["en-it", "it-en"],
        "methods.build": ["shortlist"],
        "methods.shortlist.k": 5,
        "methods.shortlist.frequent": 10,
        "methods.shortlist.iterations": 2,
        "methods.shortlist.max_sentences": 30,
    }
    cfg = config(tmp_path, tiny_model_dir, **overrides)
    params = cfg.methods.params("shortlist")
    assert (params.k, params.frequent, params.iterations, params.max_sentences) == (5, 10, 2, 30)
    first = run_stage(cfg)
    assert {u: r.status for u, r in first.items()} == {"shortlist:en-it": "ran", "shortlist:it-en": "ran"}
    root = tmp_path / "work" / "methods" / "shortlist"
    for direction in ("en-it", "it-en"):
        idx = load_method_index(root / direction, "shortlist", direction=direction)
        assert idx.manifest.direction == direction and idx.manifest.params["k"] == 5
        assert first[f"shortlist:{direction}"].params["max_sentences"] == 30
    assert {r.status for r in run_stage(cfg).values()} == {"skipped"}
    with pytest.raises(UserError, match=r"methods\.shortlist\.k"):
        load_config(None, {"methods.shortlist.k": 0})

    # the translate stage plans lsh/graph/shortlist from these artifacts, and says why when one is missing
    from fastvocab.pipeline.stages.translate import _method_plan

    ctx = StageContext(cfg, InlineRay(), progress=False)
    options, prov = _method_plan(ctx, "it-en", "shortlist")
    assert options == ShortlistOptions(str(root / "it-en"), direction="it-en")
    assert prov["index_digest"].startswith("sha256:")
    reason = _method_plan(ctx, "en-it", "lsh")
    assert isinstance(reason, str) and "methods.build" in reason

    # methods.publish: the tables written compact, laid out as the methods root; an unchanged one is not
    # written again
    pub = tmp_path / "shipped"
    published = config(tmp_path, tiny_model_dir, **overrides, **{"methods.publish": str(pub)})
    assert {r.status for r in run_stage(published).values()} == {"skipped"}
    for direction in ("en-it", "it-en"):
        idx = load_method_index(pub / "shortlist" / direction, "shortlist", direction=direction)
        plain = load_method_index(root / direction, "shortlist")
        assert idx.manifest.encoding["plain_digest"] == plain.manifest.tensors_digest
        assert np.array_equal(idx.tensors["indices"], plain.tensors["indices"])
    stamp = (pub / "shortlist" / "en-it" / MANIFEST_FILE).stat().st_mtime_ns
    run_stage(published)
    assert (pub / "shortlist" / "en-it" / MANIFEST_FILE).stat().st_mtime_ns == stamp

    # translate.shortlist: the clustered method's plan names the table whose candidates join the sets

    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.artifacts_schema.errors import ArtifactError
    from tests.layers import map_from_sets

    fp = ctx.model().fingerprint
    n, d = ctx.model().n_vocab, ctx.model().d
    save_cluster_map(map_from_sets(np.zeros((1, d)), [[0, 1]], n, fp), tmp_path / "work" / "maps" / "en-it")
    hybrid = config(
        tmp_path, tiny_model_dir, **overrides, **{"translate.shortlist": str(tmp_path / "work" / "methods")}
    )
    hctx = StageContext(hybrid, InlineRay(), progress=False)
    options, prov = _method_plan(hctx, "en-it", "clustered")
    assert options.shortlist == str(root / "en-it") and prov["shortlist_digest"].startswith("sha256:")
    assert "shortlist" not in prov["options"]  # named by its digest, not its path
    (root / "en-it").rename(root / "held")
    (root / "it-en").rename(root / "en-it")  # a table of the other direction, copied into place
    with pytest.raises(ArtifactError, match="not a en-it shortlist"):
        _method_plan(hctx, "en-it", "clustered")
    (root / "en-it").rename(root / "it-en")
    assert "no shortlist table at" in _method_plan(hctx, "en-it", "clustered")
