"""The corpus stage (inputs) and the translate / evaluate stages (outputs) of the pipeline.

Corpus: the directions' files must exist in the corpus layout (``artifacts_schema/corpus.py``); when they do
not, the Debian description corpus is built with ``fastvocab.tasks.corpus`` (pivot pairs only).

Translate / evaluate: run per direction for every method in ``eval.methods`` with the task functions of the
decoding room (``fastvocab.tasks.translate``, ``fastvocab.tasks.evaluate``). A method or task that is not
available in this installation is reported as ``unavailable`` with the reason, and the run goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab.artifacts_schema.corpus import split_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.run import Context
from fastvocab.pipeline.tracking import StageRecord

log = logging.getLogger(__name__)


def _pair_file(ctx: Context, direction: str, split: str):
    src, _, tgt = direction.partition("-")
    for a, b in ((src, tgt), (tgt, src)):
        path = split_path(ctx.corpus_dir, a, b, split)
        if path.exists():
            return path
    return None


def stage_corpus(ctx: Context) -> list[StageRecord]:
    cfg = ctx.cfg
    split = cfg.dump.split
    if split == "mono":
        from fastvocab.artifacts_schema.corpus import mono_path

        records = []
        for direction in cfg.directions:
            src = direction.partition("-")[0]
            path = mono_path(ctx.corpus_dir, src)
            if not path.exists():
                raise UserError(
                    f"dump.split is 'mono' but {path} does not exist (fastvocab corpus --mono ...)"
                )
            rows = pq.ParquetFile(path).metadata.num_rows
            records.append(StageRecord("corpus", direction, "skipped", f"{rows} {src} sentences in {path}"))
        return records

    missing = [d for d in cfg.directions if _pair_file(ctx, d, split) is None]
    built: set[str] = set()
    if missing:
        pivot = cfg.corpus.pivot
        not_pivot = [d for d in missing if pivot not in d.split("-")]
        if not_pivot:
            raise UserError(
                f"no {split} corpus for {', '.join(not_pivot)} in {ctx.corpus_dir}, and the built-in corpus "
                f"only has {pivot}-xx pairs: run `fastvocab corpus` with your own files first"
            )
        try:
            from fastvocab.tasks.corpus import build_debian_corpus
        except ImportError as exc:
            raise UserError(
                f"no {split} corpus for {', '.join(missing)} in {ctx.corpus_dir} and the corpus task is not "
                f"installed ({exc}); create it with `fastvocab corpus` first"
            ) from exc
        langs = sorted({x for d in missing for x in d.split("-")})
        log.info("building the Debian description corpus for %s in %s", ", ".join(langs), ctx.corpus_dir)
        build_debian_corpus(
            ctx.corpus_dir,
            langs,
            pivot=pivot,
            dev_size=cfg.corpus.dev_size,
            test_size=cfg.corpus.test_size,
            seed=cfg.corpus.seed,
            lists_dir=cfg.corpus.lists_dir,
        )
        built = set(missing)
    records = []
    for direction in cfg.directions:
        path = _pair_file(ctx, direction, split)
        if path is None:
            raise ArtifactError(
                f"the corpus stage produced no {split} split for {direction} in {ctx.corpus_dir}"
            )
        rows = pq.ParquetFile(path).metadata.num_rows
        status = "ran" if direction in built else "skipped"
        records.append(
            StageRecord(
                "corpus",
                direction,
                status,
                f"{rows} {split} pairs in {path}",
                params={"corpus_dir": str(ctx.corpus_dir), "split": split},
                metrics={f"{split}_pairs": rows},
            )
        )
    return records


# ----------------------------------------------------------------------------------------------- translate


def _file_digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b";")
        h.update(p.read_bytes())
    return "sha256:" + h.hexdigest()[:32]


def _text_digest(texts: list[str]) -> str:
    return "sha256:" + hashlib.sha256("\n".join(texts).encode()).hexdigest()[:32]


def _eval_sample(ctx: Context, direction: str) -> tuple[list[int], list[str], list[str]]:
    from fastvocab.artifacts_schema.corpus import read_direction

    src, _, tgt = direction.partition("-")
    ev = ctx.cfg.eval
    ids, sources, refs = read_direction(ctx.corpus_dir, src, tgt, ev.split, limit=ev.sentences)
    if not sources:
        raise ArtifactError(f"no {ev.split} sentences for {direction} in {ctx.corpus_dir} (eval.split)")
    return list(ids), list(sources), list(refs)


def _method_plan(ctx: Context, direction: str, method: str) -> tuple[dict[str, Any], dict[str, Any]] | str:
    """(projection options, provenance) of a method for a direction, or the reason it cannot run."""
    from fastvocab.kernels import available_projections

    if method not in available_projections():
        return f"method {method!r} is not registered (available: {', '.join(available_projections())})"
    t = ctx.cfg.translate
    options: dict[str, Any] = {}
    prov: dict[str, Any] = {"method": method}
    if method == "clustered":
        from fastvocab.artifacts_schema.cluster_map import MANIFEST_FILE, TENSORS_FILE, map_dir_name

        src, _, tgt = direction.partition("-")
        # the map of the configured mode (a folder of the other mode may be left from an earlier run)
        map_dir = ctx.maps_root / map_dir_name(src, tgt, ctx.cfg.maps.mode)
        if not (map_dir / MANIFEST_FILE).exists():
            return f"no cluster map at {map_dir} (run the maps stage)"
        options = {"cluster_map": str(map_dir), "mode": t.mode}
        prov.update(map=map_dir.name, map_digest=_file_digest(map_dir / TENSORS_FILE), mode=t.mode)
    elif method != "full":
        # Other methods take options the pipeline does not know yet: they run with their defaults.
        prov["options"] = "defaults"
    return options, prov


def translate_job(
    model_path: str,
    options: dict[str, Any],
    direction: str,
    sources: list[str],
    ids: list[int],
    jobs: list[dict[str, Any]],
    settings: dict[str, Any],
) -> list[dict[str, Any]]:
    """Ray task body: translate one direction's eval sample with every method, in one process (so the speed
    ratios compare like with like), write ``<method>.parquet`` + ``<method>.json`` for each, atomically."""
    from fastvocab.artifacts_schema.atomic import write_text_atomic
    from fastvocab.tasks.dump import cached_actor
    from fastvocab.tasks.translate import make_projection, translate, write_translations

    adapter = cached_actor(model_path, **options).adapter
    src, _, tgt = direction.partition("-")
    kwargs = {k: settings[k] for k in ("beam", "batch_size", "max_len", "length_penalty", "max_input_tokens")}
    results = []
    warm = False
    for job in jobs:
        projection = make_projection(adapter, str(job["method"]), **job["options"])
        if not warm:  # first calls pay for allocations and lazy init: keep them out of the timing
            translate(adapter, projection, sources[:8], src, tgt, progress=False, **kwargs)
            warm = True
        res = translate(adapter, projection, sources, src, tgt, progress=False, **kwargs)
        out = Path(str(job["out"]))
        write_translations(
            out, res.hypotheses, sources=sources, ids=ids, direction=direction, method=job["method"]
        )
        record = {
            **job["provenance"],
            "signature": projection.signature(),
            "seconds": res.seconds,
            "target_tokens": res.target_tokens,
            "sentences": res.sentences,
            "tokens_per_s": res.tokens_per_second,
            "sentences_per_s": res.sentences_per_second,
        }
        write_text_atomic(out.with_suffix(".json"), json.dumps(record, indent=2, sort_keys=True) + "\n")
        results.append(record)
    return results


def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise ArtifactError(f"corrupt {path}: {exc}") from exc


PROVENANCE_KEYS = ("method", "map", "map_digest", "mode", "options", "model_fingerprint", "sources_digest")


def stage_translate(ctx: Context) -> list[StageRecord]:
    from fastvocab.pipeline.stages import remote_fn, wait_all, worker_options

    t = ctx.cfg.translate
    m = ctx.model()
    settings = t.model_dump(mode="json")
    records: dict[str, StageRecord] = {}
    work: dict[str, tuple[list[int], list[str], list[dict[str, Any]]]] = {}
    for direction in ctx.cfg.directions:
        ids, sources, _ = _eval_sample(ctx, direction)
        out_dir = ctx.work_dir / "translations" / direction
        params = {"model_fingerprint": m.fingerprint, "split": ctx.cfg.eval.split, "sentences": len(sources)}
        params.update({k: settings[k] for k in ("beam", "batch_size", "max_len", "mode", "device")})
        unavailable: list[str] = []
        current: list[dict[str, Any]] = []
        jobs: list[dict[str, Any]] = []
        for method in ctx.cfg.eval.methods:
            plan = _method_plan(ctx, direction, method)
            if isinstance(plan, str):
                log.warning("translate %s: skipping %s: %s", direction, method, plan)
                unavailable.append(f"{method}: {plan}")
                continue
            options, prov = plan
            prov.update(
                model_fingerprint=m.fingerprint,
                sources_digest=_text_digest(sources),
                **{k: settings[k] for k in ("beam", "batch_size", "max_len", "length_penalty")},
            )
            out = out_dir / f"{method}.parquet"
            job = {"method": method, "options": options, "provenance": prov, "out": str(out)}
            found = _read_json(out.with_suffix(".json"))
            if out.exists() and found is not None and all(found.get(k) == v for k, v in prov.items()):
                current.append(job)
                continue
            jobs.append(job)
        if jobs and any(j["method"] == "full" for j in current):
            # speed ratios compare methods timed in the same process: time full again with the others
            jobs += [j for j in current if j["method"] == "full"]
            current = [j for j in current if j["method"] != "full"]
        params["methods"] = ",".join(ctx.cfg.eval.methods)
        note = f"; unavailable: {'; '.join(unavailable)}" if unavailable else ""
        if not jobs:
            status = "skipped" if current else "unavailable"
            msg = (
                f"translations current for {', '.join(j['method'] for j in current)}"
                if current
                else "no method could run"
            )
            records[direction] = StageRecord("translate", direction, status, msg + note, params)
            continue
        # full first: the other methods' search errors and speed ratios are measured against it
        jobs.sort(key=lambda j: j["method"] != "full")
        work[direction] = (ids, sources, jobs)
        records[direction] = StageRecord("translate", direction, "ran", note, params)

    if work:
        options, _, _ = worker_options(ctx)
        gpus = 1 if t.device.startswith("cuda") else 0
        ctx.ray.ensure()
        ctx.ray.require_gpus(gpus, f"translate.device={t.device}")
        options = {**options, "device": t.device}
        task = remote_fn(ctx, translate_job, num_cpus=options["torch_threads"], num_gpus=gpus)
        model = str(m.path)
        refs = {
            d: task.remote(model, options, d, sources, ids, jobs, settings)
            for d, (ids, sources, jobs) in work.items()
        }
        for direction, results in wait_all(ctx, refs, "translate").items():
            rec = records[direction]
            for r in results:
                meth = r["method"]
                rec.metrics.update(
                    {
                        f"tokens_per_s_{meth}": r["tokens_per_s"],
                        f"sentences_per_s_{meth}": r["sentences_per_s"],
                        f"seconds_{meth}": r["seconds"],
                    }
                )
                rec.params[f"signature_{meth}"] = r["signature"]
            done = ", ".join(f"{r['method']} {r['tokens_per_s']:.0f} tok/s" for r in results)
            rec.message = f"{done}{rec.message}"
    return list(records.values())


# ----------------------------------------------------------------------------------------------- evaluate


def stage_evaluate(ctx: Context) -> list[StageRecord]:
    from fastvocab.artifacts_schema.atomic import write_text_atomic
    from fastvocab.tasks.evaluate import score, search_error_rate

    records = []
    for direction in ctx.cfg.directions:
        _, sources, refs = _eval_sample(ctx, direction)
        tdir = ctx.work_dir / "translations" / direction
        methods = [m for m in ctx.cfg.eval.methods if (tdir / f"{m}.parquet").exists()]
        params = {"split": ctx.cfg.eval.split, "sentences": len(refs), "methods": ",".join(methods)}
        if not methods:
            records.append(
                StageRecord("evaluate", direction, "unavailable", "no translations to score", params)
            )
            continue
        files = [tdir / f"{m}.{ext}" for m in methods for ext in ("parquet", "json")]
        digest = _file_digest(*files) + "|" + _text_digest(refs)
        out = ctx.work_dir / "eval" / f"{direction}.json"
        found = _read_json(out)
        if found is not None and found.get("inputs_digest") == digest:
            records.append(
                StageRecord(
                    "evaluate", direction, "skipped", f"scores current ({', '.join(methods)})", params
                )
            )
            continue
        hyps = {m: _read_hypotheses(tdir / f"{m}.parquet", sources) for m in methods}
        runs = {m: _read_json(tdir / f"{m}.json") or {} for m in methods}
        result: dict[str, Any] = {"direction": direction, "inputs_digest": digest, "methods": {}}
        metrics: dict[str, float] = {}
        for m in methods:
            s = score(hyps[m], refs, tgt_lang=direction.partition("-")[2])
            entry = {**s, "tokens_per_s": runs[m].get("tokens_per_s"), "signature": runs[m].get("signature")}
            metrics[f"bleu_{m}"], metrics[f"chrf_{m}"] = s["bleu"], s["chrf"]
            if "full" in hyps and m != "full":
                entry["search_error_rate"] = search_error_rate(hyps[m], hyps["full"])
                metrics[f"search_error_rate_{m}"] = entry["search_error_rate"]
                full_tps = runs["full"].get("tokens_per_s") or 0.0
                if full_tps > 0 and runs[m].get("tokens_per_s"):
                    entry["speed_ratio_vs_full"] = runs[m]["tokens_per_s"] / full_tps
                    metrics[f"speed_ratio_{m}"] = entry["speed_ratio_vs_full"]
            result["methods"][m] = entry
        write_text_atomic(out, json.dumps(result, indent=2, sort_keys=True) + "\n")
        parts = [f"{m} BLEU {metrics[f'bleu_{m}']:.1f}" for m in methods]
        parts += [f"{m} search errors {100 * v:.1f}%" for m, v in _by_method(metrics, "search_error_rate_")]
        records.append(
            StageRecord("evaluate", direction, "ran", ", ".join(parts), params, metrics, artifacts=[out])
        )
    return records


def _by_method(metrics: dict[str, float], prefix: str) -> list[tuple[str, float]]:
    return [(k[len(prefix) :], v) for k, v in metrics.items() if k.startswith(prefix)]


def _read_hypotheses(path: Path, sources: list[str]) -> list[str]:
    try:
        table = pq.read_table(path, columns=["source", "hypothesis"])
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt translations {path}: {exc}") from exc
    if table.column("source").to_pylist() != sources:
        raise ArtifactError(f"{path} does not translate the current eval sample (rerun translate)")
    return table.column("hypothesis").to_pylist()
