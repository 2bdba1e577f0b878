"""The catalog corpus: ``<pivot>-<xx>`` pairs from gettext message catalogs (``gettext_catalogs``), in the
layout of the description corpus (``<out_dir>/<pair>/{train,dev,test}.parquet``, ``corpus.json``).

The catalogs come from a list of Debian packages (fetched with apt into ``<out_dir>``, nothing installed) or
from the machine's own ``/usr/share/locale``. Each language reads every locale folder that counts as it
(``pt`` and ``pt_BR`` are ``pt``), packages in the order given, each package's catalogs by domain, then
locale. A pair already given by an earlier catalog is counted as a duplicate and kept once. Then:

- every pair sharing a text (either side) with the dev or test split of the same pair in a ``hold_out``
  corpus folder (the description corpus) is left out of all three splits, so none of those sentences is in
  the catalog corpus's train split, and its dev and test hold no sentence of theirs either;
- the split is the description corpus's (``tasks.corpus.write_pair``): by document, a document being one
  English message (its md5), with every pair of a later split that shares a text with test or dev dropped.

The manifest records each package's version, architecture and checksum (or the system catalogs' digest),
the held-out files' digests and the counts of every cleaning step; a pair whose record matches is not
rebuilt.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path

from fastvocab.artifacts_schema.corpus import CATALOG_SOURCES, direction_file, read_corpus_file
from fastvocab.artifacts_schema.digest import files_digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.tasks import gettext_catalogs as gettext
from fastvocab.tasks.corpus import PairResult, Row, RowSource, split_build, up_to_date_pair, write_pair
from fastvocab.tasks.debian_translations import CorpusError, check_lang
from fastvocab.tasks.gettext_catalogs import Catalog

__all__ = [
    "CATALOG_SOURCE",
    "PIVOT",
    "SYSTEM_LOCALE_DIR",
    "SYSTEM_SOURCE",
    "build_catalog_corpus",
    "catalog_rows",
    "check_pivot",
]

log = logging.getLogger(__name__)

# catalogs of Debian packages fetched with apt, the machine's own catalogs
CATALOG_SOURCE, SYSTEM_SOURCE = CATALOG_SOURCES
SYSTEM_LOCALE_DIR = Path("/usr/share/locale")
PIVOT = "en"  # the language of every catalog's messages (msgid)
# What catalog_rows counts, the cleaning's counts (gettext_catalogs.COUNTS) first: all in the manifest, 0 too.
ROW_COUNTS = (
    *gettext.COUNTS,
    "catalogs",
    "duplicates_in_catalog",
    "duplicates_across_catalogs",
    "held_out_descriptions",
)


def _held_out(folders: Sequence[Path], out_dir: Path, pivot: str, lang: str) -> tuple[set[str], list[dict]]:
    """The texts of the pair's dev and test splits in each hold-out folder, and what they were read from."""
    texts: set[str] = set()
    records = []
    for folder in folders:
        if folder.resolve() == out_dir.resolve():
            raise CorpusError(
                f"{folder} is the catalog corpus's own folder: name the description corpus as the one to "
                "hold out (--hold-out DIR, corpus.catalogs.hold_out)"
            )
        paths = []
        for split in ("dev", "test"):
            try:
                path, _ = direction_file(folder, pivot, lang, split)
                table = read_corpus_file(path)
            except ArtifactError as exc:
                raise CorpusError(
                    f"cannot hold out the {pivot}-{lang} dev and test sentences of {folder}: {exc} (build it "
                    f"with `fastvocab corpus -o {folder}`, or name other folders with --hold-out)"
                ) from exc
            for column in ("text1", "text2"):
                texts.update(table.column(column).to_pylist())
            paths.append(path)
        records.append({"dir": str(folder), "digest": files_digest(*paths)})
    return texts, records


def catalog_rows(
    catalogs: Sequence[Catalog], held_out: AbstractSet[str] = frozenset()
) -> tuple[list[Row], dict[str, int], dict[str, dict[str, int]]]:
    """The distinct pairs of the catalogs, in order, without those sharing a text with ``held_out``.

    Returns the rows, the counts of the cleaning and of the pairs left out, and per origin (package) how many
    messages it had and how many of its pairs were kept.
    """
    rows: list[Row] = []
    stats: Counter[str] = Counter(dict.fromkeys(ROW_COUNTS, 0))
    per_origin: dict[str, Counter[str]] = {}
    seen: dict[tuple[str, str], int] = {}  # pair -> index of the catalog that gave it first
    for index, catalog in enumerate(catalogs):
        counts: Counter[str] = Counter()
        kept = 0
        for doc, source, target in gettext.read_catalog(catalog.path, counts):
            first = seen.get((source, target))
            if first is not None:
                stats["duplicates_in_catalog" if first == index else "duplicates_across_catalogs"] += 1
                continue
            seen[(source, target)] = index
            if source in held_out or target in held_out:
                stats["held_out_descriptions"] += 1
                continue
            rows.append((len(rows), doc, source, target))
            kept += 1
        stats.update(counts)
        stats["catalogs"] += 1
        origin = per_origin.setdefault(catalog.origin, Counter())
        origin.update(messages=counts["messages"], pairs=kept)
    return rows, dict(sorted(stats.items())), {k: dict(v) for k, v in per_origin.items()}


def _rows_source(rows: list[Row]) -> RowSource:
    return lambda: rows


