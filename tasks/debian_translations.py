"""Debian's package-description translations: fetch the apt ``Translation-<lang>`` indexes, parse them.

The indexes are fetched with apt itself, from the machine's configured sources, into a private lists folder
(no host is named here). Each index is a sequence of deb822 stanzas::

    Package: 0ad-data
    Description-md5: 26581e685027d5ae84824362a4ba59ee
    Description-it: gioco di strategia in tempo reale di guerra antica (file dei dati)
     0 A.D. (pronunciato "zero a d") è un gioco di strategia in tempo reale
     ...
     .
     Questo pacchetto contiene i file dei dati principali necessari a 0 A.D.

``Description-md5`` is the md5 of the *English* description, so it keys the same description in every
language. A description is split into segments: segment 0 is the short description (the field's first line),
segment i >= 1 is the i-th paragraph of the long description (paragraphs are separated by a " ." line).
Continuation lines of a paragraph are joined and whitespace-normalised into one line. A paragraph holding a
line Debian renders verbatim (indented by more than the one space: "  * item", code) or a list item ("* item",
"- item") becomes an empty segment: it keeps its index, so the paragraphs after it still align with the
translation, and its pair is left out (lists joined into one line make long, poor sentences: up to 7,000
words for a list of font names).
"""

from __future__ import annotations

import bz2
import gzip
import itertools
import logging
import lzma
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

log = logging.getLogger(__name__)

# <host>_<path>_dists_<suite>_<component>_i18n_Translation-<lang>[.<compression>], as apt names list files.
_INDEX_RE = re.compile(
    r"^(?P<release>.+_dists_[^_]+)_(?P<component>[^_]+)_i18n_Translation-(?P<lang>[A-Za-z_]+(?:%5[fF][A-Za-z]+)?)"
    r"(?:\.(?P<ext>lz4|gz|xz|bz2|zst|lzma))?$"
)
# Compressions Python reads itself; the others go through apt-helper (which also reads these).
_PY_OPENERS: dict[str, Callable[..., Any]] = {"gz": gzip.open, "xz": lzma.open, "bz2": bz2.open}
_APT_HELPER = "/usr/lib/apt/apt-helper"
_RELEASE_FIELDS = ("Origin", "Label", "Suite", "Version", "Codename", "Date")
# Recorded with every Debian pair: a corpus built by another segmentation is rebuilt, not reused.
SEGMENTATION = "short+paragraphs, verbatim paragraphs dropped"
# A continuation line (its leading space removed) that Debian shows verbatim, or a list item.
_VERBATIM_RE = re.compile(r"^(?:[ \t]|[*+•-](?:\s|$))")
LANG_RE = re.compile(r"^[a-z]{2,3}(?:_[A-Z]{2})?$")


class CorpusError(ValueError):
    """Bad corpus input (an index, a user's file, an apt failure); the message is one line naming it."""


@dataclass(frozen=True)
class Description:
    package: str
    segments: tuple[str, ...]  # (short description, paragraph 1, ...), whitespace-normalised; "" if empty


def normalise(text: str) -> str:
    """Collapse every run of (Unicode) whitespace into one space; strip both ends."""
    return " ".join(text.split())


def check_lang(lang: str) -> str:
    if not LANG_RE.match(lang):
        raise CorpusError(f"invalid language code {lang!r} (expected e.g. 'it' or 'pt_BR')")
    return lang


# ---------------------------------------------------------------------------------------------- fetching


def indexed_languages(lists_dir: str | Path) -> list[str]:
    """The languages an apt lists folder holds ``Translation-<lang>`` indexes of, sorted."""
    lists_dir = Path(lists_dir)
    if not lists_dir.is_dir():
        return []
    return sorted(
        {_index_lang(m) for p in lists_dir.iterdir() if (m := _INDEX_RE.match(p.name)) and p.is_file()}
    )


def _index_lang(match: re.Match) -> str:
    # apt escapes the underscore of a regional locale in the file name: Translation-pt%5fBR
    return unquote(match["lang"])


