"""Demo-model training on a synthetic corpus with a micro model: loss goes down, resume continues the same
run, the saved folder reloads offline, tags the target language and has no output bias."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from fastvocab.artifacts_schema.corpus import CORPUS_SCHEMA
from fastvocab.training import (
    BatchStream,
    TrainConfig,
    collate,
    encode_direction,
    load_checkpoint,
    train_demo,
)

# A word-for-word lexicon: word i of every language means the same thing, so the mapping is learnable in a
# few dozen steps while still needing the target tag (fr and it share the source language).
LEXICON = {
    lang: words.split()
    for lang, words in {
        "en": "the a package for library tool data file system server client network sound small fast",
        "it": "il un pacchetto per libreria strumento dati file sistema server client rete suono piccolo "
        "veloce",
        "fr": "le un paquet pour bibliothèque outil données fichier système serveur client réseau son petit "
        "rapide",
    }.items()
}
MICRO = dict(vocab=160, d_model=32, ffn=64, heads=2, enc_layers=1, dec_layers=1)


def write_corpus(root: Path, pairs=(("en", "it"), ("en", "fr")), sizes=(400, 40, 40), seed: int = 0) -> Path:
    rng = random.Random(seed)
    for l1, l2 in pairs:
        for split, n in zip(("train", "dev", "test"), sizes, strict=True):
            rows = [[rng.randrange(len(LEXICON["en"])) for _ in range(rng.randint(2, 8))] for _ in range(n)]
            table = pa.table(
                {
                    "id": list(range(n)),
                    "doc_id": [f"{split}{i}" for i in range(n)],
                    "text1": [" ".join(LEXICON[l1][w] for w in r) for r in rows],
                    "text2": [" ".join(LEXICON[l2][w] for w in r) for r in rows],
                },
                schema=CORPUS_SCHEMA,
            )
            (root / f"{l1}-{l2}").mkdir(parents=True, exist_ok=True)
            pq.write_table(table, root / f"{l1}-{l2}" / f"{split}.parquet")
    return root


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"))


def micro_config(corpus: Path, root: Path, **kw) -> TrainConfig:
    base = dict(
        corpus=corpus,
        out=root / "model",
        work_dir=root / "work",
        arch=MICRO,
        batch_tokens=400,
        lr=3e-3,
        warmup=10,
        log_every=5,
        dev_loss_sentences=16,
        dev_sentences=8,
        max_len=32,
        spm_sentences=2000,
        threads=1,
    )
    return TrainConfig(**(base | kw))


def test_batches_respect_token_budget_and_upsample_small_directions():
    lengths = {"a-b": np.full(1000, 10), "b-a": np.full(1000, 10), "c-d": np.full(10, 30)}
    stream = BatchStream(lengths, batch_tokens=120, temperature=2.0, seed=0)
    batches = stream.epoch_batches(0)
    sizes = {d: 0 for d in stream.directions}
    for b in batches:
        longest = max(lengths[stream.directions[k]][i] for k, i in b)
        assert len(b) * longest <= 120
        for k, _ in b:
            sizes[stream.directions[k]] += 1
    # natural share of c-d is 10/2010; with T=2 it is sqrt(10)/(2*sqrt(1000)+sqrt(10)) ~ 4.8%
    assert sizes["c-d"] / sum(sizes.values()) == pytest.approx(
        np.sqrt(10) / (2 * np.sqrt(1000) + np.sqrt(10)), 0.05
    )
    assert sizes["c-d"] > 10  # upsampled: more draws than examples
    # the stream is a pure function of (seed, epoch, position)
    again = BatchStream(lengths, batch_tokens=120, temperature=2.0, seed=0)
    again.load_state_dict({"epoch": 0, "pos": 3})
    assert np.array_equal(next(iter(again)), batches[3])


def test_collate_follows_m2m100_convention(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    enc = encode_direction(tok, ["the package"], ["il pacchetto"], "en", "it", max_len=64)
    batch = collate([enc], np.array([[0, 0]]), tok.pad_token_id, tok.eos_token_id)
    tok.src_lang, tok.tgt_lang = "en", "it"
    ref = tok(["the package"], text_target=["il pacchetto"], return_tensors="pt")
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    assert torch.equal(batch["labels"], ref["labels"])
    # decoder input: </s> then the labels shifted right (what M2M100 does with labels= and no decoder ids)
    from transformers.models.m2m_100.modeling_m2m_100 import shift_tokens_right

    expected = shift_tokens_right(ref["labels"], tok.pad_token_id, tok.eos_token_id)
    assert torch.equal(batch["decoder_input_ids"], expected)
    assert batch["decoder_input_ids"][0, 1] == tok.convert_tokens_to_ids("__it__")


def test_encode_direction_drops_long_pairs(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    enc = encode_direction(tok, ["the package", "the " * 40], ["il pacchetto", "il"], "en", "it", max_len=16)
    assert len(enc.src) == 1 and enc.dropped == 1


def test_train_resume_save_reload(corpus, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    # one uninterrupted run of 40 steps
    full = train_demo(micro_config(corpus, tmp_path / "full", max_steps=40))
    assert full.steps == 40
    first, last = full.train_log[0]["nll"], full.train_log[-1]["nll"]
    assert last < first - 1.0, f"nll did not go down: {first} -> {last}"

    # the same run stopped at 25 steps, then resumed to 40
    part = micro_config(corpus, tmp_path / "split", max_steps=25)
    assert train_demo(part).steps == 25
    assert load_checkpoint(part.work_dir / "checkpoint.pt")["progress"]["step"] == 25
    resumed = train_demo(micro_config(corpus, tmp_path / "split", max_steps=40))
    assert resumed.steps == 40
    assert resumed.history[0]["step"] == 25  # the history carries over from the first session
    a = load_checkpoint(tmp_path / "full" / "work" / "checkpoint.pt")
    b = load_checkpoint(tmp_path / "split" / "work" / "checkpoint.pt")
    assert a["sampler"] == b["sampler"]
    for name, tensor in a["model"].items():
        assert torch.allclose(tensor, b["model"][name], atol=1e-6), name
    # and it moved after the resume (not a reload of the step-25 weights)
    assert resumed.train_log[-1]["step"] == 40

    # the saved folder: fp16 safetensors, reloads offline, tied head without bias, forces the target tag
    out = tmp_path / "full" / "model"
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.float16}  # noqa: SIM118
    tok = AutoTokenizer.from_pretrained(out, local_files_only=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(out, local_files_only=True, dtype=torch.float32).eval()
    assert model.get_output_embeddings().bias is None
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    tok.src_lang = "en"
    enc = tok(["the package for data", "a small library"], return_tensors="pt", padding=True)
    for lang in ("it", "fr"):
        gen = model.generate(**enc, forced_bos_token_id=tok.get_lang_id(lang), max_length=16)
        assert (gen[:, 0] == tok.eos_token_id).all() and (gen[:, 1] == tok.get_lang_id(lang)).all()
        assert "__" not in " ".join(tok.batch_decode(gen, skip_special_tokens=True))

    summary = json.loads((out / "training_summary.json").read_text())
    assert set(summary["dev"]) == {"en-it", "it-en", "en-fr", "fr-en"}
    card = (out / "README.md").read_text()
    assert "| en-it | 8 |" in card and "no bias" in card


def test_resumed_session_may_change_lr_and_is_recorded(corpus, tmp_path):
    from fastvocab.training import inverse_sqrt

    train_demo(micro_config(corpus, tmp_path, max_steps=4, lr=1e-3, dev_sentences=1))
    result = train_demo(micro_config(corpus, tmp_path, max_steps=6, lr=2e-3, dropout=0.0, dev_sentences=1))
    ckpt = load_checkpoint(tmp_path / "work" / "checkpoint.pt")
    sessions = ckpt["progress"]["sessions"]
    assert [(x["start_step"], x["lr"], x["max_steps"]) for x in sessions] == [(0, 1e-3, 4), (4, 2e-3, 6)]
    assert ckpt["optimizer"]["param_groups"][0]["lr"] == pytest.approx(2e-3 * inverse_sqrt(10)(6))
    assert result.steps == 6
    card = (tmp_path / "model" / "README.md").read_text()
    assert "resumed from its checkpoint" in card


def test_resume_refuses_another_architecture(corpus, tmp_path):
    train_demo(micro_config(corpus, tmp_path, max_steps=2, dev_sentences=1))
    with pytest.raises(ValueError, match="architecture"):
        train_demo(micro_config(corpus, tmp_path, max_steps=4, arch=MICRO | {"d_model": 16}))


def test_cli_help_and_bad_input(tmp_path, capsys):
    from fastvocab.pipeline.cli import main

    with pytest.raises(SystemExit):
        main(["train-demo", "--help"])
    help_text = capsys.readouterr().out
    assert all(p in help_text for p in ("tiny", "cpu", "base", "--max-minutes", "--directions"))
    assert main(["train-demo", "--corpus", str(tmp_path / "missing"), "--output", str(tmp_path / "m")]) == 2
    assert "no corpus" in capsys.readouterr().err
    write_corpus(tmp_path / "c", sizes=(20, 4, 4))
    args = [
        "train-demo",
        "--corpus",
        str(tmp_path / "c"),
        "--output",
        str(tmp_path / "m"),
        "--directions",
        "en_it",
    ]
    assert main(args) == 2
    assert "en_it" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


def test_chunked_loss_matches_plain_loss_and_gradients(tiny_model_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from fastvocab.training import seq2seq_loss

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    enc = encode_direction(
        tok, ["the package for data", "a tool"], ["il pacchetto per dati", "uno strumento"], "en", "it", 64
    )
    batch = collate([enc], np.array([[0, 0], [0, 1]]), tok.pad_token_id, tok.eos_token_id)
    grads, losses = [], []
    for chunk in (None, 3):  # 3 rows per chunk: several chunks and a ragged last one
        model.zero_grad()
        loss, nll, n = seq2seq_loss(model, batch, tok.pad_token_id, 0.1, chunk=chunk)
        loss.backward()
        losses.append((float(loss.detach()), float(nll), n))
        grads.append({k: p.grad.clone() for k, p in model.named_parameters()})
    assert losses[0][2] == losses[1][2] == int((batch["labels"] != tok.pad_token_id).sum())
    assert losses[0][0] == pytest.approx(losses[1][0], rel=1e-5)
    assert losses[0][1] == pytest.approx(losses[1][1], rel=1e-5)
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], rtol=1e-4, atol=1e-6), name


def test_cli_refuses_to_overwrite_a_model(tmp_path, capsys):
    """A model folder is never replaced by default: the shipped models/demo once was, by a listed command."""
    from fastvocab.pipeline.cli import main

    write_corpus(tmp_path / "c", sizes=(20, 4, 4))
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    (shipped / "config.json").write_text("{}")
    (shipped / "training_summary.json").write_text('{"work_dir": "elsewhere"}')
    argv = ["train-demo", "--corpus", str(tmp_path / "c"), "--output", str(shipped), "--max-steps", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a model" in err and "--overwrite" in err
    assert sorted(p.name for p in shipped.iterdir()) == ["config.json", "training_summary.json"]
    assert (shipped / "config.json").read_text() == "{}"


def test_cli_output_defaults_to_the_work_folder_and_resumes_into_its_own(tmp_path, monkeypatch):
    from fastvocab.pipeline.cli import main
    from fastvocab.pipeline.commands import train_demo as command
    from fastvocab.pipeline.errors import UserError

    write_corpus(tmp_path / "c", sizes=(20, 4, 4))
    seen = []

    def fake_train(cfg):
        seen.append(cfg)
        raise ValueError("stop here")

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("fastvocab.training.train_demo", fake_train)
    assert main(["train-demo", "--corpus", "c", "--preset", "tiny"]) == 2
    assert seen[0].out == Path("work/train-demo/tiny/model")
    assert seen[0].work_dir == Path("work/train-demo/tiny")
    # the run's own model (its summary names this work dir) may be saved again: a resumed run
    own = tmp_path / "own"
    own.mkdir()
    (own / "training_summary.json").write_text(json.dumps({"work_dir": "work/own"}))
    command.check_output_free(own, Path("work/own"), overwrite=False)
    with pytest.raises(UserError, match="already holds a model"):
        command.check_output_free(own, Path("work/other"), overwrite=False)
    command.check_output_free(own, Path("work/other"), overwrite=True)
