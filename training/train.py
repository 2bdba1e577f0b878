"""The entry point ``train_demo``: resolve the config, prepare the data, build the model and optimizer (or
restore them from the checkpoint, with the resumed run's learning rate), run the training loop, save and score
the model; ``TrainResult`` is what it returns."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fastvocab.training.checkpoint import CHECKPOINT, load_checkpoint, set_rng_state
from fastvocab.training.config import HYPERPARAMETERS, TrainConfig
from fastvocab.training.demo_model import model_config
from fastvocab.training.loop import Progress, inverse_sqrt, sigterm_as_interrupt, train_loop
from fastvocab.training.preparation import prepare
from fastvocab.training.save import save_and_evaluate

log = logging.getLogger(__name__)


@dataclass
class TrainResult:
    out: Path
    steps: int
    train_tokens: int  # non-pad source + target tokens seen
    minutes: float
    params: int
    dev: dict[str, dict[str, object]] = field(default_factory=dict)
    history: list[dict[str, float]] = field(default_factory=list)  # checkpoints, with dev nll
    train_log: list[dict[str, float]] = field(default_factory=list)  # every logging window


def count_parameters(model: torch.nn.Module) -> int:
    """Parameters counted once (the tied LM head shares the embedding matrix)."""
    return sum(p.numel() for p in model.parameters())


def train_demo(cfg: TrainConfig) -> TrainResult:
    """Train (or resume), then save the fp16 model, tokenizer and model card to ``cfg.out``."""
    from transformers import M2M100ForConditionalGeneration

    cfg = cfg.resolved()
    torch.set_num_threads(cfg.threads)
    # Adam's second moments of rarely seen embedding rows decay into denormals, which are very slow on x86
    torch.set_flush_denormal(True)
    cfg.work_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = cfg.work_dir / CHECKPOINT
    ckpt = load_checkpoint(ckpt_path) if cfg.resume and ckpt_path.exists() else None
    if ckpt is not None and ckpt["arch"] != cfg.arch:
        raise ValueError(f"checkpoint {ckpt_path} has architecture {ckpt['arch']}, not {cfg.arch}")
    prep = prepare(cfg)
    if ckpt is not None and ckpt["directions"] != prep.directions:
        raise ValueError(f"checkpoint {ckpt_path} was trained on {ckpt['directions']}, not {prep.directions}")

    torch.manual_seed(cfg.seed)
    config = model_config(cfg.arch, prep.tokenizer, dropout=cfg.dropout)  # type: ignore[arg-type]
    model = M2M100ForConditionalGeneration(config)
    model.to(cfg.device)  # type: ignore[arg-type]
    params = count_parameters(model)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,  # type: ignore[arg-type]
        betas=(0.9, 0.98),
        eps=1e-8,
        weight_decay=cfg.weight_decay,
        fused=True,  # one kernel over all parameters: ~5x faster than the foreach path on CPU
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt(cfg.warmup))  # type: ignore[arg-type]
    prog = Progress()
    if ckpt is not None:
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        prep.stream.load_state_dict(ckpt["sampler"])
        set_rng_state(ckpt["rng"])
        prog = Progress(**ckpt["progress"])
        # the schedule's peak comes from the resumed run's --lr (the checkpoint holds the previous one)
        scheduler.base_lrs = [cfg.lr for _ in optimizer.param_groups]  # type: ignore[misc]
        for group in optimizer.param_groups:
            group["initial_lr"] = cfg.lr
            group["lr"] = cfg.lr * inverse_sqrt(cfg.warmup)(prog.step)  # type: ignore[arg-type, operator]
        log.info("resumed from %s at step %d (%.1f min trained)", ckpt_path, prog.step, prog.elapsed / 60)
    del ckpt
    # one entry per session: a resumed run may change the budget or the recipe, and the model card says so
    prog.sessions.append(
        {"start_step": prog.step, "start_minutes": round(prog.elapsed / 60, 2), "command": cfg.command}
        | {k: getattr(cfg, k) for k in ("max_minutes", "max_steps", *HYPERPARAMETERS)}
    )
    log.info(
        "model: %s, %.2fM parameters, vocabulary %d, device %s, batch %d tokens, budget %s min / %s steps",
        cfg.arch,
        params / 1e6,
        model.config.vocab_size,
        cfg.device,
        cfg.batch_tokens,
        cfg.max_minutes,
        cfg.max_steps,
    )
    with sigterm_as_interrupt():
        train_loop(cfg, prep, model, optimizer, scheduler, prog, ckpt_path)
    del optimizer
    summary = save_and_evaluate(cfg, prep, model, prog, params)
    return TrainResult(
        cfg.out,
        prog.step,
        prog.tokens,
        prog.elapsed / 60,
        params,
        summary["dev"],
        prog.history,
        prog.train_log,
    )
