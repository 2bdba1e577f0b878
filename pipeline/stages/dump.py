"""The dump stage: decode each direction's sample with full softmax and store states + top-K per step,
along each beam of ``maps.beams``: the greedy path for 1, every live hypothesis of beam search for b > 1.
Each beam's shards are kept apart (``states/`` for the greedy path, ``states/beam=<b>/`` for beam b) and
resume shard by shard.

Plans deterministic shards on the driver, skips those whose file matches the plan, and sends the rest to a
pool of :class:`~fastvocab.tasks.workers.DecoderWorker` actors. A shard is a range of rows of the corpus file
(:mod:`fastvocab.tasks.row_shards`): the driver streams the file once to digest each range and never holds
the sample's texts; each worker reads its own rows. The streaming part of the sample
(``dump.stream_sentences``) is planned here too, and decoded by the maps stage (it needs the centroids).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.corpus import sources_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import (
    REFERENCE_BEAM,
    ShardMeta,
    beam_label,
    read_shard_meta,
    remove_shard,
    shard_path,
    shard_rows,
    shard_status,
    stale_shards,
    validate_beams,
)
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.tracking import StageRecord
from fastvocab.tasks.dump_sources import SourcesResult
from fastvocab.tasks.row_shards import RowRangeSpec, SampleFile, plan_row_shards
from fastvocab.tasks.workers import DecoderWorker

log = logging.getLogger(__name__)


def build_source_file(ctx: StageContext, direction: str) -> SourcesResult:
    """The direction's dump input (``dump.sources`` into ``sources/<direction>.parquet``), built on the
    driver unless current."""
    from fastvocab.tasks.dump_sources import build_sources

    try:
        return build_sources(
            ctx.corpus_dir,
            direction,
            ctx.cfg.dump.sources,
            sources_path(ctx.sources_root, direction),
            catalogs_dir=ctx.cfg.corpus.catalogs.out_dir,
        )
    except ArtifactError as exc:
        raise UserError(f"dump.sources: {exc}") from exc


def sample_source(ctx: StageContext, direction: str) -> SampleFile:
    """The file of a direction's sample (its first ``dump.sentences + dump.stream_sentences`` rows); warns
    when it has fewer rows than that."""
    cfg = ctx.cfg.dump
    built = build_source_file(ctx, direction)
    source = SampleFile(built.path, "id", "text", built.rows, "reference")
    if "all" not in (cfg.sentences, cfg.stream_sentences):
        want = int(cfg.sentences) + int(cfg.stream_sentences)
        if source.rows < want:
            log.warning("%s: the dump sources hold %d sentences, %d asked for", direction, source.rows, want)
    return source


def _stored(cfg, source: SampleFile) -> int:
    """How many of the sample's first rows are stored (``dump.sentences``, ``all``: every row)."""
    return source.rows if cfg.sentences == "all" else min(int(cfg.sentences), source.rows)


def dump_specs(ctx: StageContext, direction: str) -> list[RowRangeSpec]:
    """The direction's dump shards: rows ``[0, dump.sentences)`` of its sample file, as row ranges."""
    cfg = ctx.cfg.dump
    source = sample_source(ctx, direction)
    n = _stored(cfg, source)
    return plan_row_shards(
        source, direction, 0, n, cfg.shard_sentences, cfg.max_states, references=cfg.reference
    )


def stream_specs(ctx: StageContext, direction: str) -> list[RowRangeSpec]:
    """The direction's stream shards: the ``dump.stream_sentences`` rows after the dumped ones (``all``:
    every row after them)."""
    cfg = ctx.cfg.dump
    if cfg.stream_sentences == 0:
        return []
    source = sample_source(ctx, direction)
    n = _stored(cfg, source)
    stop = source.rows if cfg.stream_sentences == "all" else n + int(cfg.stream_sentences)
    return plan_row_shards(source, direction, n, stop, cfg.shard_sentences, references=cfg.reference)


