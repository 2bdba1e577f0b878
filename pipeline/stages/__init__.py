"""The pipeline's stages, in order, one module each: ``run(ctx: StageContext) -> list[StageRecord]``.

Every stage checks its outputs first and skips what exists, validates and was made from the same inputs and
settings; it returns one :class:`~fastvocab.pipeline.tracking.StageRecord` per direction or map, which the
driver logs to MLflow.
"""

from __future__ import annotations

from collections.abc import Callable

STAGES = ("corpus", "dump", "kmeans", "maps", "methods", "translate", "evaluate", "bulk")


def stage_function(name: str) -> Callable:
    """The ``run`` function of stage ``name`` (the stages' modules are imported on first use: they import
    torch)."""
    from fastvocab.pipeline.stages import bulk, corpus, dump, evaluate, kmeans, maps, methods, translate

    modules = (corpus, dump, kmeans, maps, methods, translate, evaluate, bulk)  # in STAGES' order
    if name not in STAGES:
        raise ValueError(f"unknown stage {name!r}; valid: {', '.join(STAGES)}")
    return dict(zip(STAGES, modules, strict=True))[name].run
