"""The translate stage: each direction's evaluation sample with every method in ``eval.methods``.

All methods of a direction run in one actor (so their speed ratios compare like with like), full first. A
method that is not available in this installation, or lacks its artifact, is reported as ``unavailable`` with
the reason, and the run goes on. Outputs whose JSON record matches the current provenance are kept.
Each direction's record carries a sample of its translations (the first ``SAMPLE_ROWS`` sentences: source,
reference, one hypothesis column per method), logged as an MLflow table.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.cluster_map import (
    MANIFEST_FILE,
    REBUILD_HINT,
    coverage_problem,
    map_dir_name,
    resolve_map_dir,
)
from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.digest import text_digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.translations import read_hypotheses
from fastvocab.decoding.settings import engine_for
from fastvocab.kernels.clustered import decoding_probes
from fastvocab.kernels.full import FullOptions
from fastvocab.kernels.options import MethodOptions
from fastvocab.kernels.registry import options_types
from fastvocab.pipeline.checks import check_map_direction
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.tracking import SAMPLE_ROWS, SAMPLE_TABLE, StageRecord
from fastvocab.tasks.methods import INDEXED_METHODS
from fastvocab.tasks.translate_job import TranslateJob, TranslateWorker, sample_current

log = logging.getLogger(__name__)


def eval_sample(ctx: StageContext, direction: str) -> tuple[list[int], list[str], list[str]]:
    """(ids, sources, references) of the direction's evaluation split (``eval.split``, ``eval.sentences``)."""
    src, _, tgt = direction.partition("-")
    ev = ctx.cfg.eval
    ids, sources, refs = read_direction(ctx.corpus_dir, src, tgt, ev.split, limit=ev.sentences)
    if not sources:
        raise ArtifactError(f"no {ev.split} sentences for {direction} in {ctx.corpus_dir} (eval.split)")
    return list(ids), list(sources), list(refs)


def eval_methods(ctx: StageContext) -> list[tuple[str, str, Path | None]]:
    """``(label, method, maps folder)`` of every method the evaluation runs: ``eval.methods`` (clustered
    with the run's maps), then ``clustered-<name>`` for each of ``eval.maps``."""
    own = [(m, m, ctx.maps_root if m == "clustered" else None) for m in ctx.cfg.eval.methods]
    other = [(f"clustered-{name}", "clustered", Path(root)) for name, root in ctx.cfg.eval.maps.items()]
    return own + other


def _method_plan(
    ctx: StageContext, direction: str, method: str, label: str | None = None, maps_root: Path | None = None
) -> tuple[MethodOptions, dict[str, Any]] | str:
    """(the method's options, what its artifacts were made from) for a direction, or the reason it cannot
    run; clustered reads its map from ``maps_root`` (default: the run's). Every folder is found and
    checked here, once."""
    from fastvocab.kernels import available_projections

    if method not in available_projections():
        return f"method {method!r} is not registered (available: {', '.join(available_projections())})"
    t = ctx.cfg.translate
    prov: dict[str, Any] = {"method": label or method}
    shortlist: str | None = None
    options: MethodOptions = FullOptions()
    if method == "clustered":
        src, _, tgt = direction.partition("-")
        # the map of the configured scope (a folder of the other scope may be left from an earlier run)
        own = maps_root is None or maps_root == ctx.maps_root
        root = ctx.maps_root if maps_root is None else maps_root
        map_dir = root / map_dir_name(src, tgt, ctx.cfg.maps.scope)
        if not own and not (map_dir / MANIFEST_FILE).exists():
            # maps built elsewhere serve as decoding finds them: the direction's own, else its target's pooled
            with contextlib.suppress(ArtifactError):  # none there: the line below says where it looked
                map_dir = resolve_map_dir(root, src, tgt)
        if not (map_dir / MANIFEST_FILE).exists():
            return f"no cluster map at {map_dir}" + (" (run the maps stage)" if own else "")
        if not own:  # a map of another model decodes nonsense: refused with the one-line fingerprint error
            from fastvocab.artifacts_schema.cluster_map import check_map_model

            check_map_model(map_dir, ctx.model().fingerprint)
        # a map of another direction (copied into place) would decode with the wrong language's tokens
        manifest = check_map_direction(map_dir, src, tgt, fix=REBUILD_HINT)
        # a map not built for translate.beam still decodes; one line says so, and how to rebuild it
        warning = coverage_problem(manifest, t.beam, map_dir)
        if warning is not None:
            log.warning("translate %s: %s", direction, warning)
        # the manifest names the map's tensors by their digest: no need to read and hash them here
        prov.update(map=map_dir.name, map_digest=manifest.tensors_digest, selection=t.selection)
        # the probes decoding reads (the map's unless the config says): not in the tensors' digest
        prov["probes"] = decoding_probes(t.probes, manifest.probes, t.selection)
        if t.shortlist is not None:
            found = _shortlist_table(ctx, direction)
            if isinstance(found, str):
                return found
            shortlist, prov["shortlist_digest"] = found
        options = t.clustered(str(map_dir), shortlist)
        # the options as recorded: the map and the table are named by their digests
        kwargs = options.projection_kwargs(t.beam)
        prov["options"] = {k: v for k, v in kwargs.items() if k not in ("cluster_map", "shortlist")}
    elif method in INDEXED_METHODS:
        found = _index_artifact(ctx, direction, method)
        if isinstance(found, str):
            return found
        index, index_digest = found
        # the projection's own defaults for k (lsh, graph) or the table's (shortlist)
        prov.update(options="defaults", index_digest=index_digest)
        given = {"direction": direction} if method == "shortlist" else {}
        options = options_types()[method](index=index, **given)  # type: ignore[call-arg]
    elif method != "full":
        # Other methods take options the pipeline does not know yet: they run with their defaults.
        prov["options"] = "defaults"
        options = options_types()[method]()
    return options, prov


