"""The corpus stage: parallel train/dev/test Parquet files per language pair, and monolingual source files.

Sources: Debian's package-description translations (fetched with apt; see ``debian_translations``), a user's
parallel TSV or Parquet file, or a user's monolingual text file (``corpus_import``). Every parallel source
goes through the same steps:

1. rows ``(id, doc_id, text1, text2)`` in a stable order, whitespace-normalised, empty segments left out;
2. de-duplication of identical ``(text1, text2)`` pairs (the first in that order is kept);
3. a split by document (``doc_id``): documents are ordered by a seeded SHA-256 of their id; test, then dev,
   take whole documents until they hold ``test_size`` / ``dev_size`` pairs; the rest is train. A pair of a
   later split that shares a text (either side) with an earlier held-out split is dropped (test before dev
   before train), so no sentence of test or dev is seen in training;
4. one Parquet file per split, written atomically, and a record in ``<out_dir>/corpus.json``.

A pair whose files exist, validate and were built from the same input with the same split settings is not
rebuilt (``force=True`` rebuilds it).
"""

from __future__ import annotations

import array
import datetime as dt
import hashlib
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab import switches
from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.corpus import (
    CORPUS_SCHEMA,
    MONO_SCHEMA,
    SPLITS,
    mono_path,
    pair_name,
    read_manifest,
    split_path,
    update_manifest,
    valid_file,
)
from fastvocab.kernels.id_sets import unique_ids
from fastvocab.tasks import debian_translations as debian
from fastvocab.tasks.debian_translations import CorpusError, check_lang

__all__ = [
    "CorpusError",
    "MonoResult",
    "PairResult",
    "build_debian_corpus",
    "deduplicate",
    "pair_descriptions",
    "split_rows",
    "write_debian_mono",
]

log = logging.getLogger(__name__)

DEBIAN_SOURCE = "debian-translations"

Row = tuple[int, str, str, str]  # (id, doc_id, text1, text2)


@dataclass
class PairResult:
    lang1: str
    lang2: str
    counts: dict[str, int]  # split -> pairs
    stats: dict[str, int] = field(default_factory=dict)
    skipped: bool = False  # up to date: nothing was rebuilt

    @property
    def name(self) -> str:
        return pair_name(self.lang1, self.lang2)


@dataclass
class MonoResult:
    lang: str
    count: int
    stats: dict[str, int] = field(default_factory=dict)
    skipped: bool = False


# ------------------------------------------------------------------------------------- pairing and splitting


def pair_descriptions(
    pivot: dict[str, debian.Description], other: dict[str, debian.Description]
) -> tuple[list[Row], dict[str, int]]:
    """Segment pairs of the descriptions present in both languages, ordered by (md5, segment index).

    A description whose paragraph count differs between the languages is left out whole: its paragraphs
    cannot be aligned by index. Ids number the pairs in that order (before de-duplication).
    """
    rows: list[Row] = []
    stats = {"descriptions": len(other), "no_pivot": 0, "paragraphs_mismatch": 0, "descriptions_paired": 0}
    for md5 in sorted(other):
        if md5 not in pivot:
            stats["no_pivot"] += 1
            continue
        a, b = pivot[md5].segments, other[md5].segments
        if len(a) != len(b):
            stats["paragraphs_mismatch"] += 1
            continue
        stats["descriptions_paired"] += 1
        for s, t in zip(a, b, strict=True):
            if s and t:
                rows.append((len(rows), md5, s, t))
    stats["segment_pairs"] = len(rows)
    return rows, stats


def deduplicate(rows: Iterable[Row]) -> list[Row]:
    """Keep the first row of every distinct ``(text1, text2)``."""
    seen: set[tuple[str, str]] = set()
    kept = []
    for row in rows:
        key = (row[2], row[3])
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return kept


def _doc_rank(seed: int, doc_id: str) -> int:
    """A document's place in the split order: the first 8 bytes of a seeded SHA-256 of its id (big-endian,
    so the number orders as the bytes do). SHA-256, not hash(): Python's str hash is salted per process."""
    return int.from_bytes(hashlib.sha256(f"{seed}\x00{doc_id}".encode()).digest()[:8], "big")


