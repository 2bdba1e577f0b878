"""gettext message catalogs as parallel text: fetch Debian packages' catalogs with apt, read and clean them.

A catalog (``<locale dir>/<locale>/LC_MESSAGES/<domain>.mo``) maps each English message of a program to its
translation. The packages are fetched with apt itself, from the machine's configured sources, into the work
folder (no host is named here): ``apt-get update`` into a private lists folder (Packages indexes only), the
versions resolved and the files downloaded with ``apt-get download``, each ``.deb`` unpacked with
``dpkg-deb -x``; nothing is installed. apt resolves the versions as on a machine with nothing installed and no
pinning (an empty dpkg status and no preferences), so the same sources give the same packages anywhere; a
package may also be named with its version (``coreutils=9.1-1``).

Catalogs are read with polib (``.mo``, and ``.po`` where a caller has one). Each message becomes segment
pairs, cleaned as follows (the counts of every step go into the corpus manifest):

- the header entry is skipped; an untranslated message (empty translation) is ``empty``; in a ``.po``, a
  ``fuzzy`` or obsolete entry is left out and counted (a ``.mo`` holds none: msgfmt leaves them out);
- a message with plural forms gives one pair, its singular: ``msgid`` with the translation's form 0
  (``plural``); the plural forms are left out (their index depends on each language's Plural-Forms rule);
- a message is cut into paragraphs at blank lines, the lines of a paragraph joined and whitespace-normalised;
  a message whose paragraph count differs between the two sides is left out (``paragraphs_mismatch``); a
  paragraph with an indented line or a list item (option tables of ``--help``, examples) is left out in both
  (``verbatim``), keeping its index;
- placeholders: printf (``%s``, ``%d``, ``%1$s``, ``%-10lu``, ``%.*s``), Python (``%(name)s``), Qt (``%1``)
  and brace (``{name}``, ``{0}``) placeholders at either end of a segment, with the separator that joins them
  (``%s: no such file`` and ``no such file: %s`` give ``no such file``) are stripped
  (``placeholders_stripped``); a segment with a placeholder left inside is dropped (``placeholders``), since
  the sentence is not whole without it; ``%%`` becomes ``%``;
- accelerator marks (``_File``, ``&File``: one mark before a letter, at a word's start for ``_``) are
  removed (``accelerators``);
- markup (``<b>``, ``<span ...>``, ``<br/>``, entities such as ``&amp;``, and gnupg's ``|ARG|`` before an
  option's help) is removed and entities decoded (``markup``);
- a segment left without a letter on either side is dropped (``no_text``).
"""

from __future__ import annotations

import hashlib
import html
import logging
import os
import re
import shutil
import struct
import subprocess
import tempfile
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import polib

from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.tasks import debian_translations as debian
from fastvocab.tasks.debian_translations import CorpusError, normalise

log = logging.getLogger(__name__)

# Recorded with every catalog pair: a corpus cleaned by other rules is rebuilt, not reused.
CLEANING = (
    "gettext/1: singular of plurals; paragraphs, verbatim dropped; edge placeholders stripped, inner "
    "dropped; accelerators and markup removed"
)

# What read_catalog counts (tasks.catalog_corpus records each, 0 too, in the corpus manifest).
COUNTS = (
    "messages", "obsolete", "fuzzy", "empty", "plural", "paragraphs_mismatch", "segments", "verbatim",
    "placeholders", "placeholders_stripped", "accelerators", "markup", "no_text",
)  # fmt: skip

# A package as apt-get takes it: a name, optionally "=version".
PACKAGE_RE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+~:-]+)?$")
# <host>_<path>_dists_<suite>_<component>_binary-<arch>_Packages[.<compression>], as apt names list files.
_PACKAGES_RE = re.compile(r"^(?P<release>.+_dists_[^_]+)_[^_]+_binary-[^_]+_Packages(?:\.\w+)?$")
# A locale folder: ll, ll_CC, ll_CC.codeset, ll@variant (a script or style: sr@latin, en@quot).
_LOCALE_RE = re.compile(
    r"^(?P<lang>[a-z]{2,3})(?:_(?P<region>[A-Z]{2}|\d{3}))?(?:\.[\w-]+)?(?:@(?P<variant>\w+))?$"
)

