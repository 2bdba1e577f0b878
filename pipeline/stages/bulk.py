"""The bulk stage: translate a user's corpus (``bulk.input``) with one method, in row-range parts on Ray
actors (``bulk.workers``) or in the driver's process (pipeline/bulk_driver.py). Off unless ``bulk.input`` is
set, so the demo run is unchanged; the search settings and the clustered options are the ``translate``
section's.

Resumes like every stage: a part whose plan matches is not translated again, so a rerun of a finished job
only checks its parts (its record then says ``skipped``).
"""

from __future__ import annotations

from pathlib import Path

from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.tracking import StageRecord


def _artifact(ctx: StageContext, method: str, direction: str) -> Path | None:
    """The map (clustered; checked for the direction) or index (lsh, graph, shortlist) the method reads."""
    cfg = ctx.cfg.bulk
    src, _, tgt = direction.partition("-")
    if method == "clustered":
        from fastvocab.artifacts_schema.cluster_map import resolve_map_dir
        from fastvocab.pipeline.checks import check_map_direction

        found = resolve_map_dir(cfg.clusters or ctx.maps_root, src, tgt)
        check_map_direction(found, src, tgt)
        return found
    return cfg.index  # lsh, graph, shortlist: checked against the method and direction when loaded


def run(ctx: StageContext) -> list[StageRecord]:
    from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk
    from fastvocab.tasks.projections import method_options

    cfg = ctx.cfg.bulk
    if cfg.input is None:
        return []
    direction = cfg.direction or ctx.cfg.directions[0]
    t = ctx.cfg.translate
    shortlist = None
    if cfg.method == "clustered" and t.shortlist is not None:
        from fastvocab.tasks.methods import index_dir

        shortlist = index_dir(t.shortlist, "shortlist", direction)  # checked when the projection loads it
    try:
        artifact = _artifact(ctx, cfg.method, direction)
        options = method_options(
            cfg.method, direction, t.method(), beam=t.beam, artifact=artifact, shortlist=shortlist
        )
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
        method=cfg.method,
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
