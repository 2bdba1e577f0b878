"""The training checkpoint: its file name in the work folder, atomic save and load, and the RNG states
(torch, NumPy, Python) it carries so that a resumed run continues the same random streams."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastvocab.artifacts_schema.atomic import atomic_path

CHECKPOINT = "checkpoint.pt"


def save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write atomically: a killed run leaves either the old checkpoint or the new one, never half of one."""
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=False)


def rng_state() -> dict[str, Any]:
    """The global RNG states of torch, NumPy and Python's ``random``."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` returned."""
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