def line_key(text: str) -> int:
    """64-bit digest of a text: the de-duplication index holds 8 bytes a row, not the text.

    Two distinct texts share a key with probability ~n^2 / 2^65 (about 1e-5 at 20M rows); the later one is
    then dropped as a duplicate.
    """
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def first_occurrences(keys: np.ndarray, skip: np.ndarray | None = None) -> np.ndarray:
    """True at the first index of every distinct key, False where ``skip`` is True.

    Skipped rows take part in the search (no compacted copy of ``keys``: the index is the memory that grows
    with the file): give them one shared key, so they never hide a row that is kept.
    """
    _, first = np.unique(keys, return_index=True)  # first occurrence of each key
    keep = np.zeros(len(keys), dtype=bool)
    keep[first] = True
    if skip is not None:
        keep &= ~skip
    return keep


RowSource = Callable[[], Iterable[Row]]  # yields the same rows, in id order, every time it is called


@dataclass
class _SplitPlan:
    """What the split decided after the index pass: held-out rows in memory (bounded by their sizes), and
    the per-row index (9 bytes a row) that lets the train rows stream past."""

    keep: np.ndarray  # (n,) bool: first copy of its (text1, text2)
    doc: np.ndarray  # (n,) uint64: the row's document, as its rank
    held_out_doc: np.ndarray  # (n,) bool: row's document went to test or dev
    held_texts: set[str]
    rows: dict[str, list[Row]]  # "test", "dev"
    stats: dict[str, int]


def _in_memory(rows: Sequence[Row]) -> RowSource:
    return lambda: rows


def _plan_split(rows: RowSource, *, dev_size: int, test_size: int, seed: int) -> _SplitPlan:
    pair_keys, doc_keys = array.array("Q"), array.array("Q")  # 8 bytes a row (a list of ints takes 36)
    for row in rows():
        pair_keys.append(line_key(f"{row[2]}\x00{row[3]}"))
        doc_keys.append(_doc_rank(seed, row[1]))
    pair, doc = np.frombuffer(pair_keys, dtype=np.uint64), np.frombuffer(doc_keys, dtype=np.uint64)
    keep = first_occurrences(pair)
    order, sizes = np.unique(doc[keep], return_counts=True)  # documents in split order, their unique rows
    # Read the rows of the first documents (enough to fill test and dev unless overlaps drop rows; then
    # twice as many, and so on): only those are held in memory.
    wanted = test_size + dev_size
    m = int(np.searchsorted(np.cumsum(sizes), wanted)) + 1 if wanted else 0
    while True:
        m = min(m, len(order))
        plan = _fill_held_out(rows, keep, doc, order, m, dev_size=dev_size, test_size=test_size)
        if plan is not None or m == len(order):
            break
        m = 2 * m + 1
    assert plan is not None
    plan.stats = {"pairs": len(pair), "duplicates_removed": int(len(pair) - keep.sum()), **plan.stats}
    return plan


def _fill_held_out(
    rows: RowSource,
    keep: np.ndarray,
    doc: np.ndarray,
    order: np.ndarray,
    m: int,
    *,
    dev_size: int,
    test_size: int,
) -> _SplitPlan | None:
    """Fill test, then dev, from the first ``m`` documents; None when they do not suffice."""
    candidate = keep & np.isin(doc, order[:m])
    docs: dict[int, list[Row]] = {}
    for i, row in enumerate(rows()):
        if candidate[i]:
            docs.setdefault(int(doc[i]), []).append(row)
    held: set[str] = set()  # texts of the held-out splits filled so far
    out: dict[str, list[Row]] = {"test": [], "dev": []}
    dropped = 0
    taken = 0
    for split, size in (("test", test_size), ("dev", dev_size)):
        while len(out[split]) < size and taken < len(order):
            if taken == m:
                return None  # more documents needed than were read
            for row in docs[int(order[taken])]:
                if row[2] in held or row[3] in held:
                    dropped += split == "dev"
                else:
                    out[split].append(row)
            taken += 1
        held.update(t for row in out[split] for t in row[2:])
    held_out_doc = np.isin(doc, order[:taken])
    for part in out.values():
        part.sort()  # id order, as in the input
    return _SplitPlan(keep, doc, held_out_doc, held, out, {"dev_dropped_overlap": dropped})


