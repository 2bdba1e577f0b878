"""The dump, kmeans and maps stages: skip checks on the driver, work on Ray, one record per direction/map."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.cluster_map import MANIFEST_FILE, load_cluster_map
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import ShardMeta, direction_dir, validate_direction
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.run import Context
from fastvocab.pipeline.tracking import StageRecord
from fastvocab.tasks.dump import (
    ShardSpec,
    dump_shard_task,
    plan_shards,
    shard_is_current,
    shard_name,
    stale_shards,
)

log = logging.getLogger(__name__)

COMPARE_KS = (1, 3, 5)  # per-cluster active fractions also reported at these K (Amer et al. Fig. 4)


# ----------------------------------------------------------------------------------------------- workers


def worker_options(ctx: Context) -> tuple[dict[str, Any], float, float]:
    """DumpActor options, CPUs and GPUs per worker."""
    cfg = ctx.cfg.dump
    threads = cfg.torch_threads or max(1, ctx.ray.cpus() // cfg.num_workers)
    options: dict[str, Any] = {
        "k": cfg.k,
        "max_len": cfg.max_len,
        "batch_size": cfg.batch_size,
        "torch_threads": threads,
    }
    if cfg.num_gpus_per_worker > 0:
        options["device"] = "cuda"  # Ray sets CUDA_VISIBLE_DEVICES to the task's GPU
    return options, float(threads), float(cfg.num_gpus_per_worker)


def run_on_workers(ctx: Context, desc: str, fn: Callable, items: list[tuple]) -> list[dict[str, Any]]:
    """Run ``fn(model_path, options, *item)`` as Ray tasks, at most ``dump.num_workers`` at a time.

    The task bodies keep their model per worker process (``tasks.dump.cached_actor``), so each worker loads
    the model once for all its shards, the dump's and the streaming's alike.
    """
    if not items:
        return []
    ray = ctx.ray.ensure()
    options, cpus, gpus = worker_options(ctx)
    ctx.ray.require_gpus(gpus, "dump.num_gpus_per_worker")
    task = ray.remote(num_cpus=cpus, num_gpus=gpus, max_retries=1)(fn)
    model = str(ctx.model().path)
    todo, running, results = list(items), [], []  # type: list[tuple], list[Any], list[dict[str, Any]]
    with ctx.bar(len(items), desc) as bar:
        while todo or running:
            while todo and len(running) < ctx.cfg.dump.num_workers:
                running.append(task.remote(model, options, *todo.pop(0)))
            done, running = ray.wait(running, num_returns=1)
            results += get_results(ray, done)
            bar.update(len(done))
    return results


def get_results(ray, refs):
    """``ray.get`` that re-raises our own errors from a task as themselves (one line, no remote traceback).

    A bad or mismatched artifact found inside a worker is the user's problem to fix, like one found on the
    driver; anything else keeps Ray's full report.
    """
    try:
        return ray.get(refs)
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, (ArtifactError, UserError, FileNotFoundError)):
            raise cause from None
        raise


def remote_fn(ctx: Context, fn: Callable, num_cpus: float = 1, num_gpus: float = 0):
    ray = ctx.ray.ensure()
    return ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(fn)


def wait_all(ctx: Context, refs: dict[str, Any], desc: str) -> dict[str, Any]:
    ray = ctx.ray.ensure()
    out, pending = {}, dict(refs)
    with ctx.bar(len(refs), desc) as bar:
        while pending:
            done, _ = ray.wait(list(pending.values()), num_returns=1)
            for name, ref in list(pending.items()):
                if ref in done:
                    out[name] = get_results(ray, ref)
                    del pending[name]
                    bar.update(1)
    return out


# ----------------------------------------------------------------------------------------------- dump


def dump_specs(ctx: Context, direction: str) -> list[ShardSpec]:
    cfg = ctx.cfg.dump
    ids, texts = ctx.sample(direction)
    n = min(cfg.sentences, len(texts))
    return plan_shards(direction, ids[:n], texts[:n], cfg.shard_sentences, cfg.max_states)


def stream_specs(ctx: Context, direction: str) -> list[ShardSpec]:
    cfg = ctx.cfg.dump
    ids, texts = ctx.sample(direction)
    n = min(cfg.sentences, len(texts))
    if cfg.stream_sentences == 0 or len(texts) <= n:
        return []
    return plan_shards(direction, ids[n:], texts[n:], cfg.shard_sentences)


def _shard_meta(ctx: Context, direction: str) -> ShardMeta:
    m = ctx.model()
    return ShardMeta(model_fingerprint=m.fingerprint, d=m.d, k=ctx.cfg.dump.k, direction=direction)


def stage_dump(ctx: Context) -> list[StageRecord]:
    cfg = ctx.cfg.dump
    m = ctx.model()
    plans: dict[str, list[ShardSpec]] = {}
    todo: list[ShardSpec] = []
    for direction in ctx.cfg.directions:
        specs = dump_specs(ctx, direction)
        if not specs:
            raise ArtifactError(
                f"no source sentences for {direction} in {ctx.corpus_dir} ({cfg.split} split)"
            )
        for stale in stale_shards(ctx.states_root, direction, len(specs)):
            log.warning("removing %s: beyond the current plan of %d shards", stale, len(specs))
            stale.unlink()
        meta = _shard_meta(ctx, direction)
        plans[direction] = specs
        for spec in specs:
            path = direction_dir(ctx.states_root, direction) / shard_name(spec.index)
            if not shard_is_current(path, meta, spec.plan(cfg.k, cfg.max_len, cfg.batch_size)):
                todo.append(spec)

    t0 = time.perf_counter()
    root, rows = str(ctx.states_root), cfg.shard_rows
    results = run_on_workers(ctx, "dump", dump_shard_task, [(spec, root, rows) for spec in todo])
    wall = time.perf_counter() - t0

    records = []
    for direction, specs in plans.items():
        files = validate_direction(ctx.states_root, direction, fingerprint=m.fingerprint)
        states = _rows(files)
        ran = [r for r in results if r["direction"] == direction and not r["skipped"]]
        n_sent = sum(len(s.sent_ids) for s in specs)
        params: dict[str, Any] = {
            "model_fingerprint": m.fingerprint,
            "direction": direction,
            "k": cfg.k,
            "sentences": n_sent,
            "max_states": cfg.max_states,
            "shard_sentences": cfg.shard_sentences,
            "batch_size": cfg.batch_size,
            "max_len": cfg.max_len,
            "split": cfg.split,
            "num_workers": cfg.num_workers,
            "num_gpus_per_worker": cfg.num_gpus_per_worker,
        }
        metrics: dict[str, float] = {"states": states, "shards": len(files), "sentences": n_sent}
        if not ran:
            records.append(
                StageRecord("dump", direction, "skipped", f"{len(files)} shards valid", params, metrics)
            )
            continue
        written = sum(float(r["states"]) for r in ran)
        busy = sum(float(r["seconds"]) for r in ran)
        metrics.update(
            states_dumped=written,
            shards_written=len(ran),
            decode_seconds=busy,
            states_per_s_per_worker=written / busy if busy > 0 else float("nan"),
            stage_wall_seconds=wall,
        )
        records.append(
            StageRecord(
                "dump",
                direction,
                "ran",
                f"{len(ran)} of {len(files)} shards written, {int(written)} states, "
                f"{metrics['states_per_s_per_worker']:.0f} states/s per worker",
                params,
                metrics,
            )
        )
    return records


def _rows(files: Sequence[Path]) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in files)


def _group_files(ctx: Context, directions: Sequence[str]) -> list[Path]:
    m = ctx.model()
    files: list[Path] = []
    for direction in directions:
        files += validate_direction(ctx.states_root, direction, fingerprint=m.fingerprint)
    return sorted(files)


# ----------------------------------------------------------------------------------------------- kmeans


def stage_kmeans(ctx: Context) -> list[StageRecord]:
    from fastvocab.tasks.kmeans import inputs_digest, kmeans_job, load_kmeans

    cfg = ctx.cfg.kmeans
    m = ctx.model()
    jobs: dict[str, dict[str, Any]] = {}
    records: dict[str, StageRecord] = {}
    for name, directions in ctx.groups().items():
        files = _group_files(ctx, directions)
        available = _rows(files)
        if available < cfg.r:
            raise UserError(
                f"k-means for {name} needs at least kmeans.r={cfg.r} states, the dump has {available}: "
                "raise dump.sentences or lower kmeans.r"
            )
        job = {
            "files": [str(f) for f in files],
            "out_dir": str(ctx.kmeans_root / name),
            "r": cfg.r,
            "niter": cfg.niter,
            "seed": cfg.seed,
            "max_points_per_centroid": cfg.max_points_per_centroid,
            "gpu": cfg.gpu,
            "threads": cfg.num_cpus,
            "model_fingerprint": m.fingerprint,
            "directions": directions,
            "inputs_digest": inputs_digest(files),
        }
        params = {k: v for k, v in job.items() if k not in ("files", "out_dir")}
        params.update(mode=ctx.cfg.maps.mode, map=name)
        out = ctx.kmeans_root / name
        if out.exists():
            _, info = load_kmeans(out)
            if _kmeans_matches(info, job):
                records[name] = StageRecord(
                    "kmeans",
                    name,
                    "skipped",
                    f"r={info.r} centroids valid (objective {info.final_objective:.4g})",
                    params,
                    {},
                )
                continue
        jobs[name] = job
        records[name] = StageRecord("kmeans", name, "ran", "", params)

    if jobs:
        ctx.ray.ensure()
        gpu = cfg.gpu and ctx.ray.has_gpu()
        if cfg.gpu and not gpu:
            log.warning("kmeans.gpu is set but the Ray cluster has no GPU: k-means runs on CPU")
        for job in jobs.values():
            job["gpu"] = gpu
        task = remote_fn(ctx, kmeans_job, num_cpus=cfg.num_cpus, num_gpus=1 if gpu else 0)
        refs = {name: task.remote(job.pop("files"), job.pop("out_dir"), **job) for name, job in jobs.items()}
        for name, info in wait_all(ctx, refs, "kmeans").items():
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
            rec.artifacts = [ctx.kmeans_root / name / "kmeans.json"]
    return list(records.values())


def _kmeans_matches(info, job: dict[str, Any]) -> bool:
    got = asdict(info)
    keys = ("r", "niter", "seed", "max_points_per_centroid", "model_fingerprint", "inputs_digest")
    return all(got[k] == job[k] for k in keys) and sorted(got["directions"]) == sorted(job["directions"])


# ----------------------------------------------------------------------------------------------- maps


def stage_maps(ctx: Context) -> list[StageRecord]:
    from fastvocab.tasks.kmeans import inputs_digest, load_kmeans
    from fastvocab.tasks.maps import array_digest, maps_job
    from fastvocab.tasks.stream import read_stream_counts, stream_meta, stream_path, stream_shard_task

    cfg, dump = ctx.cfg.maps, ctx.cfg.dump
    k = cfg.k or dump.k
    if k > dump.k:
        raise ArtifactError(
            f"maps.k={k} exceeds dump.k={dump.k}: the dump recorded only {dump.k} ids per state"
        )
    m = ctx.model()
    records: dict[str, StageRecord] = {}
    jobs: dict[str, dict[str, Any]] = {}
    pending_streams: list[tuple[ShardSpec, str, str]] = []  # (spec, map name, out path)
    centroids_of: dict[str, Any] = {}
    for name, directions in ctx.groups().items():
        centroids, info = load_kmeans(ctx.kmeans_root / name)
        files = _group_files(ctx, directions)
        streams = [
            (spec, stream_path(ctx.stream_root, name, d, spec.index))
            for d in directions
            for spec in stream_specs(ctx, d)
        ]
        expect_extra = {
            "inputs_digest": inputs_digest(files),
            "centroids_digest": array_digest(centroids),
            "stream_sentences": sum(len(s.sent_ids) for s, _ in streams),
        }
        params = {
            "model_fingerprint": m.fingerprint,
            "map": name,
            "mode": cfg.mode,
            "directions": ",".join(directions),
            "r": info.r,
            "k": k,
            "niter": info.niter,
            "seed": info.seed,
            "min_count": cfg.min_count,
            "stream_sentences": expect_extra["stream_sentences"],
        }
        map_dir = ctx.maps_root / name
        if (map_dir / MANIFEST_FILE).exists():
            # a map of another model (or settings) is stale here, not an error: it is rebuilt below
            mf = load_cluster_map(map_dir).manifest
            same = mf.model_fingerprint == m.fingerprint
            same = same and (mf.mode, mf.r, mf.k, mf.niter, mf.seed) == (
                cfg.mode,
                info.r,
                k,
                info.niter,
                info.seed,
            )
            same = same and mf.extra.get("min_count") == cfg.min_count
            same = same and all(mf.extra.get(key) == v for key, v in expect_extra.items())
            if same:
                af = mf.active_fraction
                records[name] = StageRecord(
                    "maps",
                    name,
                    "skipped",
                    f"map valid (r={mf.r}, K={mf.k}, mean active {100 * af['mean']:.2f}%)",
                    params,
                    {},
                )
                continue
        for spec, path in streams:
            meta = stream_meta(m.fingerprint, centroids, k, spec.plan(dump.k, dump.max_len, dump.batch_size))
            if read_stream_counts(path, meta) is None:
                pending_streams.append((spec, name, str(path)))
        centroids_of[name] = centroids
        jobs[name] = {
            "files": [str(f) for f in files],
            "stream_files": [str(p) for _, p in streams],
            "kmeans_dir": str(ctx.kmeans_root / name),
            "out_dir": str(map_dir),
            "mode": cfg.mode,
            "directions": directions,
            "k": k,
            "n_vocab": m.n_vocab,
            "model_fingerprint": m.fingerprint,
            "min_count": cfg.min_count,
            "compare_ks": [c for c in COMPARE_KS if c < k],
            "extra": expect_extra,
        }
        records[name] = StageRecord("maps", name, "ran", "", params)

    stream_results: list[dict[str, Any]] = []
    if pending_streams:
        ray = ctx.ray.ensure()
        refs = {name: ray.put(c) for name, c in centroids_of.items()}
        stream_results = run_on_workers(
            ctx,
            "stream",
            stream_shard_task,
            [(spec, refs[name], k, path) for spec, name, path in pending_streams],
        )
    if jobs:
        task = remote_fn(ctx, maps_job, num_cpus=1)
        refs = {
            name: task.remote(
                job.pop("files"), job.pop("stream_files"), job.pop("kmeans_dir"), job.pop("out_dir"), **job
            )
            for name, job in jobs.items()
        }
        for name, res in wait_all(ctx, refs, "maps").items():
            mf = res["manifest"]
            af = mf["active_fraction"]
            rec = records[name]
            streamed = [r for r in stream_results if r["path"].startswith(str(ctx.stream_root / name) + "/")]
            rec.message = (
                f"{mf['states_used']} states -> r={mf['r']} clusters, active {100 * af['mean']:.2f}% mean, "
                f"{100 * af['max']:.2f}% max of N={mf['n_vocab']}"
            )
            rec.metrics = {f"active_fraction_{s}": v for s, v in af.items()}
            rec.metrics.update(
                states_used=mf["states_used"],
                stored_states=mf["extra"]["stored_states"],
                streamed_states=mf["extra"]["streamed_states"],
                empty_clusters=mf["extra"]["empty_clusters"],
                maps_seconds=res["seconds"],
                stream_seconds=sum(float(r.get("seconds", 0.0)) for r in streamed),
            )
            for kk, frac in res["fractions"].items():
                rec.metrics[f"active_fraction_mean_k{kk}"] = float(frac.mean())
                rec.metrics[f"active_fraction_max_k{kk}"] = float(frac.max())
            rec.fractions = res["fractions"]
            rec.artifacts = [ctx.maps_root / name / MANIFEST_FILE]
    return list(records.values())