_NO_APT = "catalogs are fetched with apt; elsewhere read the machine's own with --catalogs-from-system"

# apt resolves versions as on a machine with nothing installed and no pinning, and downloads as root into
# folders the _apt user may not enter (without this it warns for every file)
_RESOLVE_OPTIONS = [
    "-o", "Dir::State::status=/dev/null",
    "-o", "Dir::Etc::preferences=/dev/null",
    "-o", "Dir::Etc::preferencesparts=/dev/null",
    "-o", "APT::Sandbox::User=root",
]  # fmt: skip


def check_package(name: str) -> str:
    if not PACKAGE_RE.match(name):
        raise CorpusError(f"invalid package name {name!r} (expected e.g. 'coreutils' or 'coreutils=9.1-1')")
    return name


# ---------------------------------------------------------------------------------------------- fetching


@dataclass(frozen=True)
class DebPackage:
    """One package as apt resolved it."""

    name: str
    version: str
    architecture: str
    filename: str  # as apt-get download names it
    checksum: str  # "SHA256:<hex>" (the algorithm the index gives)

    def record(self) -> dict[str, str]:
        return {
            "name": self.name,
            "version": self.version,
            "architecture": self.architecture,
            "checksum": self.checksum,
        }


def has_package_indexes(lists_dir: str | Path) -> bool:
    lists_dir = Path(lists_dir)
    return lists_dir.is_dir() and any(_PACKAGES_RE.match(p.name) for p in lists_dir.iterdir())


def fetch_package_indexes(lists_dir: str | Path) -> None:
    """``apt-get update`` of the Packages indexes (no Translation indexes) into a private lists folder."""
    log.info("fetching the Packages indexes into %s with apt-get update", Path(lists_dir).resolve())
    debian.apt_update(lists_dir, [], _NO_APT)


def package_releases(lists_dir: str | Path) -> list[dict[str, str]]:
    """Origin/Suite/Codename/Version/Date of every release whose Packages index is in the lists folder."""
    lists_dir = Path(lists_dir)
    releases = {m["release"] for p in lists_dir.iterdir() if (m := _PACKAGES_RE.match(p.name))}
    return debian.read_releases((lists_dir, r) for r in sorted(releases))


def _apt_get(lists_dir: Path) -> list[str]:
    return [debian.find_apt_get(_NO_APT), "-q", *debian.private_lists_options(lists_dir), *_RESOLVE_OPTIONS]


def resolve_packages(lists_dir: str | Path, packages: Iterable[str]) -> list[DebPackage]:
    """The version, architecture, file name and checksum apt would download for each package, in order.

    One ``apt-get download --print-uris`` call: a package that does not exist (or a version that does not)
    is a one-line CorpusError with apt's message.
    """
    lists_dir = Path(lists_dir).resolve()
    packages = [check_package(p) for p in packages]
    out = debian.run_apt(
        [*_apt_get(lists_dir), "download", "--print-uris", *packages],
        f"apt-get download --print-uris {' '.join(packages)}",
    )
    found: dict[str, DebPackage] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) != 4 or not parts[1].endswith(".deb"):
            continue
        filename, checksum = parts[1], parts[3]
        name, version, arch = urllib.parse.unquote(filename.removesuffix(".deb")).split("_")
        found[name] = DebPackage(name, version, arch, filename, checksum)
    resolved = []
    for p in packages:
        name = p.partition("=")[0]
        if name not in found:
            raise CorpusError(f"apt-get resolved no file for package {p!r}")
        resolved.append(found[name])
    return resolved


def _checksum_ok(path: Path, checksum: str) -> bool:
    algorithm, _, expected = checksum.partition(":")
    name = {"sha256": "sha256", "sha512": "sha512", "sha1": "sha1", "md5sum": "md5"}.get(algorithm.lower())
    if name is None or not path.is_file():
        return False
    h = hashlib.new(name)
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest() == expected.lower()