def _shortlist_table(ctx: StageContext, direction: str) -> tuple[str, str] | str:
    """(folder, digest) of ``translate.shortlist``'s table for ``direction``, or the reason it cannot run (a
    table of another model or direction is an ArtifactError: it would decode with the wrong candidates)."""
    from fastvocab.artifacts_schema.method_index import MANIFEST_FILE as INDEX_MANIFEST
    from fastvocab.artifacts_schema.method_index import load_index_manifest
    from fastvocab.tasks.methods import index_dir

    root = ctx.cfg.translate.shortlist
    assert root is not None  # the caller checked
    folder = index_dir(root, "shortlist", direction)
    if not (folder / INDEX_MANIFEST).exists():
        return f"no shortlist table at {folder} (translate.shortlist)"
    manifest = load_index_manifest(folder)
    if manifest.method != "shortlist" or manifest.direction != direction:
        what = f"a {manifest.method} artifact for {manifest.direction}"
        raise ArtifactError(f"translate.shortlist: {folder} holds {what}, not a {direction} shortlist")
    if manifest.model_fingerprint != ctx.model().fingerprint:
        raise ArtifactError(
            f"translate.shortlist: {folder} was built for model {manifest.model_fingerprint}, "
            f"but the loaded model is {ctx.model().fingerprint}"
        )
    return str(folder), manifest.tensors_digest


def _index_artifact(ctx: StageContext, direction: str, method: str) -> tuple[str, str] | str:
    """(folder, digest) of the methods stage's lsh, graph or shortlist artifact for ``direction`` in the work
    dir, or the reason it cannot run."""
    from fastvocab.artifacts_schema.method_index import ANY_DIRECTION, load_index_manifest
    from fastvocab.artifacts_schema.method_index import MANIFEST_FILE as INDEX_MANIFEST
    from fastvocab.tasks.methods import METHODS_DIR, MODEL_WIDE, index_dir

    folder = index_dir(
        ctx.work_dir / METHODS_DIR, method, ANY_DIRECTION if method in MODEL_WIDE else direction
    )
    if not (folder / INDEX_MANIFEST).exists():
        return f"no {method} artifact at {folder} (add {method} to methods.build)"
    manifest = load_index_manifest(folder)
    if manifest.direction not in (ANY_DIRECTION, direction):
        return f"{folder} holds a {method} artifact for {manifest.direction}, not {direction}"
    return str(folder), manifest.tensors_digest


# one direction's sample and the jobs that translate it (in one actor, so that their speeds compare alike)
Sample = tuple[tuple[TranslateJob, ...], list[int], list[str], str]


def run(ctx: StageContext) -> list[StageRecord]:
    t = ctx.cfg.translate
    m = ctx.model()
    records: dict[str, StageRecord] = {}
    work: list[Sample] = []
    samples: dict[str, tuple[list[int], list[str], list[str], list[Path]]] = {}
    for direction in ctx.cfg.directions:
        ids, sources, refs = eval_sample(ctx, direction)
        params: dict[str, Any] = {
            "model_fingerprint": m.fingerprint,
            "split": ctx.cfg.eval.split,
            "sentences": len(sources),
            "beam": t.beam,
            "batch_size": t.batch_size,
            "max_len": t.max_len,
            "early_stopping": t.early_stopping,
            "selection": t.selection,
            "inactive_mass": t.inactive_mass,
            "exact": t.exact,
            "device": t.device,
        }
        digest = text_digest(sources)
        jobs, unavailable = _direction_jobs(ctx, direction)
        current = [j for j in jobs if sample_current(j, digest)]
        jobs = [j for j in jobs if j not in current]
        if jobs and any(j.method == "full" for j in current):
            # speed ratios compare methods timed in the same process: time full again with the others
            jobs += [j for j in current if j.method == "full"]
            current = [j for j in current if j.method != "full"]
        params["methods"] = ",".join(ctx.cfg.eval.labels())
        params["engine"] = t.engine
        outputs = sorted((Path(j.out) for j in current + jobs), key=lambda p: p.stem != "full")
        samples[direction] = (ids, sources, refs, outputs)
        note = f"; unavailable: {'; '.join(unavailable)}" if unavailable else ""
        if not jobs:
            status = "skipped" if current else "unavailable"
            done = ", ".join(j.method for j in current)
            msg = f"translations current for {done}" if current else "no method could run"
            records[direction] = StageRecord("translate", direction, status, msg + note, params)
            continue
        # full first: the other methods' search errors and speed ratios are measured against it
        jobs.sort(key=lambda j: j.method != "full")
        work.append((tuple(jobs), ids, sources, digest))
        records[direction] = StageRecord("translate", direction, "ran", note, params)
    if work:
        _translate(ctx, work, records)
    for direction, rec in records.items():
        table = sample_table(*samples[direction])
        if table is not None:
            rec.tables[SAMPLE_TABLE] = table
    return list(records.values())


