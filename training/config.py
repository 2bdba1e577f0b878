"""The settings of a training run: ``TrainConfig`` (with the preset defaults filled in by ``resolved``) and
``HYPERPARAMETERS``, the recipe fields every session and the model card record."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from fastvocab.training.demo_model import PRESETS, TRAIN_DEFAULTS


@dataclass
class TrainConfig:
    """Everything a training run depends on; ``None`` fields take the preset's ``TRAIN_DEFAULTS``."""

    corpus: Path
    out: Path
    work_dir: Path  # SentencePiece model, checkpoint, training log (not part of the saved model)
    preset: str = "tiny"
    arch: dict[str, int] | None = None  # overrides the preset's architecture (tests use a micro model)
    directions: list[str] | None = None  # "en-it", ...; None: both directions of every pair in the corpus
    max_minutes: float | None = None  # training wall-clock budget, summed over resumed sessions
    max_steps: int | None = None
    batch_tokens: int | None = None  # padded tokens per batch (max of source and target side)
    lr: float | None = None
    warmup: int | None = None
    dropout: float | None = None
    seed: int = 1
    device: str = "cpu"
    threads: int = 2
    label_smoothing: float = 0.1
    weight_decay: float = 0.0001
    clip_norm: float = 1.0
    max_len: int = 128  # tokens per side, tags and </s> included; longer pairs are dropped
    temperature: float = 2.0  # direction sampling: p(d) ~ n(d)^(1/T); 1 = natural sizes
    spm_sentences: int = 300_000  # SentencePiece training sample, balanced over languages
    checkpoint_minutes: float = 5.0
    log_every: int = 25
    dev_loss_sentences: int = 50  # per direction, scored at every checkpoint
    dev_sentences: int = 200  # per direction, translated (greedy) for the model card
    eval_batch_size: int = 32
    resume: bool = True
    command: str | None = None  # the command line that started the run, for the model card

    def resolved(self) -> TrainConfig:
        """A copy with the preset's defaults filled in and paths as ``Path``."""
        if self.arch is None and self.preset not in PRESETS:
            raise ValueError(f"unknown preset {self.preset!r}; valid: {', '.join(sorted(PRESETS))}")
        defaults = TRAIN_DEFAULTS.get(self.preset, TRAIN_DEFAULTS["tiny"])
        cfg = TrainConfig(**{**asdict(self)})
        cfg.corpus, cfg.out, cfg.work_dir = Path(self.corpus), Path(self.out), Path(self.work_dir)
        cfg.arch = dict(self.arch) if self.arch is not None else dict(PRESETS[self.preset])
        for name in ("batch_tokens", "lr", "warmup", "dropout"):
            if getattr(cfg, name) is None:
                setattr(cfg, name, defaults[name])
        if cfg.max_minutes is None and cfg.max_steps is None:
            cfg.max_minutes = defaults.get("max_minutes")
            steps = defaults.get("max_steps")
            cfg.max_steps = int(steps) if steps is not None else None
        if cfg.max_minutes is None and cfg.max_steps is None:
            raise ValueError("give a training budget: max_minutes and/or max_steps")
        return cfg


# The recipe of a run (beside its budget): recorded for every session and in the model card.
HYPERPARAMETERS = (
    "batch_tokens",
    "lr",
    "warmup",
    "dropout",
    "seed",
    "label_smoothing",
    "weight_decay",
    "clip_norm",
    "max_len",
    "temperature",
    "spm_sentences",
)