def _train_rows(rows: RowSource, plan: _SplitPlan, in_train: np.ndarray | None = None) -> Iterator[Row]:
    """The train rows, streamed: unique, of no held-out document, sharing no text with test or dev.

    Counts the rows dropped for a shared text in ``plan.stats``; marks the rows yielded in ``in_train``.
    """
    plan.stats["train_dropped_overlap"] = 0
    for i, row in enumerate(rows()):
        if not plan.keep[i] or plan.held_out_doc[i]:
            continue
        if row[2] in plan.held_texts or row[3] in plan.held_texts:
            plan.stats["train_dropped_overlap"] += 1
            continue
        if in_train is not None:
            in_train[i] = True
        yield row


def split_rows(
    rows: Sequence[Row], *, dev_size: int, test_size: int, seed: int
) -> tuple[dict[str, list[Row]], dict[str, int]]:
    """Split rows by document into train/dev/test (see the module docstring), all in memory.

    Returns the rows of each split (in id order) and the number of pairs dropped from dev and train
    because one of their texts is held out in an earlier split. The corpus files are written by the same
    steps, streamed (:func:`write_pair`).
    """
    plan = _plan_split(_in_memory(rows), dev_size=dev_size, test_size=test_size, seed=seed)
    out = {**plan.rows, "train": list(_train_rows(_in_memory(rows), plan))}
    stats = {k: plan.stats[k] for k in ("dev_dropped_overlap", "train_dropped_overlap")}
    return out, stats


# -------------------------------------------------------------------------------------------- files, manifest


def up_to_date_pair(out_dir: Path, lang1: str, lang2: str, build: dict) -> PairResult | None:
    record = read_manifest(out_dir)["pairs"].get(pair_name(lang1, lang2))
    if not record or record.get("build") != build:
        return None
    counts = record.get("counts", {})
    for split in SPLITS:
        if not valid_file(split_path(out_dir, lang1, lang2, split), CORPUS_SCHEMA, counts.get(split, -1)):
            return None
    return PairResult(lang1, lang2, counts, record.get("stats", {}), skipped=True)


def now_utc() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def _write_rows(path: Path, rows: Iterable[Row], if_empty: Exception | None = None) -> int:
    """Stream rows into a split's Parquet file, atomically; returns how many were written.

    With ``if_empty``: no rows raise it, and the file is left as it was.
    """
    count = 0
    batch_rows = switches.CORPUS_BATCH_ROWS.get()
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, CORPUS_SCHEMA) as writer:
        batch: list[Row] = []
        for row in rows:
            batch.append(row)
            if len(batch) == batch_rows:
                writer.write_table(pa.table(list(map(list, zip(*batch, strict=True))), schema=CORPUS_SCHEMA))
                count += len(batch)
                batch = []
        columns = list(zip(*batch, strict=True)) or [()] * len(CORPUS_SCHEMA)
        writer.write_table(pa.table([list(col) for col in columns], schema=CORPUS_SCHEMA))
        count += len(batch)
        if not count and if_empty is not None:
            raise if_empty
    return count


