"""The methods stage: offline artifacts of the other output-layer methods (``methods.build``, default none).

One Ray task per artifact (``tasks.methods.method_index_job``: the task loads the model, builds, saves
atomically): a model-wide one for ``lsh`` and ``graph`` (``methods/<method>/all``), one per direction for
``shortlist`` (``methods/shortlist/<direction>``). An artifact that exists, validates (digest, model
fingerprint) and was built with the configured parameters is skipped; any other is rebuilt.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from fastvocab.artifacts_schema.method_index import MANIFEST_FILE
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.tracking import StageRecord
from fastvocab.tasks.methods import (
    METHODS_DIR,
    directions_for,
    index_current,
    index_dir,
    method_index_job,
    params_dict,
    unit_name,
)

log = logging.getLogger(__name__)


def run(ctx: StageContext) -> list[StageRecord]:
    cfg = ctx.cfg.methods
    if not cfg.build:
        return []
    m = ctx.model()
    records: dict[str, StageRecord] = {}
    calls: dict[str, tuple[tuple, dict[str, Any]]] = {}
    cpus: dict[str, int] = {}
    outs: dict[str, Path] = {}
    root = ctx.work_dir / METHODS_DIR
    for method in cfg.build:
        params = cfg.params(method)
        for direction in directions_for(method, ctx.cfg.directions):
            unit = f"{method}:{unit_name(method, direction)}"
            out = outs[unit] = index_dir(root, method, direction)
            rec_params: dict[str, object] = {
                "method": method,
                "direction": direction,
                "model_fingerprint": m.fingerprint,
                **params_dict(params),
            }
            idx = index_current(out, method, params, m.fingerprint, direction)
            if idx is not None:
                msg = f"index valid ({_size(idx.nbytes)}, built in {idx.manifest.build_seconds:.1f} s)"
                metrics = {"index_bytes": float(idx.nbytes), "build_seconds": idx.manifest.build_seconds}
                records[unit] = StageRecord("methods", unit, "skipped", msg, rec_params, metrics)
                continue
            calls[unit] = (
                (ctx.run_context(torch_threads=1), method, params, direction, str(out)),
                {"corpus_dir": str(ctx.corpus_dir)},
            )
            cpus[unit] = int(getattr(params, "threads", 1))
            records[unit] = StageRecord("methods", unit, "ran", "", rec_params)
    if calls:
        with ctx.bar(len(calls), "methods", unit="index") as bar:
            results = ctx.ray.run_tasks(method_index_job, calls, bar, num_cpus=max(cpus.values()))
        for unit, res in results.items():
            rec = records[unit]
            mf = res["manifest"]
            rec.message = (
                f"N={mf['n_vocab']}, d={mf['d']}: {_size(res['bytes'])} in {res['build_seconds']:.2f} s"
            )
            rec.metrics = {
                "index_bytes": float(res["bytes"]),
                "array_bytes": float(res["array_bytes"]),
                "build_seconds": res["build_seconds"],
                "task_seconds": res["seconds"],
            }
            rec.metrics.update({k: float(v) for k, v in mf["extra"].items() if _number(v)})
            rec.artifacts = [outs[unit] / MANIFEST_FILE]
    if cfg.publish is not None:
        _publish(outs, root, Path(cfg.publish))
    return list(records.values())


def _publish(outs: dict[str, Path], root: Path, publish: Path) -> None:
    """Write every artifact of this run to ``methods.publish`` in the compact shipped form, laid out as the
    methods root (e.g. the shortlist tables shipped beside a model); one unchanged there is left as it is."""
    from fastvocab.tasks.publish import publish_index

    for out in outs.values():
        target = publish / out.relative_to(root)
        if publish_index(out, target):
            log.info("methods: published %s", target)


def _number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _size(n: float) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"
