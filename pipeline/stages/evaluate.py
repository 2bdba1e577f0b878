"""The evaluate stage: BLEU/chrF (sacrebleu signatures), search error rate and speed ratio of every method
against full softmax, per direction, from the translate stage's outputs."""

from __future__ import annotations

from typing import Any

from fastvocab.artifacts_schema.digest import files_digest, text_digest
from fastvocab.artifacts_schema.jsonfile import read_json, write_json
from fastvocab.artifacts_schema.translations import read_hypotheses, sidecar_path
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.stages.translate import eval_sample
from fastvocab.pipeline.tracking import StageRecord
from fastvocab.tasks.evaluate import score, search_error_rate


def run(ctx: StageContext) -> list[StageRecord]:
    records = []
    for direction in ctx.cfg.directions:
        _, sources, refs = eval_sample(ctx, direction)
        tdir = ctx.translations_root / direction
        methods = [m for m in ctx.cfg.eval.labels() if (tdir / f"{m}.parquet").exists()]
        params = {"split": ctx.cfg.eval.split, "sentences": len(refs), "methods": ",".join(methods)}
        if not methods:
            records.append(
                StageRecord("evaluate", direction, "unavailable", "no translations to score", params)
            )
            continue
        outputs = [tdir / f"{m}.parquet" for m in methods]
        files = [f for out in outputs for f in (out, sidecar_path(out))]
        digest = files_digest(*files) + "|" + text_digest(refs)
        out = ctx.eval_root / f"{direction}.json"
        found = read_json(out)
        if found is not None and found.get("inputs_digest") == digest:
            msg = f"scores current ({', '.join(methods)})"
            records.append(StageRecord("evaluate", direction, "skipped", msg, params))
            continue
        hyps = {m: read_hypotheses(tdir / f"{m}.parquet", sources) for m in methods}
        runs = {m: read_json(sidecar_path(tdir / f"{m}.parquet")) or {} for m in methods}
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
        write_json(out, result)
        parts = [f"{m} BLEU {metrics[f'bleu_{m}']:.1f}" for m in methods]
        parts += [f"{m} search errors {100 * v:.1f}%" for m, v in _by_method(metrics, "search_error_rate_")]
        records.append(
            StageRecord("evaluate", direction, "ran", ", ".join(parts), params, metrics, artifacts=[out])
        )
    return records


def _by_method(metrics: dict[str, float], prefix: str) -> list[tuple[str, float]]:
    return [(k[len(prefix) :], v) for k, v in metrics.items() if k.startswith(prefix)]