def _direction_jobs(ctx: StageContext, direction: str) -> tuple[list[TranslateJob], list[str]]:
    """The jobs of every method the evaluation runs for ``direction``, and why the others cannot run."""
    t = ctx.cfg.translate
    src, _, tgt = direction.partition("-")
    jobs, unavailable = [], []
    for label, method, maps_root in eval_methods(ctx):
        plan = _method_plan(ctx, direction, method, label, maps_root)
        if isinstance(plan, str):
            log.warning("translate %s: skipping %s: %s", direction, label, plan)
            unavailable.append(f"{label}: {plan}")
            continue
        options, made_from = plan
        out = ctx.translations_root / direction / f"{label}.parquet"
        jobs.append(
            TranslateJob(
                ctx.model(),
                src,
                tgt,
                options,
                str(out),
                search=t.search(),
                device=t.device,
                # its timings, and its int8 outputs, are the engine's own
                engine=engine_for(t.engine, t.graphs),
                made_from=made_from,
                label=None if label == method else label,
            )
        )
    return jobs, unavailable


def sample_table(
    ids: list[int], sources: list[str], refs: list[str], outputs: list[Path]
) -> dict[str, list[object]] | None:
    """The first ``SAMPLE_ROWS`` sentences as columns: ``id``, ``source``, ``reference`` (where the sample
    has references) and ``hypothesis_<method>`` for each translations file in ``outputs`` (None when there is
    none): what a reviewer reads in the run beside its scores."""
    n = min(SAMPLE_ROWS, len(sources))
    columns: dict[str, list[object]] = {"id": list(ids[:n]), "source": list(sources[:n])}
    if any(r for r in refs[:n]):
        columns["reference"] = list(refs[:n])
    hyps = {p.stem: read_hypotheses(p, sources)[:n] for p in outputs if p.exists()}
    if not hyps:
        return None
    columns.update({f"hypothesis_{label}": list(h) for label, h in hyps.items()})
    return columns


def _translate(ctx: StageContext, work: list[Sample], records: dict[str, StageRecord]) -> None:
    """The directions' samples on a pool of translation actors; their speeds and signatures into the
    records."""
    t = ctx.cfg.translate
    _, threads, _ = ctx.decoder_workers()
    gpus = 1.0 if t.device.startswith("cuda") else 0.0
    ctx.ray.require_gpus(gpus, f"translate.device={t.device}")
    items: list[Sample] = [
        (tuple(replace(j, torch_threads=int(threads)) for j in jobs), ids, sources, digest)
        for jobs, ids, sources, digest in work
    ]
    with ctx.bar(len(work), "translate", unit="direction") as bar:
        results = ctx.ray.map_actors(
            TranslateWorker,
            (items[0][0][0],),  # every job decodes the run's model alike: the actors load it from one
            "translate_sample",
            items,
            bar,
            size=ctx.cfg.dump.num_workers,
            num_cpus=threads,
            num_gpus=gpus,
            ordered=True,
        )
    for (jobs, *_), res in zip(work, results, strict=True):
        rec = records[jobs[0].direction]
        for r in res:
            meth = r["method"]
            rec.metrics.update(
                {
                    f"tokens_per_s_{meth}": r["tokens_per_s"],
                    f"sentences_per_s_{meth}": r["sentences_per_s"],
                    f"seconds_{meth}": r["seconds"],
                }
            )
            # how close to exact a clustered run was (None for methods without these counters: not logged)
            rec.metrics[f"active_columns_per_row_{meth}"] = r.get("active_columns_per_row")
            rec.metrics[f"certified_fraction_{meth}"] = r.get("certified_fraction")
            rec.params[f"signature_{meth}"] = r["signature"]
        done = ", ".join(f"{r['method']} {r['tokens_per_s']:.0f} tok/s" for r in res)
        if t.engine != "auto":
            done += f" (engine {t.engine})"
        rec.message = f"{done}{rec.message}"
