"""The corpus stage: parallel train/dev/test Parquet files per language pair, and monolingual source files.

Sources: Debian's package-description translations (fetched with apt; see ``debian_translations``), a user's
parallel TSV or Parquet file, or a user's monolingual text file. Every parallel source goes through the same
steps:

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
from fastvocab.tasks import debian_translations as debian
from fastvocab.tasks.debian_translations import CorpusError, check_lang, normalise

__all__ = [
    "CorpusError",
    "MonoResult",
    "PairResult",
    "build_debian_corpus",
    "deduplicate",
    "import_mono",
    "import_parallel",
    "iter_parallel_parquet",
    "iter_parallel_tsv",
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
    steps, streamed (:func:`_write_pair`).
    """
    plan = _plan_split(_in_memory(rows), dev_size=dev_size, test_size=test_size, seed=seed)
    out = {**plan.rows, "train": list(_train_rows(_in_memory(rows), plan))}
    stats = {k: plan.stats[k] for k in ("dev_dropped_overlap", "train_dropped_overlap")}
    return out, stats


# -------------------------------------------------------------------------------------------- files, manifest


def _up_to_date_pair(out_dir: Path, lang1: str, lang2: str, build: dict) -> PairResult | None:
    record = read_manifest(out_dir)["pairs"].get(pair_name(lang1, lang2))
    if not record or record.get("build") != build:
        return None
    counts = record.get("counts", {})
    for split in SPLITS:
        if not valid_file(split_path(out_dir, lang1, lang2, split), CORPUS_SCHEMA, counts.get(split, -1)):
            return None
    return PairResult(lang1, lang2, counts, record.get("stats", {}), skipped=True)


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


# Rows per Parquet batch when a file is streamed out: memory holds one batch of text at a time.
BATCH_ROWS = 100_000


def _write_rows(path: Path, rows: Iterable[Row], if_empty: Exception | None = None) -> int:
    """Stream rows into a split's Parquet file, atomically; returns how many were written.

    With ``if_empty``: no rows raise it, and the file is left as it was.
    """
    count = 0
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, CORPUS_SCHEMA) as writer:
        batch: list[Row] = []
        for row in rows:
            batch.append(row)
            if len(batch) == BATCH_ROWS:
                writer.write_table(pa.table(list(map(list, zip(*batch, strict=True))), schema=CORPUS_SCHEMA))
                count += len(batch)
                batch = []
        columns = list(zip(*batch, strict=True)) or [()] * len(CORPUS_SCHEMA)
        writer.write_table(pa.table([list(col) for col in columns], schema=CORPUS_SCHEMA))
        count += len(batch)
        if not count and if_empty is not None:
            raise if_empty
    return count


def _write_pair(
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
    stats["train_docs"] = len(np.unique(plan.doc[in_train]))
    record = {"build": build, "source": source, "counts": counts, "stats": stats, "created": _now()}
    update_manifest(out_dir, "pairs", name, record)
    log.info("%s: %s", name, ", ".join(f"{s} {n}" for s, n in counts.items()))
    return PairResult(lang1, lang2, counts, stats)


def _split_build(dev_size: int, test_size: int, seed: int) -> dict:
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
        **_split_build(dev_size, test_size, seed),
    }
    done: dict[str, PairResult | None] = {}
    if not force:
        done = {lang: _up_to_date_pair(out_dir, pivot, lang, build) for lang in others}
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
            done[lang] = _write_pair(
                out_dir, pivot, lang, _in_memory(rows), build=build, source=source, stats=stats
            )
    pairs = []
    for lang in others:
        pair = done[lang]
        assert pair is not None, lang  # up to date, or written just now
        pairs.append(pair)
    return pairs


def write_debian_mono(
    out_dir: str | Path, lists_dir: str | Path | None, lang: str, *, force: bool = False
) -> MonoResult:
    """Write every segment of the language's Debian descriptions (one per short description and paragraph,
    as the pairs are cut, distinct, in description order) to ``<out_dir>/mono/<lang>.parquet``.

    Segments whose description has a translation are in it too: the dump's sources drop lines they already
    hold and every dev or test line, so what it adds is the text no pair has (descriptions without a
    translation, and those whose paragraphs do not align). A monolingual file the user imported is replaced
    only with ``force``.
    """
    out_dir = Path(out_dir)
    lists_dir = Path(lists_dir) if lists_dir is not None else out_dir / "apt-lists"
    lang = check_lang(lang)
    paths = debian.find_indexes(lists_dir, lang)
    if not paths:
        raise CorpusError(f"no Translation-{lang} index in {lists_dir} (run fastvocab corpus first)")
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
    docs = debian.load_descriptions(paths, lang)
    segments = [seg for md5 in sorted(docs) for seg in docs[md5].segments if seg]
    texts = list(dict.fromkeys(segments))  # the first copy of each, in order
    stats = {
        "descriptions": len(docs),
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
        {"build": build, "source": source, "count": len(texts), "stats": stats, "created": _now()},
    )
    log.info("mono %s: %d distinct segments of %d descriptions", lang, len(texts), len(docs))
    return MonoResult(lang, len(texts), stats)


