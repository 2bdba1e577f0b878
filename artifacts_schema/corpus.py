"""Parallel corpus layout: one Parquet file per language pair and split.

``<corpus_dir>/<lang1>-<lang2>/<split>.parquet`` with columns ``id, doc_id, text1, text2`` where
``text1`` is in ``lang1``. A direction ``lang2 -> lang1`` reads the same file with the columns swapped, so
en-it and it-en share one file and one split.

Monolingual source text (unlabelled input for the dump stage) is ``<corpus_dir>/mono/<lang>.parquet`` with
columns ``id, text`` (``id``: the line number in the user's file).

``<corpus_dir>/corpus.json`` records per pair and monolingual file how it was built (source, split settings,
counts, statistics); a file whose record matches the requested build and which validates is not rebuilt.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from fastvocab import __version__
from fastvocab.artifacts_schema.atomic import write_text_atomic
from fastvocab.artifacts_schema.errors import ArtifactError

log = logging.getLogger(__name__)

MANIFEST = "corpus.json"
MANIFEST_FORMAT = "fastvocab-corpus/1"

SPLITS = ("train", "dev", "test")

# The build sources of a catalog corpus's pairs (tasks/catalog_corpus.py): Debian packages' gettext catalogs
# fetched with apt, or the machine's own.
CATALOG_SOURCES = ("gettext-catalogs", "gettext-system")

CORPUS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("doc_id", pa.string(), nullable=False),  # groups segments of one document (split unit)
        pa.field("text1", pa.string(), nullable=False),
        pa.field("text2", pa.string(), nullable=False),
    ]
)

MONO_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
    ]
)


def pair_name(lang1: str, lang2: str) -> str:
    return f"{lang1}-{lang2}"


def split_path(corpus_dir: str | Path, lang1: str, lang2: str, split: str) -> Path:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return Path(corpus_dir) / pair_name(lang1, lang2) / f"{split}.parquet"


def available_pairs(corpus_dir: str | Path) -> list[tuple[str, str]]:
    """Language pairs present in a corpus folder, as (lang1, lang2), sorted."""
    pairs = []
    for sub in sorted(Path(corpus_dir).glob("*-*")):
        if sub.is_dir() and (sub / "train.parquet").exists():
            lang1, _, lang2 = sub.name.partition("-")
            pairs.append((lang1, lang2))
    return pairs


def direction_file(corpus_dir: str | Path, src_lang: str, tgt_lang: str, split: str) -> tuple[Path, bool]:
    """The pair file holding a direction's split, and whether its columns are swapped (source in text2)."""
    forward = split_path(corpus_dir, src_lang, tgt_lang, split)
    backward = split_path(corpus_dir, tgt_lang, src_lang, split)
    swap = not forward.exists() and backward.exists()
    path = backward if swap else forward
    if not path.exists():
        have = ", ".join(f"{a}-{b}" for a, b in available_pairs(corpus_dir)) or "none"
        raise ArtifactError(
            f"no {split} split for {src_lang}-{tgt_lang} in {corpus_dir} (language pairs present: {have})"
        )
    return path, swap


def read_direction(
    corpus_dir: str | Path, src_lang: str, tgt_lang: str, split: str, limit: int | None = None
) -> tuple[list[int], list[str], list[str]]:
    """Return (ids, sources, targets) of a direction's split, reading whichever pair file holds it."""
    path, swap = direction_file(corpus_dir, src_lang, tgt_lang, split)
    table = read_corpus_file(path, limit)
    ids = table.column("id").to_pylist()
    a, b = table.column("text1").to_pylist(), table.column("text2").to_pylist()
    return (ids, b, a) if swap else (ids, a, b)


def read_corpus_file(path: Path, limit: int | None = None) -> pa.Table:
    return _read_table(path, CORPUS_SCHEMA, "corpus file", limit)


def _read_table(path: Path, schema: pa.Schema, what: str, limit: int | None) -> pa.Table:
    """The schema's columns of a Parquet file (the first ``limit`` rows); ArtifactError when unusable."""
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowException) as exc:
        raise ArtifactError(f"corrupt {what} {path}: {exc}") from exc
    missing = [f.name for f in schema if f.name not in table.column_names]
    if missing:
        raise ArtifactError(f"{what} {path} lacks columns {missing}")
    table = table.select(schema.names)
    return table.slice(0, limit) if limit is not None else table


