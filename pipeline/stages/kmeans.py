"""The k-means stage: Faiss k-means per map (direction, or target language), one Ray task each."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.digest import footer_digest
from fastvocab.artifacts_schema.hidden_states import shard_rows
from fastvocab.artifacts_schema.kmeans_result import INFO_FILE, KMeansInfo, load_kmeans_info
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.stages.dump import extra_state_files, own_state_files
from fastvocab.pipeline.tracking import StageRecord
from fastvocab.tasks.kmeans import kmeans_job

log = logging.getLogger(__name__)


def group_files(ctx: StageContext, directions: list[str]) -> list[Path]:
    """The validated shards of every direction feeding one map, along every path the dump decodes (the
    reference path's first when ``dump.reference``, then each beam's), sorted within each."""
    return own_state_files(ctx, directions)


def run(ctx: StageContext) -> list[StageRecord]:
    cfg = ctx.cfg.kmeans
    m = ctx.model()
    requested = cfg.params(gpu=cfg.gpu)
    jobs: dict[str, tuple[list[Path], str]] = {}  # map name -> (files, inputs digest)
    records: dict[str, StageRecord] = {}
    for name, directions in ctx.groups().items():
        files = group_files(ctx, directions) + extra_state_files(ctx, directions)  # maps.extra_states
        available = sum(shard_rows(files))
        if available < cfg.r:
            raise UserError(
                f"k-means for {name} needs at least kmeans.r={cfg.r} states, the dump has {available}: "
                "raise dump.sentences or lower kmeans.r"
            )
        digest = footer_digest(files)
        params: dict[str, Any] = {
            "r": cfg.r,
            "niter": cfg.niter,
            "seed": cfg.seed,
            "max_points_per_centroid": cfg.max_points_per_centroid,
            "gpu": cfg.gpu,
            "threads": cfg.num_cpus,
            "model_fingerprint": m.fingerprint,
            "directions": directions,
            "inputs_digest": digest,
            "scope": ctx.cfg.maps.scope,
            "map": name,
            "beams": ",".join(str(b) for b in ctx.dump_beams()),
        }
        out = ctx.kmeans_root / name
        if out.exists():
            info = load_kmeans_info(out)
            if _current(info, requested, m.fingerprint, directions, digest):
                msg = f"r={info.r} centroids valid (objective {info.final_objective:.4g})"
                records[name] = StageRecord("kmeans", name, "skipped", msg, params, {})
                continue
        jobs[name] = (files, digest)
        records[name] = StageRecord("kmeans", name, "ran", "", params)
    if not jobs:
        return list(records.values())

    gpu = cfg.gpu and ctx.ray.has_gpu()
    if cfg.gpu and not gpu:
        log.warning("kmeans.gpu is set but the Ray cluster has no GPU: k-means runs on CPU")
    task_params = cfg.params(gpu=gpu)
    calls = {
        name: (
            ([str(f) for f in files], str(ctx.kmeans_root / name), task_params),
            {"model_fingerprint": m.fingerprint, "directions": ctx.groups()[name], "inputs_digest": digest},
        )
        for name, (files, digest) in jobs.items()
    }
    with ctx.bar(len(calls), "kmeans", unit="map") as bar:
        results = ctx.ray.run_tasks(kmeans_job, calls, bar, num_cpus=cfg.num_cpus, num_gpus=1 if gpu else 0)
    for name, info in results.items():
        rec = records[name]
        rec.message = (
            f"r={info['r']} on {info['n_train']} states, objective {info['objective'][-1]:.4g}, "
            f"{info['seconds']:.2f} s"
        )
        rec.metrics = {
            "objective": info["objective"][-1],
            "n_train": info["n_train"],
            "n_available": info["n_available"],
            "kmeans_seconds": info["seconds"],
            "faiss_threads": info["threads"],
            "gpu": float(info["gpu"]),
        }
        rec.series = {"objective_by_iteration": info["objective"]}
        rec.artifacts = [ctx.kmeans_root / name / INFO_FILE]
    return list(records.values())


def _current(info: KMeansInfo, params, fingerprint: str, directions: list[str], digest: str) -> bool:
    """The stored centroids were trained with these settings on exactly these shards of this model."""
    same = (info.r, info.niter, info.seed, info.max_points_per_centroid) == (
        params.r,
        params.niter,
        params.seed,
        params.max_points_per_centroid,
    )
    return (
        same
        and (info.model_fingerprint, info.inputs_digest) == (fingerprint, digest)
        and sorted(info.directions) == sorted(directions)
    )