# ---------------------------------------------------------------------------------------- the user's files


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _decoded_lines(path: Path) -> Iterable[tuple[int, str]]:
    """``(line number, text without its line end)``; invalid UTF-8 is an error naming the line."""
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    with path.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                text = raw.rstrip(b"\r\n").decode("utf-8")
            except UnicodeDecodeError as exc:
                raise CorpusError(f"{path}:{n}: invalid UTF-8 at byte {exc.start + 1} of the line") from exc
            yield n, text.removeprefix("\ufeff") if n == 1 else text


def iter_parallel_tsv(path: str | Path) -> Iterator[Row]:
    """Rows of a two-column TSV file, streamed: ``id`` and ``doc_id`` are the line number (no grouping).

    Every line must hold exactly one tab and two non-empty columns; the first bad line is an error.
    """
    path = Path(path)
    empty = True
    for n, text in _decoded_lines(path):
        tabs = text.count("\t")
        if tabs != 1:
            raise CorpusError(f"{path}:{n}: expected two tab-separated columns (one tab), found {tabs} tabs")
        src, tgt = (normalise(col) for col in text.split("\t"))
        if not src or not tgt:
            raise CorpusError(f"{path}:{n}: empty {'first' if not src else 'second'} column")
        empty = False
        yield (n, str(n), src, tgt)
    if empty:
        raise CorpusError(f"{path}: empty file")


def iter_parallel_parquet(
    path: str | Path, src_col: str, tgt_col: str, doc_col: str | None = None
) -> Iterator[Row]:
    """Rows of a Parquet file's two text columns, streamed batch by batch: ``id`` is the row index,
    ``doc_id`` the ``doc_col`` value (documents are kept whole in one split) or the row index."""
    path = Path(path)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise CorpusError(f"{path}: not a readable Parquet file ({exc})") from exc
    schema = pf.schema_arrow
    columns = [src_col, tgt_col] + ([doc_col] if doc_col else [])
    for col in columns:
        if col not in schema.names:
            raise CorpusError(f"{path}: no column {col!r} (columns: {', '.join(schema.names)})")
    for col in (src_col, tgt_col):
        if not (
            pa.types.is_string(schema.field(col).type) or pa.types.is_large_string(schema.field(col).type)
        ):
            raise CorpusError(f"{path}: column {col!r} is {schema.field(col).type}, not text")
    i = -1
    for batch in pf.iter_batches(columns=columns):
        data = batch.to_pydict()
        docs = data[doc_col] if doc_col else [None] * batch.num_rows
        for s, t, d in zip(data[src_col], data[tgt_col], docs, strict=True):
            i += 1
            s, t = normalise(s or ""), normalise(t or "")
            if not s or not t:
                raise CorpusError(f"{path}: row {i}: empty or null {src_col if not s else tgt_col!r}")
            if doc_col and d is None:
                raise CorpusError(f"{path}: row {i}: null {doc_col!r}")
            yield (i, str(d) if doc_col else str(i), s, t)
    if i < 0:
        raise CorpusError(f"{path}: no rows")


