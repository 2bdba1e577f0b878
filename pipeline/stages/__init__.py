"""The pipeline's stages, in order, one module each: ``run(ctx: StageContext) -> list[StageRecord]``.

Every stage checks its outputs first and skips what exists, validates and was made from the same inputs and
settings; it returns one :class:`~fastvocab.pipeline.tracking.StageRecord` per direction or map, which the
driver logs to MLflow.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

STAGES = ("corpus", "dump", "kmeans", "maps", "methods", "translate", "evaluate", "bulk")


def stage_function(name: str) -> Callable:
    """The ``run`` function of stage ``name`` (its module is imported on first use)."""
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; valid: {', '.join(STAGES)}")
    return importlib.import_module(f"fastvocab.pipeline.stages.{name}").run
