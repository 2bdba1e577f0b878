"""The end of a run: save the fp16 model and its tokenizer, reload the folder like a user would, score the
dev split, and write ``training_summary.json`` and the model card next to the weights."""

from __future__ import annotations

import json
import logging
import platform
import time
from typing import TYPE_CHECKING, Any

import torch

from fastvocab import __version__
from fastvocab.training.card import model_card
from fastvocab.training.config import HYPERPARAMETERS, TrainConfig
from fastvocab.training.data import load_parallel, parse_direction
from fastvocab.training.demo_model import PRESETS
from fastvocab.training.evaluate import load_saved_model, score, translate
from fastvocab.training.loop import Progress
from fastvocab.training.preparation import Prepared

if TYPE_CHECKING:
    from transformers import M2M100ForConditionalGeneration

log = logging.getLogger(__name__)


def save_and_evaluate(
    cfg: TrainConfig, prep: Prepared, model: M2M100ForConditionalGeneration, prog: Progress, params: int
) -> dict[str, Any]:
    """Save fp16 weights + tokenizer, reload the folder like a user would, score dev, write the model card."""
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    tok = prep.tokenizer
    model.eval().half()
    gen = model.generation_config
    gen.decoder_start_token_id = tok.eos_token_id
    gen.num_beams, gen.max_length = 1, cfg.max_len
    # The tokenizer knows all 100 M2M100 codes; record the ones trained, so others are refused at load.
    model.config.fastvocab_languages = sorted(prep.langs)
    model.save_pretrained(out)
    tok.src_lang = prep.langs[0]
    tok.tgt_lang = prep.langs[1] if len(prep.langs) > 1 else prep.langs[0]
    tok.save_pretrained(out)

    reloaded, rtok = load_saved_model(out, cfg.device)
    if reloaded.get_output_embeddings().bias is not None:
        raise RuntimeError(f"the model saved to {out} has an output bias; the demo model must have none")
    dev_text = load_parallel(cfg.corpus, prep.directions, "dev", limit=cfg.dev_sentences)
    dev_scores = {}
    for d in prep.directions:
        src, ref = dev_text[d]
        t0 = time.perf_counter()
        hyp = translate(
            reloaded,
            rtok,
            src,
            *parse_direction(d),
            batch_size=cfg.eval_batch_size,
            max_len=cfg.max_len,
            device=cfg.device,
        )
        dev_scores[d] = score(hyp, ref) | {"seconds": round(time.perf_counter() - t0, 1)}
        log.info(
            "dev %s: BLEU %.2f chrF %.2f (%d sentences)",
            d,
            dev_scores[d]["bleu"],
            dev_scores[d]["chrf"],
            len(src),
        )

    summary = {
        "fastvocab_version": __version__,
        "preset": cfg.preset if cfg.arch == PRESETS.get(cfg.preset) else "custom",
        "arch": cfg.arch,
        "vocab_size": reloaded.config.vocab_size,
        "params": params,
        "steps": prog.step,
        "train_tokens": prog.tokens,
        "train_minutes": round(prog.elapsed / 60, 2),
        "device": describe_device(cfg.device, cfg.threads),
        "directions": prep.directions,
        "train_pairs": prep.train_pairs,
        "dropped_longer_than_max_len": prep.dropped,
        "sampling_probs": {
            d: round(float(p), 4) for d, p in zip(prep.stream.directions, prep.stream.probs, strict=True)
        },
        "hyperparameters": {k: getattr(cfg, k) for k in HYPERPARAMETERS},
        "dev": dev_scores,
        "history": prog.history,
        "sessions": prog.sessions,
        "command": cfg.command,
        # a resumed run may save into this folder again; any other is refused (train-demo --overwrite)
        "work_dir": str(cfg.work_dir),
    }
    (out / "training_summary.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    (out / "README.md").write_text(model_card(summary), encoding="utf-8")
    return summary


def describe_device(device: str, threads: int) -> str:
    """The training device for the model card: the GPU's name, or the CPU, thread count and torch version."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return f"CPU ({platform.processor() or platform.machine()}, {threads} threads, torch {torch.__version__})"