def _catalogs_by_package(
    out_dir: Path, lists_dir: Path, packages: Sequence[gettext.DebPackage], languages: Sequence[str]
) -> dict[str, list[Catalog]]:
    """Download and unpack the packages; each language's catalogs, package by package in order."""
    debs = gettext.download_packages(lists_dir, out_dir / "debs", list(packages))
    found: dict[str, list[Catalog]] = {lang: [] for lang in languages}
    for package, deb in zip(packages, debs, strict=True):
        unpacked = gettext.unpack_package(deb, out_dir / "unpacked")
        catalogs = gettext.find_catalogs(gettext.package_locale_dir(unpacked), package.name, languages)
        if not catalogs:
            log.warning("%s %s ships no catalog in %s", package.name, package.version, ", ".join(languages))
        for catalog in catalogs:
            found[gettext.locale_language(catalog.locale) or ""].append(catalog)
    return found


def check_pivot(pivot: str) -> str:
    """``pivot`` if it is English, the language of every catalog's messages; else a one-line error."""
    pivot = check_lang(pivot)
    if pivot != PIVOT:
        raise CorpusError(f"the catalogs' messages are in English: the pivot must be 'en', not {pivot!r}")
    return pivot


def build_catalog_corpus(
    out_dir: str | Path,
    languages: Sequence[str],
    packages: Sequence[str] = (),
    *,
    dev_size: int = 1000,
    test_size: int = 1000,
    seed: int = 0,
    lists_dir: str | Path | None = None,
    system_dir: str | Path | None = None,
    hold_out: Sequence[str | Path] = (),
    force: bool = False,
) -> list[PairResult]:
    """Build ``en-<xx>`` pairs from the catalogs of ``packages`` (or, with a ``system_dir`` such as
    :data:`SYSTEM_LOCALE_DIR`, of that folder instead), holding out the dev and test sentences of the corpus
    folders ``hold_out``. The pivot is English, the language of the catalogs' messages (:func:`check_pivot`).

    ``lists_dir`` (default ``<out_dir>/apt-lists``) is the private apt lists folder: ``apt-get update``
    fills it when it holds no Packages index; the ``.deb`` files go to ``<out_dir>/debs/`` and are unpacked
    into ``<out_dir>/unpacked/``.
    """
    out_dir = Path(out_dir)
    pivot, from_system = PIVOT, system_dir is not None
    others = [lang for lang in dict.fromkeys(check_lang(x) for x in languages) if lang != pivot]
    if not others:
        raise CorpusError(f"no languages besides the pivot {pivot!r} in {list(languages)}")
    regional = [lang for lang in others if "_" in lang]
    if regional:
        raise CorpusError(
            f"catalog languages are plain codes, not {', '.join(regional)}: "
            "pt reads the catalogs of pt and pt_BR alike"
        )
    names = [] if from_system else list(dict.fromkeys(gettext.check_package(p) for p in packages))
    if not from_system and not names:
        raise CorpusError("no packages to read catalogs from (corpus.catalogs.packages, --packages)")
    split = split_build(dev_size, test_size, seed)
    folders = [Path(p) for p in hold_out]
    held = {lang: _held_out(folders, out_dir, pivot, lang) for lang in others}

    lists = Path(lists_dir) if lists_dir is not None else out_dir / "apt-lists"
    resolved: list[gettext.DebPackage] = []
    system_catalogs: dict[str, list[Catalog]] = {}
    if system_dir is not None:
        system_dir = Path(system_dir)
        for lang in others:
            system_catalogs[lang] = gettext.find_catalogs(system_dir, "system", [lang])
            if not system_catalogs[lang]:
                raise CorpusError(f"no {lang} catalogs (<locale>/LC_MESSAGES/*.mo) in {system_dir}")
        origin: dict = {"source": SYSTEM_SOURCE}
    else:
        if not gettext.has_package_indexes(lists):
            gettext.fetch_package_indexes(lists)
        resolved = gettext.resolve_packages(lists, names)
        origin = {"source": CATALOG_SOURCE, "packages": [p.record() for p in resolved]}

    def build_of(lang: str) -> dict:
        extra = {}
        if from_system:
            paths = [c.path for c in system_catalogs[lang]]
            extra = {"catalogs": files_digest(*paths)}
        hold = [record["digest"] for record in held[lang][1]]  # the files, wherever they lie
        return {**origin, **extra, "cleaning": gettext.CLEANING, "hold_out": hold, **split}

    done: dict[str, PairResult | None] = {}
    if not force:
        done = {lang: up_to_date_pair(out_dir, pivot, lang, build_of(lang)) for lang in others}
    todo = [lang for lang in others if done.get(lang) is None]
    if todo:
        if from_system:
            catalogs = {lang: system_catalogs[lang] for lang in todo}
        else:
            catalogs = _catalogs_by_package(out_dir, lists, resolved, todo)
        for lang in todo:
            if not catalogs[lang]:
                raise CorpusError(f"none of the packages ships a {lang} catalog")
            log.info("%s-%s: reading %d catalogs", pivot, lang, len(catalogs[lang]))
            rows, stats, per_origin = catalog_rows(catalogs[lang], held[lang][0])
            if not rows:
                raise CorpusError(f"{pivot}-{lang}: the catalogs give no pair after cleaning")
            source: dict = {"kind": origin["source"], "hold_out": held[lang][1]}
            if from_system:
                source["dir"] = str(system_dir)
                source["catalogs"] = [c.name for c in catalogs[lang]]
            else:
                source["lists_dir"] = str(lists)
                source["release"] = gettext.package_releases(lists)
                source["packages"] = [
                    {
                        **p.record(),
                        "catalogs": [c.name for c in catalogs[lang] if c.origin == p.name],
                        **per_origin.get(p.name, {"messages": 0, "pairs": 0}),
                    }
                    for p in resolved
                ]
            done[lang] = write_pair(
                out_dir, pivot, lang, _rows_source(rows), build=build_of(lang), source=source, stats=stats
            )
    results = []
    for lang in others:
        result = done[lang]
        assert result is not None, lang  # up to date, or written just now
        results.append(result)
    return results
