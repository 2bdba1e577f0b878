"""The model fingerprint (a hash over every output-projection weight) is computed once per run, on the driver.

Workers get it in a ``RunContext`` and never hash the weights again; a pipeline run logs exactly one
fingerprint computation.
"""

from __future__ import annotations

import dataclasses
import logging

import pytest

from fastvocab.artifacts_schema.digest import text_digest
from fastvocab.kernels.full import FullOptions
from fastvocab.tasks.context import RunContext, describe_model
from fastvocab.tasks.dump import DumpSettings
from fastvocab.tasks.translate_job import TranslateJob, TranslateWorker, sample_current
from fastvocab.tasks.workers import DecoderWorker
from tests.conftest import synthetic_sentences

FP_LOGGER = "fastvocab.artifacts_schema.fingerprint"


def fingerprint_calls(caplog) -> int:
    return sum(r.name == FP_LOGGER and "fingerprinted" in r.getMessage() for r in caplog.records)


@pytest.fixture
def fake_ctx(tiny_model_dir):
    """The tiny model's context with a fingerprint no hash of its weights can produce."""
    ref = describe_model(tiny_model_dir)
    return RunContext(dataclasses.replace(ref, fingerprint="sha256:from-the-driver"), torch_threads=1)


def test_describe_model_hashes_once_and_checks_languages(tiny_model_dir, caplog):
    caplog.set_level(logging.DEBUG, logger=FP_LOGGER)
    ref = describe_model(tiny_model_dir, ("en", "it"))
    assert fingerprint_calls(caplog) == 1
    assert ref.fingerprint.startswith("sha256:") and ref.fingerprint.endswith(f":N{ref.n_vocab}:d{ref.d}")
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        describe_model(tiny_model_dir, ("en", "xx"))


def test_workers_use_the_drivers_fingerprint_and_never_hash(fake_ctx, tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger=FP_LOGGER)
    dump_worker = DecoderWorker(fake_ctx, DumpSettings(k=2, max_len=4, batch_size=4))
    assert dump_worker.decoder.adapter.fingerprint == "sha256:from-the-driver"
    assert dump_worker.decoder.projection.fingerprint == "sha256:from-the-driver"

    out = tmp_path / "full.parquet"
    job = TranslateJob(fake_ctx.model, "en", "it", FullOptions(), str(out), torch_threads=1)
    sources = synthetic_sentences("en", 3)
    assert not sample_current(job, text_digest(sources))
    (record,) = TranslateWorker(job).translate_sample((job,), (1, 2, 3), sources, text_digest(sources))
    assert record["signature"].endswith("model:sha256:from-the-driver")
    assert out.exists() and out.with_suffix(".json").exists()
    assert fingerprint_calls(caplog) == 0
    # the one resume check: the plan recorded beside the outputs, compared whole
    assert sample_current(job, text_digest(sources))
    assert not sample_current(dataclasses.replace(job, dtype="bfloat16"), text_digest(sources))
    assert not sample_current(job, text_digest(sources[:2]))


@pytest.mark.parametrize("engine", ["static", "onnx", "auto"])
def test_a_folders_fingerprint_is_remembered_until_its_files_change(
    tiny_model_dir, tmp_path, caplog, monkeypatch, engine, switch
):
    """Whichever engine loads it: the ONNX Runtime engine names its exports by the fingerprint while the
    adapter is built, and remembers it all the same."""
    import os
    import shutil

    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    if engine == "onnx":
        pytest.importorskip("onnxruntime")
    switch(CACHE_DIR=tmp_path / "cache")
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    caplog.set_level(logging.DEBUG, logger=FP_LOGGER)
    first = Seq2SeqAdapter.load(model, engine=engine).fingerprint
    assert fingerprint_calls(caplog) == 1 and (tmp_path / "cache" / "fingerprints.json").is_file()
    assert Seq2SeqAdapter.load(model, engine=engine).fingerprint == first
    assert fingerprint_calls(caplog) == 1  # remembered: not hashed again
    weights = model / "model.safetensors"
    st = weights.stat()
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # a rewritten file: hashed again
    assert Seq2SeqAdapter.load(model, engine=engine).fingerprint == first
    assert fingerprint_calls(caplog) == 2