def own_state_files(ctx: StageContext, directions: Sequence[str]) -> list[Path]:
    """This run's validated shards of every direction feeding one map, along every path it dumps
    (:meth:`StageContext.dump_beams`), each path's sorted."""
    return [f for b in ctx.dump_beams() for f in sorted(f for d in directions for f in ctx.shard_files(d, b))]


def extra_state_files(ctx: StageContext, directions: Sequence[str], k: int | None = None) -> list[Path]:
    """The shards of ``maps.extra_states`` for these directions (k-means and the maps read them with the run's
    own): every beam's found under each root (``<root>/direction=*``, ``<root>/beam=<b>/direction=*``),
    validated against the model and, with ``k``, recording at least the ``k`` ids per state the maps keep."""
    files: list[Path] = []
    fingerprint = ctx.model().fingerprint
    for root in ctx.cfg.maps.extra_states:
        for d in directions:
            try:
                found = [f for fs in validate_beams(root, d, fingerprint=fingerprint).values() for f in fs]
            except ArtifactError as exc:
                raise UserError(f"maps.extra_states: {exc}") from exc
            for f in found:
                dumped_k = read_shard_meta(f).k
                if k is not None and dumped_k < k:
                    raise UserError(
                        f"maps.extra_states: {root} recorded K={dumped_k} ids per state for {d}, below "
                        f"maps.k={k}"
                    )
            files += found
    return files


def decode_on_workers(
    ctx: StageContext, method: str, items: Sequence[tuple], desc: str
) -> list[dict[str, Any]]:
    """Run ``DecoderWorker.<method>(*item)`` for every item on a pool of decoding actors."""
    if not items:
        return []
    size, cpus, gpus = ctx.decoder_workers()
    ctx.ray.require_gpus(gpus, "dump.num_gpus_per_worker")
    # Ray sets CUDA_VISIBLE_DEVICES to the actor's GPU
    # one decoder per actor serves every beam (DumpDecoder.along)
    args = (ctx.run_context("cuda" if gpus > 0 else "cpu", int(cpus)), ctx.cfg.dump.settings())
    with ctx.bar(len(items), desc) as bar:
        return ctx.ray.map_actors(
            DecoderWorker, args, method, items, bar, size=size, num_cpus=cpus, num_gpus=gpus
        )


def _plan_shards(
    ctx: StageContext, sources: dict[str, SourcesResult], beams: list[int]
) -> tuple[dict[str, list[RowRangeSpec]], list[tuple[RowRangeSpec, int]], dict[str, list[str]]]:
    """Each direction's shards, the (shard, beam) pairs whose states are not current (the widest beam
    first), and the shard files found corrupt (removed, to be redone) by direction; shards beyond the plan
    are removed."""
    cfg = ctx.cfg.dump
    m = ctx.model()
    plans: dict[str, list[RowRangeSpec]] = {}
    todo: list[tuple[RowRangeSpec, int]] = []  # (shard, beam)
    corrupt: dict[str, list[str]] = {}  # direction -> shard files found corrupt and redone
    for direction in ctx.cfg.directions:
        specs = dump_specs(ctx, direction)
        if not specs:
            raise ArtifactError(
                f"no source sentences for {direction} in {sources[direction].path} (dump.sources)"
            )
        plans[direction] = specs
        meta = ShardMeta(model_fingerprint=m.fingerprint, d=m.d, k=cfg.k, direction=direction)
        for beam in beams:
            root = ctx.beam_states_root(beam)
            settings = cfg.settings(beam)
            for stale in stale_shards(root, direction, len(specs)):
                log.warning("removing %s: beyond the current plan of %d shards", stale, len(specs))
                remove_shard(stale)
            for spec in specs:
                path = shard_path(root, direction, spec.index)
                status = shard_status(path, meta, spec.plan(settings))
                if status.startswith("corrupt"):
                    # our own shard (it has our checksum file), damaged after it was written: redo it
                    log.warning("dump %s: %s is corrupt (%s): redoing it", direction, path, status[9:])
                    remove_shard(path)
                    name = path.name if beam == 1 else f"{path.parent.parent.name}/{path.name}"
                    corrupt.setdefault(direction, []).append(name)
                if status != "current":
                    todo.append((spec, beam))
    todo.sort(key=lambda item: -item[1])  # the slowest (widest beam) first: the pool ends together
    return plans, todo, corrupt


