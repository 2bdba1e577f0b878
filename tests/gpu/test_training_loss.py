"""Training's loss on a GPU: the chunked linear cross-entropy and the dev loss keep their sums, indices and
batches on the model's device (the GPU training step broke on both), and give the CPU's numbers.

Skipped with a reason without a CUDA GPU. On a GPU machine:

    python -m pytest -q tests/gpu/test_training_loss.py
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: runs training's loss on the device",
)

from fastvocab.training import seq2seq_loss  # noqa: E402
from fastvocab.training.batches import collate  # noqa: E402
from fastvocab.training.data import encode_direction  # noqa: E402
from fastvocab.training.loss import dev_loss  # noqa: E402

SRC = ["the package for data", "a tool", "manage the files of a system"]
TGT = ["il pacchetto per dati", "uno strumento", "gestire i file di un sistema"]


def _model_and_data(model_dir):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    enc = encode_direction(tok, SRC, TGT, "en", "it", 64)
    return tok, model, enc


@pytest.mark.parametrize("chunk", [None, 4])
def test_loss_on_the_gpu_equals_the_cpu(tiny_model_dir, chunk):
    tok, model, enc = _model_and_data(tiny_model_dir)
    batch = collate([enc], np.array([[0, 0], [0, 1], [0, 2]]), tok.pad_token_id, tok.eos_token_id)
    want = seq2seq_loss(model, batch, tok.pad_token_id, 0.1, chunk=chunk)
    gpu = model.to("cuda")
    got = seq2seq_loss(gpu, {k: v.to("cuda") for k, v in batch.items()}, tok.pad_token_id, 0.1, chunk=chunk)
    got[0].backward()
    assert got[2] == want[2] > 0
    assert float(got[0]) == pytest.approx(float(want[0]), rel=1e-4)
    assert float(got[1]) == pytest.approx(float(want[1]), rel=1e-4)
    assert all(p.grad is not None and p.grad.is_cuda for p in gpu.parameters() if p.requires_grad)


def test_dev_loss_moves_batches_to_the_models_device(tiny_model_dir):
    tok, model, enc = _model_and_data(tiny_model_dir)
    want = dev_loss(model, [enc], tok.pad_token_id, tok.eos_token_id, batch_tokens=32)
    got = dev_loss(model.to("cuda"), [enc], tok.pad_token_id, tok.eos_token_id, batch_tokens=32)
    assert want > 0
    assert got == pytest.approx(want, rel=1e-4)
