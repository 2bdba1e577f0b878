"""The maps stage: assign every state to its centroid and keep per cluster the union of its members' top-K.

Streamed sentences (``dump.stream_sentences``) are decoded here, along each beam of ``maps.beams``, on the
decoding actors, because they are assigned to the trained centroids on the fly and only their counts are
kept. Then one Ray task per map merges stored and streamed counts and writes the map, whose manifest records
the beams it covers.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.cluster_map import MANIFEST_FILE, load_manifest
from fastvocab.artifacts_schema.digest import array_digest, footer_digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import REFERENCE_BEAM, shard_beam
from fastvocab.artifacts_schema.kmeans_result import load_kmeans
from fastvocab.artifacts_schema.stream_counts import read_stream_arrays, stream_meta, stream_path
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.stages.dump import decode_on_workers, extra_state_files, path_key, stream_specs
from fastvocab.pipeline.stages.kmeans import group_files
from fastvocab.pipeline.tracking import StageRecord
from fastvocab.tasks.maps import MapParams, map_name, maps_job
from fastvocab.tasks.row_shards import RowRangeSpec

log = logging.getLogger(__name__)


def run(ctx: StageContext) -> list[StageRecord]:
    beams = ctx.dump_beams()
    params = ctx.cfg.maps.params(dump_k=ctx.cfg.dump.k)
    m = ctx.model()
    records: dict[str, StageRecord] = {}
    calls: dict[str, tuple[tuple, dict[str, Any]]] = {}
    pending_streams: list[tuple[RowRangeSpec, int, str, str]] = []  # (spec, beam, map name, out path)
    centroids_of: dict[str, Any] = {}
    for name, directions in ctx.groups().items():
        centroids, info = load_kmeans(ctx.kmeans_root / name)
        extra_files = extra_state_files(ctx, directions, params.k)
        files = group_files(ctx, directions) + extra_files
        streams = [
            (spec, beam, stream_path(ctx.stream_root, name, d, spec.index, beam))
            for beam in beams
            for d in directions
            for spec in stream_specs(ctx, d)
        ]
        # what the map covers: the run's beams and those of the states from elsewhere
        covered = sorted(set(ctx.cfg.maps.beams) | ({shard_beam(f) for f in extra_files} - {REFERENCE_BEAM}))
        extra = {
            "inputs_digest": footer_digest(files),
            "centroids_digest": array_digest(centroids),
            "stream_sentences": sum(s.sentences for s, _, _ in streams),
        }
        rec_params = {
            "model_fingerprint": m.fingerprint,
            "map": name,
            "scope": params.scope,
            "directions": ",".join(directions),
            "r": info.r,
            "k": params.k,
            "niter": info.niter,
            "seed": info.seed,
            "min_count": params.min_count,
            "normaliser_rank": params.normaliser_rank,
            "probes": params.probes,
            "stream_sentences": extra["stream_sentences"],
            "extra_states": ",".join(ctx.cfg.maps.extra_states),
            "beams": ",".join(str(b) for b in covered),
        }
        map_dir = ctx.maps_root / name
        mf = _current_manifest(map_dir)
        if mf is not None and mf.direction != map_name(params.scope, directions):
            log.warning("rebuilding %s: it was built for %s", map_dir, mf.direction)
            mf = None
        if mf is not None and mf.beams == covered and _map_current(mf, params, info, m.fingerprint, extra):
            af = mf.active_fraction
            msg = f"map valid (r={mf.r}, K={mf.k}, mean active {100 * af['mean']:.2f}%)"
            records[name] = StageRecord("maps", name, "skipped", msg, rec_params, {})
            continue
        for spec, beam, path in streams:
            meta = stream_meta(m.fingerprint, centroids, params.k, spec.plan(ctx.cfg.dump.settings(beam)))
            if read_stream_arrays(path, meta) is None:
                pending_streams.append((spec, beam, name, str(path)))
        centroids_of[name] = centroids
        args = (
            [str(f) for f in files],
            [str(p) for _, _, p in streams],
            str(ctx.kmeans_root / name),
            str(map_dir),
        )
        kwargs = {
            "directions": directions,
            # the normaliser reads the model's output layer: one CPU thread, as the task's num_cpus
            "run_ctx": ctx.run_context("cpu", 1),
            "extra": extra,
        }
        calls[name] = ((*args, params), kwargs)
        records[name] = StageRecord("maps", name, "ran", "", rec_params)

    if not calls:
        _publish(ctx)
        return list(records.values())
    stream_results: list[dict[str, Any]] = []
    if pending_streams:
        refs = {name: ctx.ray.put(c) for name, c in centroids_of.items()}
        items = [(spec, refs[name], params.k, path, beam) for spec, beam, name, path in pending_streams]
        stream_results = decode_on_workers(ctx, "stream", items, "stream")
    with ctx.bar(len(calls), "maps", unit="map") as bar:
        results = ctx.ray.run_tasks(maps_job, calls, bar, num_cpus=1)
    for name, res in results.items():
        mf = res["manifest"]
        af = mf["active_fraction"]
        rec = records[name]
        streamed = [r for r in stream_results if r["path"].startswith(str(ctx.stream_root / name) + "/")]
        rec.message = (
            f"{mf['states_used']} states -> r={mf['r']} clusters, active {100 * af['mean']:.2f}% mean, "
            f"{100 * af['max']:.2f}% max of N={mf['n_vocab']}"
        )
        if mf["beams"] != [1]:
            rec.message += f"; beams {', '.join(map(str, mf['beams']))}"
        if mf["probes"] != 1:
            rec.message += f"; decoded with {mf['probes']} probes"
        rec.metrics = {f"active_fraction_{s}": v for s, v in af.items()}
        rec.metrics.update(
            states_used=mf["states_used"],
            stored_states=mf["extra"]["stored_states"],
            streamed_states=mf["extra"]["streamed_states"],
            empty_clusters=mf["extra"]["empty_clusters"],
            maps_seconds=res["seconds"],
            normaliser_seconds=res["normaliser_seconds"],
            stream_seconds=sum(float(r.get("seconds", 0.0)) for r in streamed),
        )
        if mf["beams"] != [1]:
            rec.metrics.update({f"states_{path_key(int(b))}": float(n) for b, n in mf["beam_states"].items()})
        for kk, frac in res["fractions"].items():
            rec.metrics[f"active_fraction_mean_k{kk}"] = float(frac.mean())
            rec.metrics[f"active_fraction_max_k{kk}"] = float(frac.max())
        rec.fractions = res["fractions"]
        rec.artifacts = [ctx.maps_root / name / MANIFEST_FILE]
    _publish(ctx)
    return list(records.values())


def _publish(ctx: StageContext) -> None:
    """Copy the maps to ``maps.publish`` with their build record (tasks/publish.py), when it is set."""
    out = ctx.cfg.maps.publish
    if out is None:
        return
    import sys

    from fastvocab.artifacts_schema.corpus import read_sources_record, sources_path
    from fastvocab.artifacts_schema.provenance import git_commit
    from fastvocab.tasks.publish import publish_maps

    cfg = ctx.cfg
    sources = {}
    for d in cfg.directions:
        found = read_sources_record(sources_path(ctx.sources_root, d)) or {}
        sources[d] = {k: found.get(k) for k in ("rows", "with_reference", "stats")}
        sources[d]["inputs"] = [i.get("name") for i in found.get("inputs", [])]
    record = {
        "model": str(cfg.model),
        "model_fingerprint": ctx.model().fingerprint,
        "command": " ".join(["fastvocab", *sys.argv[1:]]),
        "commit": git_commit(digits=12),
        "sources": sources,
        "settings": {
            "dump": cfg.dump.model_dump(mode="json", exclude={"num_workers", "num_gpus_per_worker"}),
            "kmeans": cfg.kmeans.model_dump(mode="json"),
            "maps": cfg.maps.model_dump(mode="json", exclude={"publish"}),
        },
    }
    copied = publish_maps(ctx.maps_root, list(ctx.groups()), Path(out), record)
    if copied:
        log.info("published %s to %s", ", ".join(copied), out)


def _current_manifest(map_dir):
    """The manifest of an existing map, or None when there is none or it is of an older format (rebuilt)."""
    if not (map_dir / MANIFEST_FILE).exists():
        return None
    try:
        return load_manifest(map_dir)
    except ArtifactError as exc:
        log.warning("rebuilding %s: %s", map_dir, exc)
        return None


def _map_current(mf, params: MapParams, info, fingerprint: str, extra: dict[str, Any]) -> bool:
    """A map of another model or other settings is stale here, not an error: it is rebuilt."""
    same = mf.model_fingerprint == fingerprint
    same = same and (mf.scope, mf.r, mf.k, mf.niter, mf.seed) == (
        params.scope,
        info.r,
        params.k,
        info.niter,
        info.seed,
    )
    same = same and mf.extra.get("min_count") == params.min_count
    same = same and mf.normaliser.get("rank") == min(params.normaliser_rank, mf.d)
    same = same and mf.probes == params.probes  # maps before version 5 read as 1
    return same and all(mf.extra.get(key) == v for key, v in extra.items())
