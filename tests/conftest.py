"""Shared fixtures: a tiny random-weight M2M100 model folder built from scratch in a few seconds.

Random weights are enough for everything that checks *equivalence* (search vs generate, clustered vs full,
pipeline plumbing); translation quality is checked on the committed demo model.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fastvocab import switches

# Model fingerprints are remembered across runs by design (decoding/hf_adapter.py): in the suite that would
# make a test that counts hashes depend on what ran before it, and fill the user's cache. A folder that
# cannot exist turns remembering off; tests/test_run_context.py tests it with a folder of its own. It also
# makes engine "auto" the static engine (it would export into a temporary folder each time): tests of the
# ONNX Runtime engine name it, or give the cache a folder (tests/test_onnx_engine.py). Set in the environment,
# not through switches.override, because the commands the tests run in subprocesses must see it too.
os.environ["FASTVOCAB_CACHE_DIR"] = os.path.join(os.devnull, "fastvocab-cache")
# A clustered int8 projection times its map step against the full step when it is built (kernels.map_probe):
# the answer depends on the machine's load, and which columns a step computes would with it.
# tests/test_map_probe.py turns it on with measurements of its own.
os.environ["FASTVOCAB_MAP_PROBE"] = "off"


@pytest.fixture
def switch() -> Iterator[Callable[..., None]]:
    """Set switches (``fastvocab.switches``) for the rest of the test: ``switch(CPU_SYNC_EVERY=3)``."""
    with contextlib.ExitStack() as stack:
        yield lambda **values: stack.enter_context(switches.override(**values))


LANGS = ["en", "it", "fr", "de"]
WORDS = {
    "en": "the a package for library tool data file system server client network graphics sound",
    "it": "il un pacchetto per libreria strumento dati file sistema server client rete grafica suono",
    "fr": "le un paquet pour bibliothèque outil données fichier système serveur client réseau son",
    "de": "das ein Paket für Bibliothek Werkzeug Daten Datei System Server Client Netzwerk Klang",
}


def synthetic_sentences(lang: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(f"{lang}-{seed}")
    return [" ".join(rng.choices(WORDS[lang].split(), k=rng.randint(3, 12))) for _ in range(n)]


TINY_ARCH = dict(vocab=300, d_model=32, ffn=64, heads=2, enc_layers=2, dec_layers=2)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A saved M2M100 model + tokenizer (random weights, vocabulary ~400) that loads with Auto* offline."""
    import torch
    from transformers import M2M100ForConditionalGeneration

    from fastvocab.training.demo_model import build_tokenizer, model_config, train_sentencepiece

    root = tmp_path_factory.mktemp("tiny_model")
    texts = [s for lang in LANGS for s in synthetic_sentences(lang, 300)]
    spm_model = train_sentencepiece(texts, TINY_ARCH["vocab"], root / "spm", threads=1)  # deterministic
    out = root / "model"
    tok = build_tokenizer(spm_model, LANGS, out)
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(model_config(TINY_ARCH, tok, max_positions=128)).eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def write_en_it_split(corpus_dir: Path, split: str, n: int, seed: int) -> Path:
    """``n`` synthetic en-it pairs as ``<corpus_dir>/en-it/<split>.parquet`` (the corpus layout)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastvocab.artifacts_schema.corpus import CORPUS_SCHEMA, split_path

    path = split_path(corpus_dir, "en", "it", split)
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "id": list(range(n)),
            "doc_id": [f"d{i}" for i in range(n)],
            "text1": synthetic_sentences("en", n, seed=seed),
            "text2": synthetic_sentences("it", n, seed=seed),
        },
        schema=CORPUS_SCHEMA,
    )
    pq.write_table(table, path)
    return path


def generate_ids(adapter, batch: dict, tgt: str, max_len: int, **kw) -> list[list[int]]:
    """``model.generate`` output with the forced prefix, EOS and padding removed (the search's reference)."""
    prefix = adapter.start_tokens(tgt)
    out = adapter.model.generate(
        **batch,
        forced_bos_token_id=prefix[1],
        do_sample=False,
        max_new_tokens=max_len + len(prefix) - 1,
        **kw,
    )
    rows = []
    for row in out.tolist():
        row = row[len(prefix) :]
        rows.append(row[: row.index(adapter.eos_id)] if adapter.eos_id in row else row)
    return rows


def reference_logits(adapter, batch: dict, decoder_input_ids):
    """The model's own logits (rows, T, N) from a full forward pass of the Hugging Face model: the oracle for
    ``h W^T + b``."""
    import torch

    with torch.inference_mode():
        return adapter.model(
            input_ids=batch["input_ids"].to(adapter.device),
            attention_mask=batch["attention_mask"].to(adapter.device),
            decoder_input_ids=decoder_input_ids.to(adapter.device),
        ).logits


def decoder_steps(adapter, batch: dict, tokens, fixed: bool = False):
    """``h`` (rows, T, d) of feeding ``tokens`` (rows, T) one position at a time: through
    ``adapter.decoder_step``, or (``fixed``) the static engine's fixed-shape step over a cache that starts
    too small (``prepare_fixed`` grows it) with the position as a device tensor."""
    import torch

    state = adapter.encode(batch)
    hs = []
    if not fixed:
        for t in range(tokens.shape[1]):
            h, state = adapter.decoder_step(tokens[:, t], state)
            hs.append(h)
        return torch.stack(hs, dim=1)
    dec = adapter.static_decoder
    cache = dec.start(state.hidden, state.mask, capacity=2)
    dec.prepare_fixed(cache, tokens.shape[1] - 1)
    pos = torch.zeros(1, dtype=torch.long, device=adapter.device)
    for t in range(tokens.shape[1]):
        hs.append(dec.step_fixed(tokens[:, t], cache, pos))
        cache.length += 1
        pos += 1
    return torch.stack(hs, dim=1)


@pytest.fixture(scope="session")
def spread_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with larger random weights, so that different sources get different outputs."""
    import torch
    from transformers import AutoTokenizer, M2M100ForConditionalGeneration

    from fastvocab.training.demo_model import model_config

    tok = AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    torch.manual_seed(3)
    model = M2M100ForConditionalGeneration(model_config(TINY_ARCH, tok, max_positions=128)).eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 3.0 / p.shape[1] ** 0.5, generator=gen)
    out = tmp_path_factory.mktemp("spread_model") / "model"
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def slow_down(monkeypatch, module, name: str, seconds: float) -> None:
    """``module.name`` made to sleep ``seconds`` before it runs: work that lasts at least that long, so a run
    that spans it can be told from one that spans only its logging."""
    import time

    real = getattr(module, name)

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, slow)


def parent_and_children(uri: str, experiment: str):
    """The one parent run of ``experiment`` in the store ``uri`` (its ``RunInfo``) and its child runs' infos
    by run name, read back through ``MlflowClient``."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    (parent,) = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = {
        r.info.run_name: r.info for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id
    }
    return parent.info, children
