"""The corpus stage: the directions' files must exist in the corpus layout (``artifacts_schema/corpus.py``);
when they do not, the Debian description corpus is built with ``fastvocab.tasks.corpus`` (pivot pairs only).
"""

from __future__ import annotations

import logging

import pyarrow.parquet as pq

from fastvocab.artifacts_schema.corpus import split_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.tracking import StageRecord

log = logging.getLogger(__name__)


def _pair_file(ctx: StageContext, direction: str, split: str):
    src, _, tgt = direction.partition("-")
    for a, b in ((src, tgt), (tgt, src)):
        path = split_path(ctx.corpus_dir, a, b, split)
        if path.exists():
            return path
    return None


def run(ctx: StageContext) -> list[StageRecord]:
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