def write_pair(
    out_dir: Path,
    lang1: str,
    lang2: str,
    rows: RowSource,
    *,
    build: dict,
    source: dict,
    stats: dict[str, int],
) -> PairResult:
    """De-duplicate, split (settings from ``build``) and write one pair's three files, then record it in
    corpus.json. ``rows`` is read three times (index, held-out documents, train), never held whole: memory
    is the held-out splits plus ~10 bytes a row."""
    dev_size, test_size = build["dev_size"], build["test_size"]
    plan = _plan_split(rows, dev_size=dev_size, test_size=test_size, seed=build["seed"])
    name = pair_name(lang1, lang2)
    in_train = np.zeros(len(plan.keep), dtype=bool)
    no_train = CorpusError(
        f"{name}: only {int(plan.keep.sum())} distinct pairs, none left for train after dev ({dev_size}) "
        f"and test ({test_size}); lower --dev-size/--test-size"
    )
    train = _train_rows(rows, plan, in_train)
    n_train = _write_rows(split_path(out_dir, lang1, lang2, "train"), train, if_empty=no_train)
    for split in ("dev", "test"):
        _write_rows(split_path(out_dir, lang1, lang2, split), plan.rows[split])
    counts = {"train": n_train, **{split: len(plan.rows[split]) for split in ("dev", "test")}}
    counts = {split: counts[split] for split in SPLITS}
    stats = {**stats, **plan.stats}
    for split in ("dev", "test"):
        stats[f"{split}_docs"] = len({row[1] for row in plan.rows[split]})
    stats["train_docs"] = len(unique_ids(plan.doc[in_train]))
    record = {"build": build, "source": source, "counts": counts, "stats": stats, "created": now_utc()}
    update_manifest(out_dir, "pairs", name, record)
    log.info("%s: %s", name, ", ".join(f"{s} {n}" for s, n in counts.items()))
    return PairResult(lang1, lang2, counts, stats)


def split_build(dev_size: int, test_size: int, seed: int) -> dict:
    if dev_size < 0 or test_size < 0:
        raise CorpusError(f"dev and test sizes must be >= 0 (got {dev_size}, {test_size})")
    return {"dev_size": dev_size, "test_size": test_size, "seed": seed}


# ----------------------------------------------------------------------------------------------- Debian


def build_debian_corpus(
    out_dir: str | Path,
    languages: Sequence[str],
    *,
    pivot: str = "en",
    dev_size: int = 1000,
    test_size: int = 1000,
    seed: int = 0,
    lists_dir: str | Path | None = None,
    force: bool = False,
) -> list[PairResult]:
    """Build ``<pivot>-<xx>`` pairs from Debian's description translations, fetching the indexes if needed.

    ``lists_dir`` (default ``<out_dir>/apt-lists``) is an apt lists folder; when it lacks the Translation
    index of a wanted language, ``apt-get update`` fetches all of them into it.
    """
    out_dir = Path(out_dir)
    pivot = check_lang(pivot)
    others = [lang for lang in dict.fromkeys(check_lang(x) for x in languages) if lang != pivot]
    if not others:
        raise CorpusError(f"no languages besides the pivot {pivot!r} in {list(languages)}")
    build = {
        "source": DEBIAN_SOURCE,
        "segmentation": debian.SEGMENTATION,
        **split_build(dev_size, test_size, seed),
    }
    done: dict[str, PairResult | None] = {}
    if not force:
        done = {lang: up_to_date_pair(out_dir, pivot, lang, build) for lang in others}
    todo = [lang for lang in others if done.get(lang) is None]
    if todo:
        lists_dir = Path(lists_dir) if lists_dir is not None else out_dir / "apt-lists"
        if any(not debian.find_indexes(lists_dir, lang) for lang in [pivot, *todo]):
            debian.fetch_indexes(lists_dir, [pivot, *others])
        indexes = {lang: debian.find_indexes(lists_dir, lang) for lang in [pivot, *todo]}
        for lang, paths in indexes.items():
            if not paths:
                raise CorpusError(
                    f"no Translation-{lang} index in {lists_dir} after apt-get update "
                    f"(do the configured apt sources translate descriptions into {lang!r}?)"
                )
        pivot_docs = debian.load_descriptions(indexes[pivot], pivot)
        for lang in todo:
            rows, stats = pair_descriptions(pivot_docs, debian.load_descriptions(indexes[lang], lang))
            used = indexes[pivot] + indexes[lang]
            source = {
                "kind": DEBIAN_SOURCE,
                "lists_dir": str(lists_dir),
                "indexes": [p.name for p in used],
                "release": debian.release_info(used),
            }
            done[lang] = write_pair(
                out_dir, pivot, lang, _in_memory(rows), build=build, source=source, stats=stats
            )
    pairs = []
    for lang in others:
        pair = done[lang]
        assert pair is not None, lang  # up to date, or written just now
        pairs.append(pair)
    return pairs


