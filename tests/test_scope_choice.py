"""Choosing per direction between its own map and its target's pooled map, by measurement."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.cluster_map import resolve_map_dir, save_cluster_map
from tests.conftest import synthetic_sentences, write_en_it_split
from tests.layers import make, map_from_sets, map_from_states


@pytest.fixture(scope="module")
def adapter(tiny_model_dir):
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    return Seq2SeqAdapter.load(tiny_model_dir)


@pytest.fixture(scope="module")
def maps(adapter, tmp_path_factory):
    """``en-it``: sets of ids the model never ranks first (decoding goes wrong); ``to-it``: every id."""
    from fastvocab.decoding.search import greedy_search

    hs, top = [], []

    def hook(rec):
        hs.append(rec.hidden.float().numpy())
        top.append(torch.topk(rec.output.logits, 1, dim=-1).indices.numpy())

    batch = adapter.encode_texts(synthetic_sentences("en", 12, seed=4), "en", "it")
    greedy_search(adapter, make(adapter, "full"), batch, "en", "it", max_len=10, step_hook=hook)
    base = map_from_states(
        np.concatenate(hs), np.concatenate(top), r=4, n_vocab=adapter.n_vocab, fp=adapter.fingerprint, seed=1
    )
    n = adapter.n_vocab
    seen = set(np.unique(np.concatenate(top)).tolist()) | set(adapter.always_active_ids())
    never = [i for i in range(n) if i not in seen][:4]
    root = tmp_path_factory.mktemp("maps")
    for name, sets in (("en-it", [never] * 4), ("to-it", [list(range(n))] * 4)):
        cmap = map_from_sets(base.centroids, sets, n, adapter.fingerprint)
        cmap.manifest.direction = name
        cmap.manifest.scope = "target" if name.startswith("to-") else "direction"
        save_cluster_map(cmap, root / name)
    return root


def test_the_pooled_map_wins_where_the_own_map_makes_errors(adapter, maps, tmp_path):
    from fastvocab.experiments.fidelity import FidelitySettings
    from fastvocab.experiments.scope_choice import choose_maps

    write_en_it_split(tmp_path / "corpus", "dev", 6, seed=8)
    settings = FidelitySettings(beams=(1,), batches=(3,), methods=("clustered",), split="dev", max_len=8)
    choices = choose_maps(adapter, tmp_path / "corpus", maps, ["en-it"], settings)
    got = choices["en-it"]
    assert set(got["measured"]) == {"en-it", "to-it"}
    assert got["measured"]["to-it"]["search_errors"] == 0.0
    assert got["measured"]["en-it"]["search_errors"] > 0.0
    assert got["map"] == "to-it" and "search errors" in got["why"]
    assert {r["candidate"] for r in got["rows"]} == {"en-it", "to-it"}


def test_within_one_sentence_the_fewer_columns_win():
    from fastvocab.experiments.scope_choice import pick

    measured = {
        "es-en": {"search_errors": 0.02, "active_columns_per_row": 300.0, "sentences": 100.0},
        "to-en": {"search_errors": 0.015, "active_columns_per_row": 500.0, "sentences": 100.0},
    }
    assert pick(measured)[0] == "es-en"  # half a sentence apart: the smaller union
    measured["es-en"]["search_errors"] = 0.04
    assert pick(measured)[0] == "to-en"  # clearly fewer errors


def test_recorded_choice_withdraws_the_loser_and_decoding_falls_back(maps, tmp_path):
    import shutil

    from fastvocab.tasks.publish import BUILD_FILE, publish_maps, record_choices

    out = tmp_path / "shipped"
    fp = json.loads((maps / "en-it" / "manifest.json").read_text())["model_fingerprint"]
    publish_maps(maps, ["en-it", "to-it"], out, {"model_fingerprint": fp, "command": "fastvocab run x"})
    measured = {
        n: {"search_errors": e, "active_columns_per_row": 9.0} for n, e in (("en-it", 0.5), ("to-it", 0))
    }
    removed = record_choices(
        out, {"en-it": {"map": "to-it", "why": "w", "split": "dev", "measured": measured}}
    )
    assert removed == ["en-it"] and not (out / "en-it").exists()
    record = json.loads((out / BUILD_FILE).read_text())
    assert record["serves"]["en-it"]["map"] == "to-it" and set(record["maps"]) == {"to-it"}
    assert resolve_map_dir(out, "en", "it") == out / "to-it"
    # a later run publishing another direction keeps the recorded choice
    publish_maps(maps, ["to-it"], out, {"model_fingerprint": fp, "command": "fastvocab run y"})
    (out / "to-it" / "manifest.json").unlink()  # force the copy, and so a new record
    publish_maps(maps, ["to-it"], out, {"model_fingerprint": fp, "command": "fastvocab run y"})
    assert json.loads((out / BUILD_FILE).read_text())["serves"]["en-it"]["map"] == "to-it"
    shutil.rmtree(out / "to-it")
    with pytest.raises(Exception, match="is not published"):
        record_choices(out, {"en-it": {"map": "to-it", "why": "w", "split": "dev", "measured": measured}})


def test_the_command_writes_the_choice_and_every_row(tiny_model_dir, maps, tmp_path, capsys):
    from fastvocab.pipeline.cli import main

    write_en_it_split(tmp_path / "corpus", "dev", 4, seed=8)
    out = tmp_path / "scope.json"
    argv = ["bench", "scope", "--model", str(tiny_model_dir), "--corpus", str(tmp_path / "corpus")]
    argv += ["--clusters", str(maps), "--directions", "en-it", "--sentences", "4", "--max-len", "8"]
    assert main([*argv, "--threads", "1", "-o", str(out)]) == 0
    assert capsys.readouterr().out.startswith("en-it: to-it (")
    record = json.loads(out.read_text())
    assert record["benchmark"] == "scope" and record["meta"]["split"] == "dev"
    assert record["choices"]["en-it"]["map"] == "to-it" and "rows" not in record["choices"]["en-it"]
    assert {r["candidate"] for r in record["results"]} == {"en-it", "to-it"}
