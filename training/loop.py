"""The training loop: the learning-rate schedule, the run's progress (``Progress``, carried by checkpoints),
step after step until the step or wall-clock budget is spent, logging windows, periodic checkpoints with the
dev loss, and SIGTERM/Ctrl-C turned into a last checkpoint before the run stops."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from fastvocab.training.batches import collate
from fastvocab.training.checkpoint import rng_state, save_checkpoint
from fastvocab.training.config import TrainConfig
from fastvocab.training.loss import dev_loss, seq2seq_loss
from fastvocab.training.preparation import Prepared

if TYPE_CHECKING:
    from transformers import M2M100ForConditionalGeneration

log = logging.getLogger(__name__)


def inverse_sqrt(warmup: int) -> Callable[[int], float]:
    """LR multiplier: linear warmup to 1 at ``warmup`` steps, then ``sqrt(warmup / step)``."""

    def f(step: int) -> float:
        step = max(step, 1)
        return min(step / warmup, math.sqrt(warmup / step))

    return f


@dataclass
class Progress:
    """How far the run has come; saved in every checkpoint (``asdict``) and restored on resume."""

    step: int = 0
    tokens: int = 0  # non-pad source + target tokens
    elapsed: float = 0.0  # seconds of training wall clock, summed over resumed sessions
    history: list[dict] = field(default_factory=list)  # one entry per checkpoint
    last_train: dict = field(default_factory=dict)  # means over the last logging window
    train_log: list[dict] = field(default_factory=list)  # every logging window: step, loss, nll, lr, tok/s
    sessions: list[dict] = field(default_factory=list)  # budget and recipe of every (resumed) session


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt, so ``kill PID`` saves a checkpoint before the run stops."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _save_state(
    path: Path, cfg: TrainConfig, prep: Prepared, model, optimizer, scheduler, prog: Progress
) -> None:
    """Score the dev loss into ``prog.history``, then write the checkpoint (the model, optimizer, schedule,
    sampler position, RNG states and progress)."""
    pad, eos = prep.tokenizer.pad_token_id, prep.tokenizer.eos_token_id
    entry = {"step": prog.step, "minutes": round(prog.elapsed / 60, 2), "tokens": prog.tokens}
    entry["dev_nll"] = round(dev_loss(model, prep.dev_encoded, pad, eos, cfg.batch_tokens), 4)  # type: ignore[arg-type]
    prog.history.append(entry | prog.last_train)
    save_checkpoint(
        path,
        {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "sampler": prep.stream.state_dict(),
            "rng": rng_state(),
            "progress": asdict(prog),
            "arch": cfg.arch,
            "directions": prep.directions,
        },
    )
    log.info("checkpoint at step %d: %s", prog.step, json.dumps(prog.history[-1]))


def _budget_spent(cfg: TrainConfig, prog: Progress) -> bool:
    return (cfg.max_steps is not None and prog.step >= cfg.max_steps) or (
        cfg.max_minutes is not None and prog.elapsed >= cfg.max_minutes * 60
    )


def train_loop(
    cfg: TrainConfig,
    prep: Prepared,
    model: M2M100ForConditionalGeneration,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    prog: Progress,
    ckpt: Path,
) -> None:
    """Train until the budget is spent, updating ``prog``; checkpoint to ``ckpt`` periodically and at the end.

    An interrupt (Ctrl-C, or SIGTERM under ``sigterm_as_interrupt``) saves a checkpoint and re-raises.
    """
    pad, eos = prep.tokenizer.pad_token_id, prep.tokenizer.eos_token_id
    cuda = cfg.device.startswith("cuda")
    window = {"loss": 0.0, "nll": 0.0, "n": 0, "tok": 0, "t": 0.0}
    last_ckpt = prog.elapsed
    bar = tqdm(
        total=cfg.max_steps, initial=prog.step, desc="train", unit="step", mininterval=5, dynamic_ncols=True
    )
    batches = iter(prep.stream)
    model.train()
    try:
        while not _budget_spent(cfg, prog):
            t0 = time.perf_counter()
            batch = {k: v.to(cfg.device) for k, v in collate(prep.encoded, next(batches), pad, eos).items()}
            with torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext():
                loss, nll, _ = seq2seq_loss(
                    model, batch, pad, cfg.label_smoothing, chunk=None if cuda else 1024
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.clip_norm)
            optimizer.step()
            scheduler.step()
            ntok = int(batch["attention_mask"].sum()) + int((batch["labels"] != pad).sum())
            dt = time.perf_counter() - t0
            prog.step, prog.tokens, prog.elapsed = prog.step + 1, prog.tokens + ntok, prog.elapsed + dt
            for k, v in (
                ("loss", float(loss.detach())),
                ("nll", float(nll)),
                ("n", 1),
                ("tok", ntok),
                ("t", dt),
            ):
                window[k] += v
            bar.update(1)
            if prog.step % cfg.log_every == 0 or _budget_spent(cfg, prog):
                n = window["n"]
                prog.last_train = {
                    "loss": round(window["loss"] / n, 4),
                    "nll": round(window["nll"] / n, 4),
                    "lr": float(scheduler.get_last_lr()[0]),
                    "tok_per_s": round(window["tok"] / window["t"]),
                }
                prog.train_log.append({"step": prog.step} | prog.last_train)
                bar.set_postfix(loss=prog.last_train["loss"], tok_s=prog.last_train["tok_per_s"])
                log.info("step %d %s, %.1f min", prog.step, json.dumps(prog.last_train), prog.elapsed / 60)
                window = {"loss": 0.0, "nll": 0.0, "n": 0, "tok": 0, "t": 0.0}
            if prog.elapsed - last_ckpt >= cfg.checkpoint_minutes * 60 and not _budget_spent(cfg, prog):
                t1 = time.perf_counter()
                _save_state(ckpt, cfg, prep, model, optimizer, scheduler, prog)
                # checkpoints (dev loss, writing) count against the budget too: it is wall clock
                prog.elapsed += time.perf_counter() - t1
                last_ckpt = prog.elapsed
    except KeyboardInterrupt:
        bar.close()
        log.warning("interrupted at step %d: saving a checkpoint to resume from", prog.step)
        _save_state(ckpt, cfg, prep, model, optimizer, scheduler, prog)
        raise
    bar.close()
    if not prog.history or prog.history[-1]["step"] != prog.step:  # else the session had nothing left to do
        _save_state(ckpt, cfg, prep, model, optimizer, scheduler, prog)
