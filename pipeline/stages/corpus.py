"""The corpus stage: the directions' files must exist in the corpus layout (``artifacts_schema/corpus.py``);
when they do not, the Debian description corpus is built with ``fastvocab.tasks.corpus`` (pivot pairs only),
except into a catalog corpus's folder (``fastvocab corpus --catalogs`` builds that one). With a dump source
``catalogs``, the catalog corpus (``corpus.catalogs``) is built too where it lacks a direction's pair.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow.parquet as pq

from fastvocab.artifacts_schema.corpus import CATALOG_SOURCES, read_manifest, split_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.config import CorpusConfig
from fastvocab.pipeline.context import StageContext
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.tracking import StageRecord

log = logging.getLogger(__name__)


def _pair_file(folder: str | Path, direction: str, split: str) -> Path | None:
    src, _, tgt = direction.partition("-")
    for a, b in ((src, tgt), (tgt, src)):
        path = split_path(folder, a, b, split)
        if path.exists():
            return path
    return None


def run(ctx: StageContext) -> list[StageRecord]:
    """Every direction's pair files (train, dev and test: the dump reads train, holds dev and test out and
    the evaluation reads them), built from the Debian corpus when missing; and, with ``corpus.mono`` and a
    dump source ``mono``, each source language's Debian monolingual file."""
    cfg = ctx.cfg
    split = "train"
    missing = [d for d in cfg.directions if _pair_file(ctx.corpus_dir, d, split) is None]
    built: set[str] = set()
    if missing:
        pivot = cfg.corpus.pivot
        built_from = {
            str(r.get("build", {}).get("source")) for r in read_manifest(ctx.corpus_dir)["pairs"].values()
        }
        if built_from & set(CATALOG_SOURCES):
            wanted = ",".join(sorted({x for d in missing for x in d.split("-")}))
            raise UserError(
                f"no {split} corpus for {', '.join(missing)} in {ctx.corpus_dir}, a catalog corpus: build it "
                f"with `fastvocab corpus --catalogs -o {ctx.corpus_dir} --languages {wanted}`"
            )
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
    mono = _mono_files(ctx)
    catalogs = _catalog_pairs(ctx)
    records = []
    for direction in cfg.directions:
        path = _pair_file(ctx.corpus_dir, direction, split)
        if path is None:
            raise ArtifactError(
                f"the corpus stage produced no {split} split for {direction} in {ctx.corpus_dir}"
            )
        rows = pq.ParquetFile(path).metadata.num_rows
        status = "ran" if direction in built or direction in mono or direction in catalogs else "skipped"
        msg = f"{rows} {split} pairs in {path}" + mono.get(direction, "") + catalogs.get(direction, "")
        records.append(
            StageRecord(
                "corpus",
                direction,
                status,
                msg,
                params={"corpus_dir": str(ctx.corpus_dir), "split": split},
                metrics={f"{split}_pairs": rows},
            )
        )
    return records


def _mono_files(ctx: StageContext) -> dict[str, str]:
    """Write the Debian monolingual file of each source language a dump source ``mono`` reads, when
    ``corpus.mono`` asks for it and it is missing; returns what was written, by direction, for the record."""
    cfg = ctx.cfg
    if "mono" not in cfg.dump.sources or not cfg.corpus.mono:
        return {}
    from fastvocab.tasks.corpus import CorpusError, write_debian_mono

    written: dict[str, str] = {}
    for direction in cfg.directions:
        src = direction.partition("-")[0]
        try:
            result = write_debian_mono(ctx.corpus_dir, cfg.corpus.lists_dir, src)
        except CorpusError as exc:
            raise UserError(f"corpus.mono: {exc}") from exc
        if not result.skipped:
            written[direction] = f"; mono {src}: {result.count} sentences written"
    return written


def _catalog_pairs(ctx: StageContext) -> dict[str, str]:
    """With a dump source ``catalogs``: the catalog corpus, built where it lacks a direction's pair; returns
    what was written, by direction, for the record."""
    cfg = ctx.cfg
    if "catalogs" not in cfg.dump.sources:
        return {}
    folder = cfg.corpus.catalogs.out_dir
    missing = [d for d in cfg.directions if _pair_file(folder, d, "train") is None]
    if not missing:
        return {}
    langs = sorted({x for d in missing for x in d.split("-")} | {cfg.corpus.pivot})
    log.info("building the catalog corpus for %s in %s", ", ".join(langs), folder)
    corpus = cfg.corpus.model_copy(update={"languages": langs})
    try:
        results = build_catalogs(corpus, force=False)
    except ArtifactError as exc:
        raise UserError(f"dump source 'catalogs': {exc}") from exc
    train = {r.name: r.counts["train"] for r in results}
    written = {}
    for direction in missing:
        path = _pair_file(folder, direction, "train")
        pair = path.parent.name if path is not None else direction
        written[direction] = f"; catalogs {pair}: {train.get(pair, 0)} train pairs written"
    return written


def build_catalogs(cfg: CorpusConfig, force: bool) -> list:
    """``fastvocab corpus --catalogs``: the catalog corpus of ``cfg.catalogs`` (tasks/catalog_corpus.py)."""
    try:
        from fastvocab.tasks import catalog_corpus
    except ImportError as exc:  # polib: a dependency, but a hand-made environment may lack it
        raise UserError(f"--catalogs needs polib ({exc}): pip install polib") from exc
    cat = cfg.catalogs
    catalog_corpus.check_pivot(cfg.pivot)
    return catalog_corpus.build_catalog_corpus(
        cat.out_dir,
        cfg.languages,
        cat.packages,
        dev_size=cfg.dev_size,
        test_size=cfg.test_size,
        seed=cfg.seed,
        lists_dir=cat.lists_dir,
        system_dir=cat.system_dir if cat.from_system else None,
        hold_out=cat.hold_out_dirs(cfg.out_dir),
        force=force,
    )
