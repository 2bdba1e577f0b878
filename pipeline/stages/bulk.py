"""The bulk stage: translate a user's corpus (``bulk.input``) with one method, in row-range parts on Ray
actors (``bulk.workers``) or in the driver's process (pipeline/bulk_driver.py). Off unless ``bulk.input`` is
set, so the demo run is unchanged; the search settings and the clustered options are the ``translate``
section's.

Resumes like every stage: a part whose plan matches is not translated again, so a rerun of a finished job
only checks its parts (its record then says ``skipped``).
"""

from __future__ import annotations

from fastvocab.kernels.options import MethodOptions
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.tracking import StageRecord


def _options(ctx: StageContext, method: str, direction: str) -> MethodOptions:
    """The method's options with the folders it reads, each found and checked here, once for the job: the
    map (clustered; of the direction) and the shortlist table joining it (``translate.shortlist``), or the
    index (``bulk.index``; a shortlist's default: the work dir's methods; lsh and graph without one build
    theirs from W at load)."""
    from fastvocab.kernels.registry import options_types
    from fastvocab.tasks.methods import INDEXED_METHODS

    cfg, t = ctx.cfg.bulk, ctx.cfg.translate
    src, _, tgt = direction.partition("-")
    if method == "clustered":
        from fastvocab.artifacts_schema.cluster_map import resolve_map_dir
        from fastvocab.pipeline.checks import check_map_direction
        from fastvocab.pipeline.method_choice import resolve_index

        found = resolve_map_dir(cfg.clusters or ctx.maps_root, src, tgt)
        check_map_direction(found, src, tgt)
        table = None
        if t.shortlist is not None:
            table = resolve_index(t.shortlist, "shortlist", direction, "translate.shortlist")
        return t.clustered(found, table)
    types = options_types()
    if method not in types:
        raise ValueError(f"unknown output-layer method {method!r}; valid: {', '.join(types)}")
    if method not in INDEXED_METHODS:
        return types[method]()
    from fastvocab.pipeline.method_choice import resolve_index

    if cfg.index is None and method != "shortlist":
        return types[method]()
    given = {"direction": direction} if method == "shortlist" else {}
    index = resolve_index(cfg.index or ctx.work_dir, method, direction, "bulk.index")
    return types[method](index=index, **given)  # type: ignore[call-arg]


def run(ctx: StageContext) -> list[StageRecord]:
    from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk

    cfg = ctx.cfg.bulk
    if cfg.input is None:
        return []
    direction = cfg.direction or ctx.cfg.directions[0]
    t = ctx.cfg.translate
    try:
        options = _options(ctx, cfg.method, direction)
    except ValueError as exc:
        raise UserError(f"bulk.method {cfg.method}: {exc}") from exc
    output = cfg.output or f"{ctx.work_dir / 'bulk' / direction}/"
    src, _, tgt = direction.partition("-")
    request = BulkRequest(
        cfg.input,
        output,
        ctx.cfg.model,
        src,
        tgt,
        options=options,
        search=t.search(),
        dtype=cfg.dtype,
        device=t.device,
        workers=cfg.workers,
        ray_address=ctx.ray.address,
        num_cpus_per_worker=cfg.num_cpus_per_worker,
        num_gpus_per_worker=cfg.num_gpus_per_worker,
        lines_per_part=cfg.chunk_lines,
        text_column=cfg.input_column,
        id_column=cfg.id_column,
    )
    on_ray = cfg.workers > 1 or ctx.ray.address is not None
    result = run_bulk(request, ray=ctx.ray if on_ray else None, progress=ctx.progress)
    return [result.record("bulk", direction, artifacts_dir=ctx.work_dir / "bulk" / f"{direction}.record")]