def download_packages(lists_dir: str | Path, debs_dir: str | Path, packages: list[DebPackage]) -> list[Path]:
    """The ``.deb`` of each package in ``debs_dir``: a file already there whose checksum matches is kept, the
    others are fetched with ``apt-get download`` (into a temporary folder, then moved in)."""
    lists_dir, debs_dir = Path(lists_dir).resolve(), Path(debs_dir)
    debs_dir.mkdir(parents=True, exist_ok=True)
    paths = [debs_dir / p.filename for p in packages]
    todo = [p for p, path in zip(packages, paths, strict=True) if not _checksum_ok(path, p.checksum)]
    if todo:
        log.info(
            "downloading %d packages into %s with apt-get download (%d already there)",
            len(todo),
            debs_dir,
            len(packages) - len(todo),
        )
        tmp = Path(tempfile.mkdtemp(prefix=".download.", dir=debs_dir))
        try:
            specs = [f"{p.name}={p.version}" for p in todo]
            debian.run_apt([*_apt_get(lists_dir), "download", *specs], "apt-get download", cwd=tmp)
            for p in todo:
                got = tmp / p.filename
                if not _checksum_ok(got, p.checksum):
                    raise CorpusError(f"apt-get download gave no {p.filename} matching its {p.checksum}")
                os.replace(got, debs_dir / p.filename)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return paths


def unpack_package(deb: Path, unpacked_root: Path) -> Path:
    """``dpkg-deb -x`` of a ``.deb``, of which ``<unpacked_root>/<its name without .deb>/`` keeps the
    catalogs' folder (``usr/share/locale``: the programs, libraries and manuals are not needed). Written
    atomically (a folder there is complete); an existing one is reused."""
    target = unpacked_root / deb.name.removesuffix(".deb")
    if target.is_dir():
        return target
    dpkg_deb = shutil.which("dpkg-deb")
    if dpkg_deb is None:
        raise CorpusError(f"dpkg-deb not found: cannot unpack {deb}; {_NO_APT}")
    log.info("unpacking %s", deb.name)
    unpacked_root.mkdir(parents=True, exist_ok=True)
    scratch_dir = tempfile.TemporaryDirectory(prefix=".unpack.", dir=unpacked_root)
    with scratch_dir as scratch, atomic_path(target) as tmp:
        cmd = [dpkg_deb, "-x", str(deb), scratch]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            err = proc.stderr.strip().splitlines() or ["no output"]
            raise CorpusError(f"dpkg-deb -x {deb} failed (exit {proc.returncode}): {err[0]}")
        kept = package_locale_dir(tmp)
        kept.parent.mkdir(parents=True)
        locale = package_locale_dir(Path(scratch))
        if locale.is_dir():
            shutil.move(locale, kept)
    return target


def package_locale_dir(unpacked: Path) -> Path:
    return unpacked / "usr" / "share" / "locale"


# ---------------------------------------------------------------------------------------------- catalogs


@dataclass(frozen=True)
class Catalog:
    origin: str  # the package it came from, or "system"
    locale: str  # its locale folder (pt_BR)
    domain: str  # its file name without .mo
    path: Path

    @property
    def name(self) -> str:
        return f"{self.locale}/LC_MESSAGES/{self.domain}.mo"


def locale_language(folder: str) -> str | None:
    """The language a locale folder counts as: ``pt`` and ``pt_BR`` are ``pt``; a folder with a variant
    (``sr@latin``, ``en@quot``: another script or style) or not a locale name counts as none."""
    m = _LOCALE_RE.match(folder)
    if m is None or m["variant"]:
        return None
    return m["lang"]


def find_catalogs(locale_dir: str | Path, origin: str, languages: Iterable[str]) -> list[Catalog]:
    """The ``.mo`` catalogs of ``<locale_dir>/<locale>/LC_MESSAGES/`` whose locale counts as one of
    ``languages``, sorted by domain, then locale (``pt`` before ``pt_BR``)."""
    locale_dir = Path(locale_dir)
    wanted = set(languages)
    found = []
    if locale_dir.is_dir():
        for sub in locale_dir.iterdir():
            if locale_language(sub.name) in wanted and (sub / "LC_MESSAGES").is_dir():
                for mo in (sub / "LC_MESSAGES").glob("*.mo"):
                    if mo.is_file():
                        found.append(Catalog(origin, sub.name, mo.stem, mo))
    return sorted(found, key=lambda c: (c.domain, c.locale))