def import_parallel(
    out_dir: str | Path,
    path: str | Path,
    src_lang: str,
    tgt_lang: str,
    *,
    fmt: str,
    src_col: str | None = None,
    tgt_col: str | None = None,
    doc_col: str | None = None,
    pivot: str = "en",
    dev_size: int = 1000,
    test_size: int = 1000,
    seed: int = 0,
    force: bool = False,
) -> PairResult:
    """Import a user's parallel file (``fmt`` "tsv" or "parquet") as one pair, split like the Debian pairs.

    The pair is stored pivot first (``--src-lang it --tgt-lang en`` lands in ``en-it`` with the columns
    swapped); readers swap back for the it -> en direction.
    """
    out_dir, path = Path(out_dir), Path(path)
    src_lang, tgt_lang = check_lang(src_lang), check_lang(tgt_lang)
    if src_lang == tgt_lang:
        raise CorpusError(f"source and target language are both {src_lang!r}")
    if fmt == "parquet" and not (src_col and tgt_col):
        raise CorpusError("a Parquet import needs --src-col and --tgt-col")
    if fmt not in ("tsv", "parquet"):
        raise ValueError(f"unknown parallel format {fmt!r}; valid: parquet, tsv")
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    swap = tgt_lang == pivot
    lang1, lang2 = (tgt_lang, src_lang) if swap else (src_lang, tgt_lang)
    columns = {"src_col": src_col, "tgt_col": tgt_col, "doc_col": doc_col} if fmt == "parquet" else {}
    build = {"source": fmt, "sha256": _sha256(path), "swapped": swap, **columns}
    build.update(_split_build(dev_size, test_size, seed))
    if not force and (result := _up_to_date_pair(out_dir, lang1, lang2, build)):
        return result

    def rows() -> Iterator[Row]:
        if fmt == "tsv":
            read = iter_parallel_tsv(path)
        else:
            read = iter_parallel_parquet(path, src_col or "", tgt_col or "", doc_col)
        return ((i, d, t, s) for i, d, s, t in read) if swap else read

    source = {"kind": fmt, "path": str(path.resolve()), "src_lang": src_lang, "tgt_lang": tgt_lang, **columns}
    return _write_pair(out_dir, lang1, lang2, rows, build=build, source=source, stats={})


def _mono_first_lines(path: Path, stats: dict[str, int]) -> np.ndarray:
    """Pass 1 of the monolingual import: a bool per line, True for the first copy of each non-empty line."""
    buf = array.array("Q")  # 8 bytes a line, over-allocating little as it grows
    for _, raw in _decoded_lines(path):
        text = normalise(raw)
        buf.append(line_key(text) if text else 0)
    keys = np.frombuffer(buf, dtype=np.uint64)
    blank = keys == 0  # an empty line; a text whose key is 0 (p = 2^-64) would be taken for one
    keep = first_occurrences(keys, skip=blank)
    stats.update(lines=len(keys), empty=int(blank.sum()), duplicates_removed=int((~blank).sum() - keep.sum()))
    return keep


def import_mono(out_dir: str | Path, path: str | Path, lang: str, *, force: bool = False) -> MonoResult:
    """Import a monolingual text file (one sentence a line) into ``<out_dir>/mono/<lang>.parquet``.

    Lines are whitespace-normalised; empty lines and repeated sentences are left out; ``id`` is the line
    number. Two streaming passes over the file (find first occurrences, then write), so memory holds one
    batch of lines plus 9 bytes a line, whatever the file's size.
    """
    out_dir, path = Path(out_dir), Path(path)
    lang = check_lang(lang)
    if not path.is_file():
        raise CorpusError(f"{path}: no such file")
    build = {"source": "text", "sha256": _sha256(path)}
    target = mono_path(out_dir, lang)
    record = read_manifest(out_dir)["mono"].get(lang)
    if (
        not force
        and record
        and record.get("build") == build
        and valid_file(target, MONO_SCHEMA, record.get("count", -1))
    ):
        return MonoResult(lang, record["count"], record.get("stats", {}), skipped=True)
    stats: dict[str, int] = {}
    keep = _mono_first_lines(path, stats)
    count = int(keep.sum())
    if not count:
        raise CorpusError(f"{path}: no non-empty lines")
    with atomic_path(target) as tmp, pq.ParquetWriter(tmp, MONO_SCHEMA) as writer:
        ids: list[int] = []
        texts: list[str] = []
        for n, raw in _decoded_lines(path):
            if keep[n - 1]:
                ids.append(n)
                texts.append(normalise(raw))
                if len(ids) == BATCH_ROWS:
                    writer.write_table(pa.table([ids, texts], schema=MONO_SCHEMA))
                    ids, texts = [], []
        if ids:
            writer.write_table(pa.table([ids, texts], schema=MONO_SCHEMA))
    source = {"kind": "text", "path": str(path.resolve())}
    update_manifest(
        out_dir,
        "mono",
        lang,
        {"build": build, "source": source, "count": count, "stats": stats, "created": _now()},
    )
    return MonoResult(lang, count, stats)