def find_indexes(lists_dir: str | Path, lang: str) -> list[Path]:
    """The ``Translation-<lang>`` index files in an apt lists folder (every suite and component), sorted."""
    lists_dir = Path(lists_dir)
    if not lists_dir.is_dir():
        return []
    found = []
    for path in sorted(lists_dir.iterdir()):
        m = _INDEX_RE.match(path.name)
        if m and _index_lang(m) == lang and path.is_file():
            found.append(path)
    return found


def find_apt_get(hint: str) -> str:
    """The ``apt-get`` on PATH; a CorpusError ending with ``hint`` (what to do without apt) when none is."""
    apt_get = shutil.which("apt-get")
    if apt_get is None:
        raise CorpusError(f"apt-get not found: {hint}")
    return apt_get


def private_lists_options(lists_dir: Path) -> list[str]:
    """apt options that read and write the lists of ``lists_dir`` (created, with its ``partial/``) instead of
    the system's, and leave the system's package caches alone."""
    (lists_dir / "partial").mkdir(parents=True, exist_ok=True)
    return [
        "-o", f"Dir::State::Lists={lists_dir}",
        # do not rebuild the system's package cache from our private lists
        "-o", "Dir::Cache::pkgcache=",
        "-o", "Dir::Cache::srcpkgcache=",
    ]  # fmt: skip