# --------------------------------------------------------------------------------------------- cleaning

_PRINTF = (
    r"%(?:\d+\$)?[-+#0'I]*(?:\d+|\*(?:\d+\$)?)?(?:\.(?:\d+|\*(?:\d+\$)?))?"
    r"(?:hh|h|ll|l|L|q|j|z|Z|t)?[diouxXeEfFgGaAcCsSpnm]"
)
_PY_NAMED = r"%\([^()]*\)[-+#0 ]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"
_QT = r"%\d+"
_BRACE = r"\{[A-Za-z0-9_]*(?:![rsa])?(?::[^{}]*)?\}"
_PLACEHOLDER = f"(?:{_PRINTF}|{_PY_NAMED}|{_QT}|{_BRACE})"
_PLACEHOLDER_RE = re.compile(f"%%|{_PLACEHOLDER}")  # %% first: "%%d" is a literal "%d"
_QUOTE = "[\"'`‘’“”«»„‚]?"
# a placeholder at the start with the colon after it ("%s: "), or at the end with the colon before it
_LEADING_RE = re.compile(rf"^\s*{_QUOTE}{_PLACEHOLDER}{_QUOTE}\s*:\s+")
_TRAILING_RE = re.compile(rf"\s*:\s*{_QUOTE}\s?{_PLACEHOLDER}\s?{_QUOTE}\s*$")

# A word (between spaces, punctuation around it allowed) holding one mark: "&File", "Sa&ve", "_File". Not
# an entity (&amp;), nor a word that goes on after other characters (a URL's "?a=1&b=2", "_open_osfhandle").
_AMP_WORD_RE = re.compile(r"^[^\w&]*[^\W_]*&[^\W_]+[^\w&]*$")
_UND_WORD_RE = re.compile(r"^[^\w&]*_[^\W_]+[^\w&]*$")

_INLINE_TAGS = "a|abbr|b|big|cite|code|em|font|i|kbd|markup|q|s|samp|small|span|strong|sub|sup|tt|u|var"
_BLOCK_TAGS = "blockquote|br|dd|div|dl|dt|h[1-6]|hr|img|li|ol|p|pre|table|td|th|tr|ul"
_INLINE_RE = re.compile(rf"</?(?:{_INLINE_TAGS})(?:\s[^<>]*)?/?>", re.IGNORECASE)
_BLOCK_RE = re.compile(rf"</?(?:{_BLOCK_TAGS})(?:\s[^<>]*)?/?>", re.IGNORECASE)
_ENTITY_RE = re.compile(r"&(?:[A-Za-z]+|#\d+|#x[0-9A-Fa-f]+);")
# gnupg's option help names the option's argument first: "|FILE|read options from FILE"
_ARG_MARK_RE = re.compile(r"^\|[^|\s]+\|")

# A line Debian would show verbatim, or a list item: option tables and examples, not sentences.
_VERBATIM_RE = re.compile(r"^(?:[ \t]|[*+•-](?:\s|$))")
_PARAGRAPH_RE = re.compile(r"\n[ \t]*\n")


def paragraphs(text: str) -> list[str]:
    """A message's paragraphs (cut at blank lines), each one whitespace-normalised line; "" for a paragraph
    with an indented line or a list item."""
    text = text.strip("\n")
    out = []
    for para in _PARAGRAPH_RE.split(text) if text else []:
        lines = para.split("\n")
        out.append("" if any(_VERBATIM_RE.match(line) for line in lines) else normalise(" ".join(lines)))
    return out


def _strip_placeholders(text: str) -> tuple[str, bool, bool]:
    """``(text, stripped, inner)``: placeholders at the ends removed with their colon; ``inner`` when one is
    left inside (``%%`` is no placeholder)."""
    stripped = False
    while True:
        new = _TRAILING_RE.sub("", _LEADING_RE.sub("", text, count=1), count=1)
        if new == text:
            break
        text, stripped = new, True
    inner = any(m.group() != "%%" for m in _PLACEHOLDER_RE.finditer(text))
    return text, stripped, inner


