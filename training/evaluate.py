"""Translating and scoring with the trained model as a user would load it: ``load_saved_model`` (the saved
folder, offline), ``translate`` (greedy ``model.generate`` with the target tag forced, the reference path that
``benchmarks/demo_model_quality.py`` checks ``fastvocab translate`` against) and ``score`` (sacrebleu via
``fastvocab.tasks.evaluate``, in the flat, rounded form of the training summary and model card)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from fastvocab.decoding.settings import SearchSettings
from fastvocab.tasks.evaluate import score as sacrebleu_score

if TYPE_CHECKING:
    from transformers import M2M100Tokenizer, PreTrainedModel


@torch.no_grad()
def translate(
    model: PreTrainedModel,
    tokenizer: M2M100Tokenizer,
    sources: list[str],
    src_lang: str,
    tgt_lang: str,
    *,
    batch_size: int = 32,
    max_len: int = SearchSettings.max_len,
    adaptive_len: bool = True,
    device: str = "cpu",
) -> list[str]:
    """Greedy ``model.generate`` with the target tag forced first; length-sorted batches, input order kept.

    ``max_len`` counts target tokens after the language tag (as ``fastvocab translate --max-len``). With
    ``adaptive_len`` a batch may generate at most twice its source length + 10 tokens, so an undertrained
    model does not run to ``max_len`` on every batch.
    """
    tokenizer.src_lang = src_lang
    forced = tokenizer.get_lang_id(tgt_lang)
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    out: list[str] = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        enc = tokenizer([sources[i] for i in idx], return_tensors="pt", padding=True).to(device)
        limit = min(max_len, 2 * enc["input_ids"].shape[1] + 10) if adaptive_len else max_len
        # max_length counts the decoder start and the tag too: ``limit`` tokens after the tag
        gen = model.generate(  # type: ignore[operator]  # mypy: the decorated method reads as a Tensor
            **enc, forced_bos_token_id=forced, num_beams=1, do_sample=False, max_length=limit + 2
        )
        for i, text in zip(idx, tokenizer.batch_decode(gen, skip_special_tokens=True), strict=True):
            out[i] = text
    return out


def score(hyps: list[str], refs: list[str]) -> dict[str, object]:
    """sacrebleu BLEU and chrF (rounded to 2 decimals) with their signatures, and the sentence count."""
    s = sacrebleu_score(hyps, refs)
    return {
        "bleu": round(s["bleu"], 2),
        "chrf": round(s["chrf"], 2),
        "bleu_signature": s["signatures"]["bleu"],
        "chrf_signature": s["signatures"]["chrf"],
        "sentences": s["sentences"],
    }


def load_saved_model(model_dir: str | Path, device: str = "cpu") -> tuple[PreTrainedModel, M2M100Tokenizer]:
    """Reload a saved folder the way a user would (Auto classes, offline), in float32 for CPU decoding."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    return model.to(device).eval(), cast("M2M100Tokenizer", tok)  # the demo model's tokenizer class
