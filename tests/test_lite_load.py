"""The lite load (decoding.lite_m2m100) against the Hugging Face load of the same folder: the same weights,
languages, token ids and decoded texts, and the same translations, greedy and beam; a folder it does not
cover loads through transformers."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch

from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.lite_m2m100 import lite_unsupported_reason
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.translate import SearchSettings, translate
from tests.conftest import synthetic_sentences

DEMO_MODEL = Path(__file__).resolve().parent.parent / "models" / "demo"


@pytest.fixture(scope="module", params=["tiny", "demo"])
def pair(request, tiny_model_dir):
    path = tiny_model_dir if request.param == "tiny" else DEMO_MODEL
    if not (path / "config.json").exists():
        pytest.skip(f"{path} is not built")
    if lite_unsupported_reason(path) is not None:
        pytest.skip(f"{path}: {lite_unsupported_reason(path)}")
    return Seq2SeqAdapter.load(path, lite=True), Seq2SeqAdapter.load(path)


def _texts() -> list[str]:
    odd = ["Hello </s> world", "__de__ a tag", "", "   ", "ünïcödé ✓ 日本語", "x" * 40]
    return synthetic_sentences("en", 60, seed=3) + odd


def test_the_lite_load_reads_what_transformers_reads(pair):
    lite, hf = pair
    assert lite.lite and not hf.lite and lite.engine == "static"
    assert torch.equal(lite.output_weight, hf.output_weight)
    assert (lite.output_bias is None) == (hf.output_bias is None)
    assert lite.fingerprint == hf.fingerprint
    assert lite.languages == hf.languages and lite.always_active_ids() == hf.always_active_ids()
    assert (lite.eos_id, lite.pad_id, lite.decoder_start_id) == (hf.eos_id, hf.pad_id, hf.decoder_start_id)
    assert (lite.early_stopping, lite.suppressed_ids()) == (hf.early_stopping, hf.suppressed_ids())
    texts = _texts()
    assert lite.tokenize(texts, "en", "it") == hf.tokenize(texts, "en", "it")
    assert lite.tokenize_targets(texts, "it") == hf.tokenize_targets(texts, "it")
    rng = random.Random(0)
    seqs = [[rng.randrange(lite.n_vocab) for _ in range(rng.randrange(1, 12))] for _ in range(300)]
    assert lite.decode_ids(seqs) == hf.decode_ids(seqs)


@pytest.mark.parametrize("beam", [1, 3])
def test_the_lite_load_translates_as_transformers_loads(pair, beam):
    lite, hf = pair
    texts = _texts()
    search = SearchSettings(beam=beam, max_len=24)
    ours = translate(lite, make_projection(lite, "full"), texts, "en", "it", search, progress=False)
    theirs = translate(hf, make_projection(hf, "full"), texts, "en", "it", search, progress=False)
    assert ours.hypotheses == theirs.hypotheses


def test_the_lite_model_refuses_what_needs_transformers(pair):
    lite, _ = pair
    batch = lite.encode_texts(["a b"], "en", "it")
    with pytest.raises(RuntimeError, match="Hugging Face model"):
        lite.teacher_forced(lite.encode(batch), "it", [[lite.eos_id]], max_len=4)


def test_a_folder_the_lite_load_does_not_cover_loads_through_transformers(tiny_model_dir, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["activation_function"] = "gelu_new"  # an activation the lite modules do not build
    (folder / "config.json").write_text(json.dumps(config))
    assert "activation" in (lite_unsupported_reason(folder) or "")
    adapter = Seq2SeqAdapter.load(folder, lite=True)
    assert not adapter.lite