# Locales whose descriptions a language's monolingual text also reads: Debian's Brazilian Portuguese index
# holds 4-5 times the descriptions of Translation-pt, and the demo model's pt is either.
MONO_VARIANTS = {"pt": ("pt_BR",)}


def write_debian_mono(
    out_dir: str | Path, lists_dir: str | Path | None, lang: str, *, force: bool = False
) -> MonoResult:
    """Write every segment of the language's Debian descriptions (one per short description and paragraph,
    as the pairs are cut, distinct, in description order) to ``<out_dir>/mono/<lang>.parquet``.

    Segments whose description has a translation are in it too: the dump's sources drop lines they already
    hold and every dev or test line, so what it adds is the text no pair has (descriptions without a
    translation, and those whose paragraphs do not align). A language of ``MONO_VARIANTS`` reads its variants'
    descriptions after its own (fetched into ``lists_dir`` when missing). A monolingual file the user
    imported is replaced only with ``force``.
    """
    out_dir = Path(out_dir)
    lists_dir = Path(lists_dir) if lists_dir is not None else out_dir / "apt-lists"
    lang = check_lang(lang)
    paths = debian.find_indexes(lists_dir, lang)
    if not paths:
        raise CorpusError(f"no Translation-{lang} index in {lists_dir} (run fastvocab corpus first)")
    variants = MONO_VARIANTS.get(lang, ())
    if any(not debian.find_indexes(lists_dir, v) for v in variants):
        # apt-get update drops the indexes of languages it is not asked for: ask for those held too
        debian.fetch_indexes(lists_dir, sorted({*debian.indexed_languages(lists_dir), *variants}))
    by_locale = {lang: paths, **{v: debian.find_indexes(lists_dir, v) for v in variants}}
    paths = [p for found in by_locale.values() for p in found]
    build = {"source": DEBIAN_SOURCE, "segmentation": debian.SEGMENTATION, "indexes": [p.name for p in paths]}
    target = mono_path(out_dir, lang)
    record = read_manifest(out_dir)["mono"].get(lang)
    if not force and record and valid_file(target, MONO_SCHEMA, record.get("count", -1)):
        if record.get("build") == build:
            return MonoResult(lang, record["count"], record.get("stats", {}), skipped=True)
        if record.get("build", {}).get("source") != DEBIAN_SOURCE:
            raise CorpusError(
                f"{target} holds the monolingual file imported from {record.get('source', {}).get('path')}: "
                "pass --force to replace it with the Debian descriptions"
            )
    segments = []
    descriptions = 0
    for loc, found in by_locale.items():
        docs = debian.load_descriptions(found, loc)
        descriptions += len(docs)
        segments += [seg for md5 in sorted(docs) for seg in docs[md5].segments if seg]
    texts = list(dict.fromkeys(segments))  # the first copy of each, in order
    stats = {
        "descriptions": descriptions,
        "segments": len(segments),
        "duplicates_removed": len(segments) - len(texts),
    }
    with atomic_path(target) as tmp:
        pq.write_table(pa.table([list(range(len(texts))), texts], schema=MONO_SCHEMA), tmp)
    source = {"kind": DEBIAN_SOURCE, "lists_dir": str(lists_dir), "release": debian.release_info(paths)}
    update_manifest(
        out_dir,
        "mono",
        lang,
        {"build": build, "source": source, "count": len(texts), "stats": stats, "created": now_utc()},
    )
    log.info("mono %s: %d distinct segments of %d descriptions", lang, len(texts), descriptions)
    return MonoResult(lang, len(texts), stats)


# ---------------------------------------------------------------------------------------- the user's files