# A direction's dump input (built by tasks.dump_sources): every source line the dump reads, in order,
# de-duplicated, without a dev or test line; ``reference`` is the line's translation where a parallel source
# gave one (null elsewhere), ``origin`` the source it came from. The build record (inputs, their digests,
# counts) is JSON in the footer under SOURCES_KEY.
SOURCES_SCHEMA = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),  # the row number
        pa.field("text", pa.string(), nullable=False),
        pa.field("reference", pa.string()),
        pa.field("origin", pa.string(), nullable=False),
    ]
)
SOURCES_KEY = b"fastvocab.dump_sources"


def sources_path(root: str | Path, direction: str) -> Path:
    return Path(root) / f"{direction}.parquet"


def read_sources_record(path: str | Path) -> dict | None:
    """A dump-sources file's build record; None when it is missing, unreadable or of another schema."""
    try:
        pf = pq.ParquetFile(path)
        raw = (pf.metadata.metadata or {}).get(SOURCES_KEY)
        record = json.loads(raw) if raw is not None else None
    except (OSError, pa.ArrowException, ValueError):
        return None
    if not isinstance(record, dict) or record.get("rows") != pf.metadata.num_rows:
        return None
    if [(f.name, f.type) for f in pf.schema_arrow] != [(f.name, f.type) for f in SOURCES_SCHEMA]:
        return None
    return record


def mono_path(corpus_dir: str | Path, lang: str) -> Path:
    return Path(corpus_dir) / "mono" / f"{lang}.parquet"


def mono_file(corpus_dir: str | Path, lang: str) -> Path:
    """A language's monolingual source file; ArtifactError naming the languages present when it is missing."""
    path = mono_path(corpus_dir, lang)
    if not path.exists():
        have = ", ".join(sorted(p.stem for p in path.parent.glob("*.parquet"))) or "none"
        raise ArtifactError(f"no monolingual {lang} file in {corpus_dir} (languages present: {have})")
    return path


def read_mono(corpus_dir: str | Path, lang: str, limit: int | None = None) -> tuple[list[int], list[str]]:
    """Return (ids, texts) of a language's monolingual source file."""
    path = mono_file(corpus_dir, lang)
    table = _read_table(path, MONO_SCHEMA, "monolingual file", limit)
    return table.column("id").to_pylist(), table.column("text").to_pylist()


def valid_file(path: Path, schema: pa.Schema, rows: int) -> bool:
    """True when ``path`` is a readable Parquet file with exactly ``schema``'s columns and ``rows`` rows."""
    try:
        pf = pq.ParquetFile(path)
    except (OSError, pa.ArrowException):
        return False
    types_match = [(f.name, f.type) for f in pf.schema_arrow] == [(f.name, f.type) for f in schema]
    return types_match and pf.metadata.num_rows == rows


def read_manifest(out_dir: str | Path) -> dict:
    """``<out_dir>/corpus.json``, or an empty manifest when it is missing or unreadable."""
    path = Path(out_dir) / MANIFEST
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        data = {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s (%s): everything will be rebuilt", path, exc)
        data = {}
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        data = {}
    data.setdefault("pairs", {})
    data.setdefault("mono", {})
    return data


def update_manifest(out_dir: Path, section: str, key: str, record: dict) -> None:
    """Set ``corpus.json``'s ``[section][key]`` (``pairs``/``mono``) to ``record``, atomically."""
    manifest = read_manifest(out_dir)
    manifest[section][key] = record
    languages = {lang for name in manifest["pairs"] for lang in name.split("-")} | set(manifest["mono"])
    manifest.update(format=MANIFEST_FORMAT, languages=sorted(languages), fastvocab_version=__version__)
    manifest = {k: manifest[k] for k in ("format", "fastvocab_version", "languages", "pairs", "mono")}
    write_text_atomic(out_dir / MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False) + "\n")