def _strip_accelerator(text: str) -> tuple[str, bool]:
    """The text without its accelerator mark: one word of it holds one ``&`` (anywhere) or one ``_`` (at the
    word's start), and no other word holds such a mark (two are no accelerator: identifiers, shell)."""
    words = text.split(" ")
    for pattern, mark in ((_AMP_WORD_RE, "&"), (_UND_WORD_RE, "_")):
        hits = [i for i, w in enumerate(words) if pattern.match(w) and not _ENTITY_RE.search(w)]
        if len(hits) == 1:
            words[hits[0]] = words[hits[0]].replace(mark, "", 1)
            return " ".join(words), True
    return text, False


def _strip_markup(text: str) -> tuple[str, bool]:
    """The text without tags, its entities decoded; whether it had any."""
    if not (_INLINE_RE.search(text) or _BLOCK_RE.search(text) or _ENTITY_RE.search(text)):
        return text, False
    text = _BLOCK_RE.sub(" ", _INLINE_RE.sub("", text))
    return html.unescape(text), True


def clean_pair(source: str, target: str, stats: Counter) -> tuple[str, str] | None:
    """One paragraph pair, cleaned (see the module docstring), or None when it is dropped; counts in
    ``stats``."""
    (source, s_stripped, s_inner), (target, t_stripped, t_inner) = map(_strip_placeholders, (source, target))
    if s_inner or t_inner:
        stats["placeholders"] += 1
        return None
    stats["placeholders_stripped"] += s_stripped or t_stripped
    source, target = (text.replace("%%", "%") for text in (source, target))
    (source, s_arg), (target, t_arg) = _ARG_MARK_RE.subn("", source), _ARG_MARK_RE.subn("", target)
    (source, s_accel), (target, t_accel) = _strip_accelerator(source), _strip_accelerator(target)
    stats["accelerators"] += s_accel or t_accel
    (source, s_markup), (target, t_markup) = _strip_markup(source), _strip_markup(target)
    stats["markup"] += bool(s_markup or t_markup or s_arg or t_arg)
    source, target = normalise(source), normalise(target)
    if not (any(c.isalpha() for c in source) and any(c.isalpha() for c in target)):
        stats["no_text"] += 1
        return None
    return source, target


def message_id(msgid: str) -> str:
    """A message's document id: the md5 of its English text (as Debian keys descriptions), so the same
    message in every catalog and locale lands in one split."""
    return hashlib.md5(msgid.encode(), usedforsecurity=False).hexdigest()


def _load(path: Path) -> polib._BaseFile:
    try:
        return polib.pofile(str(path)) if path.suffix == ".po" else polib.mofile(str(path))
    except (OSError, ValueError, struct.error, UnicodeDecodeError, LookupError) as exc:
        raise CorpusError(f"{path}: not a readable gettext catalog ({exc})") from exc


def read_catalog(path: str | Path, stats: Counter | None = None) -> Iterator[tuple[str, str, str]]:
    """``(doc_id, English, translation)`` for each cleaned paragraph pair of a ``.mo`` (or ``.po``) catalog,
    in the catalog's order; the cleaning's counts go into ``stats``."""
    stats = Counter() if stats is None else stats
    for entry in _load(Path(path)):
        if not entry.msgid:
            continue  # the header
        if entry.obsolete:
            stats["obsolete"] += 1
            continue
        stats["messages"] += 1
        if "fuzzy" in entry.flags:
            stats["fuzzy"] += 1
            continue
        if entry.msgid_plural:
            stats["plural"] += 1
            translation = entry.msgstr_plural.get(0, "")
        else:
            translation = entry.msgstr
        if not translation.strip():
            stats["empty"] += 1
            continue
        source, target = paragraphs(entry.msgid), paragraphs(translation)
        if len(source) != len(target):
            stats["paragraphs_mismatch"] += 1
            continue
        doc = message_id(entry.msgid)
        for s, t in zip(source, target, strict=True):
            stats["segments"] += 1
            if not (s and t):
                stats["verbatim"] += 1
                continue
            pair = clean_pair(s, t, stats)
            if pair is not None:
                yield doc, *pair