def run_apt(cmd: list[str], what: str, cwd: Path | None = None) -> str:
    """Run an apt command; its standard output, or a one-line CorpusError naming ``what`` with apt's first
    error line (``E: ...``) when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    if proc.returncode != 0:
        lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("E:")] or lines or ["no output"]
        raise CorpusError(f"{what} failed (exit {proc.returncode}): {errors[0]}")
    return proc.stdout


def apt_update(lists_dir: str | Path, languages: Iterable[str], hint: str) -> None:
    """``apt-get update`` into a private lists folder: the Packages indexes of the machine's configured
    sources, and the Translation indexes of ``languages`` (none: Packages only).

    The system's own lists and caches are left alone; ``hint`` says what to do where apt is missing.
    """
    languages = list(languages)
    lists_dir = Path(lists_dir).resolve()
    cmd = [
        find_apt_get(hint),
        "-q",
        "-o", f"Acquire::Languages={','.join(languages) or 'none'}",
        *private_lists_options(lists_dir),
        # fail on any index that cannot be fetched instead of warning and going on
        "-o", "APT::Update::Error-Mode=any",
        "update",
    ]  # fmt: skip
    run_apt(cmd, f"apt-get update into {lists_dir}")


def fetch_indexes(lists_dir: str | Path, languages: Iterable[str]) -> None:
    """Fetch the Translation indexes of ``languages`` with ``apt-get update`` into a private lists folder.

    Uses the machine's configured apt sources; the system's own lists and caches are left alone.
    """
    languages = [check_lang(lang) for lang in languages]
    log.info(
        "fetching Translation indexes (%s) into %s with apt-get update",
        ",".join(languages),
        Path(lists_dir).resolve(),
    )
    apt_update(
        lists_dir,
        languages,
        "the Debian corpus is fetched with apt; elsewhere pass --lists-dir with "
        "Translation-<lang> files, or import your own data with --from-tsv/--from-parquet",
    )


def release_info(index_paths: Iterable[Path]) -> list[dict[str, str]]:
    """Origin/Suite/Codename/Version/Date of the releases the indexes come from (from their InRelease)."""
    releases = set()
    for p in index_paths:
        m = _INDEX_RE.match(p.name)
        if m is None:
            raise ValueError(f"{p}: not a Translation index file name")
        releases.add((p.parent, m["release"]))
    return read_releases(sorted(releases))


def read_releases(releases: Iterable[tuple[Path, str]]) -> list[dict[str, str]]:
    """The fields of :data:`_RELEASE_FIELDS` of each ``(lists folder, <host>_<path>_dists_<suite>)``'s
    InRelease (or Release) file, in order; a release without either file is left out."""
    infos = []
    for parent, release in releases:
        for name in (f"{release}_InRelease", f"{release}_Release"):
            path = parent / name
            if path.is_file():
                info = {"file": name}
                for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                    if not line.strip() and len(info) > 1:
                        break  # end of the release stanza (the PGP header precedes it)
                    key, sep, value = line.partition(":")
                    if sep and key in _RELEASE_FIELDS:
                        info[key.lower()] = value.strip()
                infos.append(info)
                break
    return infos


# ----------------------------------------------------------------------------------------------- parsing


def read_index_lines(path: str | Path) -> list[str]:
    """The decompressed text lines of an index file (plain, gz, xz, bz2; lz4, zst, ... via apt-helper)."""
    path = Path(path)
    m = _INDEX_RE.match(path.name)
    ext = m["ext"] if m else None
    if ext is None:
        data = path.read_bytes()
    elif ext in _PY_OPENERS:
        with _PY_OPENERS[ext](path, "rb") as f:
            data = f.read()
    else:
        helper = _APT_HELPER if Path(_APT_HELPER).exists() else shutil.which("apt-helper")
        if helper is None:
            raise CorpusError(f"cannot decompress {path}: apt-helper (from apt) not found")
        proc = subprocess.run([helper, "cat-file", str(path)], capture_output=True, check=False)
        if proc.returncode != 0:
            err = proc.stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
            raise CorpusError(f"cannot decompress {path} with apt-helper: {err[0]}")
        data = proc.stdout
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CorpusError(f"{path}:{line}: invalid UTF-8 ({exc.reason})") from exc
    # split on "\n" only: str.splitlines() would also break at U+2028, U+0085, ... inside descriptions
    return text.split("\n")


def split_description(first_line: str, body: Iterable[str]) -> tuple[str, ...]:
    """Segments of one description: the short description, then one whitespace-normalised line per paragraph
    ("" for a paragraph with verbatim lines or list items).

    ``body`` holds the continuation lines without their leading space; a line "." separates paragraphs.
    """
    body = list(body)
    paragraphs: list[list[str]] = [[]] if body else []
    for line in body:
        if line.strip() == ".":
            paragraphs.append([])
        else:
            paragraphs[-1].append(line)
    segments = [normalise(first_line)]
    for lines in paragraphs:
        verbatim = any(_VERBATIM_RE.match(line) for line in lines)
        segments.append("" if verbatim else normalise(" ".join(lines)))
    return tuple(segments)


def parse_translation(lines: Iterable[str], lang: str) -> Iterator[tuple[str, Description]]:
    """Yield ``(Description-md5, Description)`` for every stanza of an index that has both fields."""
    field = f"Description-{lang}"
    stanza: dict[str, str] = {}
    body: list[str] = []
    current = None  # the field whose continuation lines follow
    for line in itertools.chain(lines, [""]):
        if not line.strip(" \t\r"):  # a stanza ends at an empty line (a line of U+00A0 is a continuation)
            md5, first = stanza.get("Description-md5"), stanza.get(field)
            if md5 and first is not None:
                yield md5, Description(stanza.get("Package", ""), split_description(first, body))
            stanza, body, current = {}, [], None
        elif line[0] in " \t":
            if current == field:
                body.append(line[1:])
        else:
            key, _, value = line.partition(":")
            current = key.strip()
            stanza[current] = value.strip()


def load_descriptions(index_paths: Iterable[Path], lang: str) -> dict[str, Description]:
    """``Description-md5 -> Description`` merged over index files; the first file holding an md5 wins.

    The md5 is that of the English text, so every file holding it has the same description.
    """
    merged: dict[str, Description] = {}
    for path in index_paths:
        before = len(merged)
        for md5, desc in parse_translation(read_index_lines(path), lang):
            merged.setdefault(md5, desc)
        log.info("%s: %d new descriptions", path.name, len(merged) - before)
    return merged