def run(ctx: StageContext) -> list[StageRecord]:
    cfg = ctx.cfg.dump
    beams = ctx.dump_beams()
    m = ctx.model()
    sources = {d: build_source_file(ctx, d) for d in ctx.cfg.directions}
    plans, todo, corrupt = _plan_shards(ctx, sources, beams)

    t0 = time.perf_counter()
    items = [(spec, str(ctx.beam_states_root(beam)), cfg.shard_rows, beam) for spec, beam in todo]
    results = decode_on_workers(ctx, "dump", items, "dump")
    wall = time.perf_counter() - t0

    records = []
    for direction, specs in plans.items():
        ran = [r for r in results if r["direction"] == direction and not r["skipped"]]
        files: list[Path] = []
        metrics: dict[str, float] = {}
        for beam in beams:
            if any(r["beam"] == beam for r in ran):
                ctx.forget_shards(direction, beam)
            own = ctx.shard_files(direction, beam)
            files += own
            if beams != [1]:
                metrics[f"states_{path_key(beam)}"] = sum(shard_rows(own))
        n_sent = sum(s.sentences for s in specs)
        params: dict[str, Any] = {
            "model_fingerprint": m.fingerprint,
            "direction": direction,
            "k": cfg.k,
            "beams": ",".join(str(b) for b in beams),
            "sentences": n_sent,
            "max_states": cfg.max_states,
            "shard_sentences": cfg.shard_sentences,
            "batch_size": cfg.batch(),
            "graphs": cfg.graphs,
            "max_len": cfg.max_len,
            "sources": ",".join(cfg.sources),
            "reference": cfg.reference,
            "num_workers": cfg.num_workers,
            "num_gpus_per_worker": cfg.num_gpus_per_worker,
        }
        src = sources[direction]
        metrics.update(
            states=sum(shard_rows(files)),
            shards=len(files),
            sentences=n_sent,
            source_lines=src.rows,
            source_lines_with_reference=src.with_reference,
            held_out_lines_dropped=src.held_out,
        )
        held = (
            f"; {src.held_out} dev/test lines left out of {src.rows + src.held_out}" if src.held_out else ""
        )
        if not ran:
            msg = f"{len(files)} shards valid" + held
            records.append(StageRecord("dump", direction, "skipped", msg, params, metrics))
            continue
        redone = corrupt.get(direction, [])
        if redone:
            params["corrupt_shards_redone"] = ",".join(redone)
        written = sum(float(r["states"]) for r in ran)
        busy = sum(float(r["seconds"]) for r in ran)
        metrics.update(
            states_dumped=written,
            shards_written=len(ran),
            decode_seconds=busy,
            states_per_s_per_worker=written / busy if busy > 0 else float("nan"),
            stage_wall_seconds=wall,
        )
        per_beam = ""
        if beams != [1]:
            for beam in beams:
                mine = [r for r in ran if r["beam"] == beam]
                key = path_key(beam)
                secs = sum(float(r["seconds"]) for r in mine)
                metrics[f"decode_seconds_{key}"] = secs
                if secs > 0:
                    metrics[f"states_per_s_per_worker_{key}"] = sum(float(r["states"]) for r in mine) / secs
            per_beam = "; decode s by path: " + ", ".join(
                f"{beam_label(b)}: {metrics[f'decode_seconds_{path_key(b)}']:.0f}" for b in beams
            )
        records.append(
            StageRecord(
                "dump",
                direction,
                "ran",
                f"{len(ran)} of {len(files)} shards written, {int(written)} states, "
                f"{metrics['states_per_s_per_worker']:.0f} states/s per worker"
                + per_beam
                + held
                + (f"; corrupt shards redone: {', '.join(redone)}" if redone else ""),
                params,
                metrics,
            )
        )
    return records


def path_key(beam: int) -> str:
    """A path's name in metric keys: ``reference``, ``beam1``, ``beam4``."""
    return "reference" if beam == REFERENCE_BEAM else f"beam{beam}"
