"""The catalog corpus: gettext catalogs (.mo files made here with polib) read and cleaned, the split kept
apart from its own and the description corpus's dev and test sentences, pt_BR read as pt, and the apt path
(apt-get replaced by a script that serves a .deb built here: no network)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

polib = pytest.importorskip("polib")

from fastvocab.artifacts_schema.corpus import CORPUS_SCHEMA, SPLITS, read_direction, split_path  # noqa: E402
from fastvocab.pipeline.cli import main  # noqa: E402
from fastvocab.tasks import catalog_corpus  # noqa: E402
from fastvocab.tasks import gettext_catalogs as gettext  # noqa: E402
from fastvocab.tasks.debian_translations import CorpusError  # noqa: E402

HEADER = {"Content-Type": "text/plain; charset=UTF-8", "Plural-Forms": "nplurals=2; plural=(n != 1);"}


def po_file(entries: list[dict]) -> polib.POFile:
    po = polib.POFile()
    po.metadata = dict(HEADER)
    for e in entries:
        po.append(polib.POEntry(**e))
    return po


def write_mo(path: Path, entries: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    po_file(entries).save_as_mofile(str(path))
    return path


# One entry of each kind the cleaning handles, in msgid order (a .mo is sorted by msgid, polib keeps it).
ENTRIES = [
    {"msgid": "%s: cannot open", "msgstr": "%s: impossibile aprire"},  # placeholder at the start
    {"msgid": "%1$s of %2$s", "msgstr": "%1$s di %2$s"},  # placeholders only: dropped
    {"msgid": "--", "msgstr": "--"},  # no letter
    {"msgid": "<b>Warning:</b> disk full", "msgstr": "<b>Attenzione:</b> disco pieno"},
    {"msgid": "Close", "msgstr": "Chiudi", "flags": ["fuzzy"]},  # msgfmt and polib leave it out of a .mo
    {"msgid": "Copied {count} files", "msgstr": "Copiati {count} file"},  # brace placeholder inside
    {"msgid": "First.\n\nSecond.", "msgstr": "Primo. Secondo."},  # 2 paragraphs against 1
    {"msgid": "LC_ALL is set", "msgstr": "LC_ALL è impostata"},  # an identifier, not an accelerator
    {"msgid": "Open file", "msgstr": "Apri file"},
    {"msgid": "Progress: 100%%", "msgstr": "Avanzamento: 100%%"},
    {"msgid": "Quit", "msgstr": " "},  # empty translation
    {
        "msgid": "Remove the file?",
        "msgid_plural": "Remove the files?",
        "msgstr_plural": {0: "Rimuovere il file?", 1: "Rimuovere i file?"},
    },
    {"msgid": "Sa&ve As", "msgstr": "Salva &come"},
    {"msgid": "Tom &amp; Jerry", "msgstr": "Tom &amp; Jerry"},
    {"msgid": "Unknown user: {user}", "msgstr": "Utente sconosciuto: {user}"},  # brace at the end
    {
        "msgid": "Usage: prog [OPTION]\n\n  -a, --all    show all\n",
        "msgstr": "Uso: prog [OPZIONE]\n\n  -a, --all    mostra tutto\n",
    },  # the option table is verbatim
    {"msgid": "_Save", "msgstr": "_Salva"},
    {"msgid": "cannot open %s for reading", "msgstr": "impossibile aprire %s in lettura"},  # inside
    {"msgid": "invalid argument: %s", "msgstr": "argomento non valido: %s"},  # at the end
]

EXPECTED = [
    ("cannot open", "impossibile aprire"),
    ("Warning: disk full", "Attenzione: disco pieno"),
    ("LC_ALL is set", "LC_ALL è impostata"),
    ("Open file", "Apri file"),
    ("Progress: 100%", "Avanzamento: 100%"),
    ("Remove the file?", "Rimuovere il file?"),  # the singular; the plural form is left out
    ("Save As", "Salva come"),
    ("Tom & Jerry", "Tom & Jerry"),
    ("Unknown user", "Utente sconosciuto"),
    ("Usage: prog [OPTION]", "Uso: prog [OPZIONE]"),
    ("Save", "Salva"),
    ("invalid argument", "argomento non valido"),
]

EXPECTED_COUNTS = {
    "messages": 18,  # every entry but the fuzzy one, which the .mo does not hold
    "obsolete": 0,
    "fuzzy": 0,
    "empty": 1,
    "plural": 1,
    "paragraphs_mismatch": 1,
    "segments": 17,  # the 16 messages left after those 2 give 17 paragraphs (Usage: 2)
    "verbatim": 1,
    "placeholders": 3,
    "placeholders_stripped": 3,
    "accelerators": 2,
    "markup": 2,
    "no_text": 1,
}


def test_reader_cleans_plurals_placeholders_accelerators_markup(tmp_path):
    mo = write_mo(tmp_path / "it" / "LC_MESSAGES" / "demo.mo", ENTRIES)
    counts: Counter = Counter()
    rows = list(gettext.read_catalog(mo, counts))
    assert [(s, t) for _, s, t in rows] == EXPECTED
    assert "Close" not in {s for _, s, _ in rows}  # the fuzzy entry is not in the .mo
    assert {k: counts[k] for k in gettext.COUNTS} == EXPECTED_COUNTS
    # a document is one English message: its md5, the same in every catalog
    assert rows[0][0] == hashlib.md5(b"%s: cannot open").hexdigest()
    usage = [doc for doc, s, _ in rows if s.startswith("Usage")]
    assert usage == [gettext.message_id(ENTRIES[15]["msgid"])]


def test_reader_counts_fuzzy_and_obsolete_entries_of_a_po(tmp_path):
    po = po_file([*ENTRIES, {"msgid": "Gone", "msgstr": "Sparito", "obsolete": True}])
    path = tmp_path / "demo.po"
    po.save(str(path))
    counts: Counter = Counter()
    rows = list(gettext.read_catalog(path, counts))
    assert [(s, t) for _, s, t in rows] == EXPECTED
    assert counts["fuzzy"] == 1 and counts["obsolete"] == 1 and counts["messages"] == 19


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("%s: %s: no such file", ("no such file", True, False)),
        ("“%s”: not found", ("not found", True, False)),
        ("bad value «%s»", ("bad value «%s»", False, True)),  # no colon before it: a sentence needs it
        ("%-10lu items", ("%-10lu items", False, True)),
        ("%(name)s left", ("%(name)s left", False, True)),
        ("Page %1", ("Page %1", False, True)),
        ("50%% done", ("50%% done", False, False)),
        ("no placeholder", ("no placeholder", False, False)),
    ],
)
def test_placeholders(text, cleaned):
    assert gettext._strip_placeholders(text) == cleaned


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("_File", "File"),
        ("(_Quit)", "(Quit)"),
        ("Sa&ve", "Save"),
        ("_open_osfhandle failed", "_open_osfhandle failed"),  # an identifier
        ("see https://x.org/?a=1&group=w", "see https://x.org/?a=1&group=w"),  # a URL
        ("a && b", "a && b"),
        ("_a and _b", "_a and _b"),  # two marks are no accelerator
    ],
)
def test_accelerators(text, cleaned):
    assert gettext._strip_accelerator(text)[0] == cleaned


@pytest.mark.parametrize(
    ("folder", "lang"),
    [("pt", "pt"), ("pt_BR", "pt"), ("de_CH", "de"), ("pt_BR.UTF-8", "pt"), ("sr@latin", None), ("C", None)],
)
def test_locale_language(folder, lang):
    assert gettext.locale_language(folder) == lang


# ------------------------------------------------------------------------------------------ the corpus


def build_system(tmp_path: Path, locale_dir: Path, languages=("en", "it"), **kw):
    kw = {"dev_size": 0, "test_size": 0, "hold_out": [], **kw}
    return catalog_corpus.build_catalog_corpus(tmp_path / "catalogs", languages, system_dir=locale_dir, **kw)


def test_manifest_counts_every_cleaning_step(tmp_path):
    locale = tmp_path / "locale"
    write_mo(locale / "it" / "LC_MESSAGES" / "demo.mo", ENTRIES)
    # a second catalog repeats one pair and adds one
    write_mo(
        locale / "it" / "LC_MESSAGES" / "other.mo",
        [{"msgid": "Open file", "msgstr": "Apri file"}, {"msgid": "Print", "msgstr": "Stampa"}],
    )
    write_mo(locale / "sr@latin" / "LC_MESSAGES" / "demo.mo", ENTRIES)  # another script: not read
    (result,) = build_system(tmp_path, locale)
    manifest = json.loads((tmp_path / "catalogs" / "corpus.json").read_text())
    record = manifest["pairs"]["en-it"]
    stats = record["stats"]
    assert {k: stats[k] for k in EXPECTED_COUNTS} == {
        **EXPECTED_COUNTS,
        "messages": 20,
        "segments": 19,
    }
    assert stats["catalogs"] == 2 and stats["duplicates_across_catalogs"] == 1
    assert stats["pairs"] == len(EXPECTED) + 1 == result.counts["train"]
    assert record["build"]["source"] == "gettext-system"
    assert record["source"]["catalogs"] == ["it/LC_MESSAGES/demo.mo", "it/LC_MESSAGES/other.mo"]
    _, src, tgt = read_direction(tmp_path / "catalogs", "en", "it", "train")
    assert list(zip(src, tgt, strict=True)) == [*EXPECTED, ("Print", "Stampa")]
    # the same catalogs: up to date; another catalog: rebuilt
    assert build_system(tmp_path, locale)[0].skipped
    write_mo(locale / "it" / "LC_MESSAGES" / "more.mo", [{"msgid": "Cut", "msgstr": "Taglia"}])
    assert not build_system(tmp_path, locale)[0].skipped


def test_pt_and_pt_br_are_both_pt(tmp_path):
    locale = tmp_path / "locale"
    write_mo(locale / "pt" / "LC_MESSAGES" / "demo.mo", [{"msgid": "Open file", "msgstr": "Abrir ficheiro"}])
    write_mo(
        locale / "pt_BR" / "LC_MESSAGES" / "demo.mo",
        [{"msgid": "Open file", "msgstr": "Abrir arquivo"}, {"msgid": "Print", "msgstr": "Imprimir"}],
    )
    write_mo(locale / "pt_BR" / "LC_MESSAGES" / "more.mo", [{"msgid": "Print", "msgstr": "Imprimir"}])
    (result,) = build_system(tmp_path, locale, languages=["en", "pt"])
    assert result.name == "en-pt"
    _, src, tgt = read_direction(tmp_path / "catalogs", "en", "pt", "train")
    # domain by domain, pt before pt_BR; the repeated pt_BR pair kept once
    assert list(zip(src, tgt, strict=True)) == [
        ("Open file", "Abrir ficheiro"),
        ("Open file", "Abrir arquivo"),
        ("Print", "Imprimir"),
    ]
    record = json.loads((tmp_path / "catalogs" / "corpus.json").read_text())["pairs"]["en-pt"]
    assert record["source"]["catalogs"] == [
        "pt/LC_MESSAGES/demo.mo",
        "pt_BR/LC_MESSAGES/demo.mo",
        "pt_BR/LC_MESSAGES/more.mo",
    ]
    assert record["stats"]["duplicates_across_catalogs"] == 1
    with pytest.raises(CorpusError, match="plain codes"):
        build_system(tmp_path, locale, languages=["en", "pt_BR"])


def write_description_corpus(folder: Path, lang: str, splits: dict[str, list[tuple[str, str]]]) -> None:
    for split in SPLITS:
        rows = splits.get(split, [])
        table = pa.table(
            [list(range(len(rows))), [str(i) for i in range(len(rows))], *map(list, zip(*rows, strict=True))]
            if rows
            else [[], [], [], []],
            schema=CORPUS_SCHEMA,
        )
        path = split_path(folder, "en", lang, split)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)


def texts(folder: Path, lang: str, split: str) -> set[str]:
    _, src, tgt = read_direction(folder, "en", lang, split)
    return set(src) | set(tgt)


def test_dev_and_test_never_reach_train_nor_the_descriptions_dev_and_test(tmp_path):
    """Messages whose texts recur (one English message in several catalogs with other translations, one
    translation for several messages) and a description corpus whose dev and test share sentences with
    the catalogs: the splits must keep all of them apart."""
    locale = tmp_path / "locale"
    for d in range(3):
        entries = [
            {"msgid": f"Message number {i}.", "msgstr": f"Messaggio numero {(i * (d + 1)) % 90}."}
            for i in range(120)
        ]
        write_mo(locale / "it" / "LC_MESSAGES" / f"domain{d}.mo", entries)
    desc = tmp_path / "corpus"
    write_description_corpus(
        desc,
        "it",
        {
            "train": [("Message number 1.", "Messaggio numero 1.")],  # train sentences may stay
            "dev": [("Message number 5.", "Qualcosa"), ("Description dev.", "Messaggio numero 7.")],
            "test": [("Message number 9.", "Altro")],
        },
    )
    (result,) = build_system(tmp_path, locale, dev_size=30, test_size=30, hold_out=[desc])
    out = tmp_path / "catalogs"
    train = texts(out, "it", "train")
    held = texts(out, "it", "dev") | texts(out, "it", "test")
    assert len(held) > 20 and len(train) > 50
    assert not train & held
    desc_held = texts(desc, "it", "dev") | texts(desc, "it", "test")
    assert not (train | held) & desc_held
    assert "Message number 1." in train | held  # a description train sentence is not held out
    assert result.stats["held_out_descriptions"] >= 3 + 3  # each of the 3 held sentences, 3 domains
    assert result.stats["train_dropped_overlap"] > 0  # the recurring translations did collide
    record = json.loads((out / "corpus.json").read_text())["pairs"]["en-it"]
    assert record["source"]["hold_out"][0]["dir"] == str(desc)
    # the description corpus rebuilt: the catalog pair is rebuilt too
    write_description_corpus(desc, "it", {"train": [("a", "b")], "dev": [("c", "d")], "test": [("e", "f")]})
    assert not build_system(tmp_path, locale, dev_size=30, test_size=30, hold_out=[desc])[0].skipped


def test_hold_out_folder_missing_the_pair_or_being_the_output(tmp_path):
    locale = tmp_path / "locale"
    write_mo(locale / "it" / "LC_MESSAGES" / "demo.mo", ENTRIES)
    with pytest.raises(CorpusError, match="cannot hold out the en-it dev and test sentences"):
        build_system(tmp_path, locale, hold_out=[tmp_path / "nowhere"])
    with pytest.raises(CorpusError, match="catalog corpus's own folder"):
        build_system(tmp_path, locale, hold_out=[tmp_path / "catalogs"])


# ----------------------------------------------------------------------------------------- the apt path


FAKE_APT = r"""
import hashlib, os, shutil, sys
args = sys.argv[1:]
with open(os.environ["FAKE_APT_LOG"], "a") as log:
    log.write(" ".join(args) + "\n")
lists = next(a.split("=", 1)[1] for a in args if a.startswith("Dir::State::Lists="))
debs = os.environ["FAKE_APT_DEBS"]  # name_version_arch.deb files
known = {f.split("_")[0]: f for f in os.listdir(debs)}
if "update" in args:
    prefix = os.path.join(lists, "mirror_debian_dists_stable")
    open(prefix + "_main_binary-amd64_Packages", "w").write("Package: x\n")
    open(prefix + "_InRelease", "w").write("Origin: Debian\nSuite: stable\nCodename: bookworm\n\n")
    sys.exit(0)
specs = args[args.index("download") + 1:]
uris = specs[0] == "--print-uris"
for spec in specs[1:] if uris else specs:
    name = spec.split("=")[0]
    if name not in known:
        print(f"E: Unable to locate package {name}", file=sys.stderr)
        sys.exit(100)
for spec in specs[1:] if uris else specs:
    f = known[spec.split("=")[0]]
    if uris:
        digest = hashlib.sha256(open(os.path.join(debs, f), "rb").read()).hexdigest()
        print(f"'file:/pool/{f}' {f} 1 SHA256:{digest}")
    else:
        shutil.copy(os.path.join(debs, f), os.getcwd())
"""


def build_deb(folder: Path, name: str, version: str, catalogs: dict[str, list[dict]]) -> Path:
    root = folder / f"{name}-root"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: {version}\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
    )
    for locale, entries in catalogs.items():
        write_mo(root / "usr" / "share" / "locale" / locale / "LC_MESSAGES" / f"{name}.mo", entries)
    deb = folder / f"{name}_{version}_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)], check=True, capture_output=True
    )
    shutil.rmtree(root)
    return deb


@pytest.fixture
def fake_apt(tmp_path, monkeypatch) -> Path:
    """apt-get on PATH replaced by a script that logs its arguments and serves the .deb files built here."""
    if not shutil.which("dpkg-deb"):
        pytest.skip("needs dpkg-deb to build and unpack a .deb")
    debs = tmp_path / "pool"
    debs.mkdir()
    entries = [{"msgid": f"Message {i}", "msgstr": f"Messaggio {i}"} for i in range(40)]
    build_deb(debs, "alpha", "1.0-1", {"it": entries, "pt_BR": entries})
    build_deb(debs, "beta", "2.0-3", {"it": [{"msgid": "Open _file", "msgstr": "Apri _file"}]})
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "apt-get"
    script.write_text(f"#!{sys.executable}\n" + textwrap.dedent(FAKE_APT))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    log = tmp_path / "apt-log"
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_APT_DEBS", str(debs))
    monkeypatch.setenv("FAKE_APT_LOG", str(log))
    return log


def run_cli(*argv: object) -> int:
    return main(["corpus", *[str(a) for a in argv]])


def test_cli_fetches_downloads_and_unpacks_with_apt(tmp_path, fake_apt, capsys):
    out = tmp_path / "catalogs"
    argv = ["--catalogs", "-o", out, "--packages", "alpha,beta", "--languages", "en,it"]
    argv += ["--dev-size", "5", "--test-size", "5", "--hold-out", tmp_path / "corpus"]
    write_description_corpus(tmp_path / "corpus", "it", {"dev": [("x", "y")], "test": [("z", "w")]})
    assert run_cli(*argv) == 0
    printed = capsys.readouterr().out
    assert "en-it" in printed and "alpha 1.0-1, beta 2.0-3" in printed
    calls = fake_apt.read_text().splitlines()
    assert calls[0].endswith(" update") and "Acquire::Languages=none" in calls[0]
    assert f"Dir::State::Lists={(out / 'apt-lists').resolve()}" in calls[0]
    assert "download --print-uris alpha beta" in calls[1] and "Dir::State::status=/dev/null" in calls[1]
    assert calls[2].endswith("download alpha=1.0-1 beta=2.0-3")
    record = json.loads((out / "corpus.json").read_text())["pairs"]["en-it"]
    assert [(p["name"], p["version"], p["architecture"]) for p in record["build"]["packages"]] == [
        ("alpha", "1.0-1", "all"),
        ("beta", "2.0-3", "all"),
    ]
    assert record["source"]["release"][0]["codename"] == "bookworm"
    assert record["stats"]["accelerators"] == 1 and record["stats"]["pairs"] == 41
    assert (out / "debs" / "alpha_1.0-1_all.deb").is_file() and (
        out / "unpacked" / "alpha_1.0-1_all"
    ).is_dir()
    # again: the lists and the .deb files are there, nothing is fetched but the versions
    capsys.readouterr()
    assert run_cli(*argv) == 0
    assert "up to date" in capsys.readouterr().out
    assert len(fake_apt.read_text().splitlines()) == 4  # one more --print-uris, no update, no download


def test_cli_unknown_package_is_one_line(tmp_path, fake_apt, capsys):
    argv = ["--catalogs", "-o", tmp_path / "c", "--packages", "alpha,nosuch", "--hold-out", tmp_path / "c2"]
    write_description_corpus(tmp_path / "c2", "it", {})
    assert run_cli(*argv, "--languages", "en,it") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "E: Unable to locate package nosuch" in err


def test_cli_without_apt_get_is_one_line(tmp_path, monkeypatch, capsys):
    write_description_corpus(tmp_path / "corpus", "it", {})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    argv = ["--catalogs", "-o", tmp_path / "c", "--languages", "en,it", "--hold-out", tmp_path / "corpus"]
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "apt-get not found" in err and "--catalogs-from-system" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--catalogs", "--from-tsv", "x.tsv"], "--catalogs cannot be used with --from-tsv"),
        (["--packages", "tar"], "--packages cannot be used with the Debian corpus"),
        (["--catalogs", "--mono-debian"], "--mono-debian cannot be used with --catalogs"),
        (["--catalogs", "--packages", "tar;rm", "--hold-out", "."], "invalid package name"),
    ],
)
def test_cli_flag_errors(tmp_path, capsys, argv, message):
    assert run_cli("--output", tmp_path / "c", *argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_cli_reads_the_system_catalogs_with_config_keys(tmp_path, capsys):
    locale = tmp_path / "locale"
    entries = [{"msgid": f"Message {i}", "msgstr": f"Messaggio {i}"} for i in range(30)]
    write_mo(locale / "it" / "LC_MESSAGES" / "demo.mo", entries)
    write_description_corpus(tmp_path / "corpus", "it", {"dev": [("Message 3", "x")]})
    config = tmp_path / "run.yaml"
    config.write_text(
        f"corpus:\n  out_dir: {tmp_path / 'corpus'}\n  languages: [en, it]\n  dev_size: 4\n  test_size: 4\n"
        f"  catalogs:\n    out_dir: {tmp_path / 'cat'}\n    system_dir: {locale}\n"
    )
    assert run_cli("--config", config, "--catalogs", "--catalogs-from-system") == 0
    assert f"catalog corpus in {tmp_path / 'cat'}" in capsys.readouterr().out
    counts = {s: len(read_direction(tmp_path / "cat", "en", "it", s)[0]) for s in SPLITS}
    assert counts == {"train": 21, "dev": 4, "test": 4}  # 30 messages, one held out by the descriptions


def test_the_corpus_stage_builds_no_description_pair_into_a_catalog_corpus(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.errors import UserError
    from fastvocab.pipeline.stages import corpus as corpus_stage

    locale = tmp_path / "locale"
    write_mo(locale / "it" / "LC_MESSAGES" / "demo.mo", ENTRIES)
    build_system(tmp_path, locale)
    out = tmp_path / "catalogs"
    cfg = load_config(None, {"corpus.out_dir": str(out), "directions": ["en-it", "en-fr"]})
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no apt-get: no network, whatever the stage does
    with pytest.raises(UserError, match="a catalog corpus: build it with `fastvocab corpus --catalogs"):
        corpus_stage.run(SimpleNamespace(cfg=cfg, corpus_dir=out))
    assert not (out / "en-fr").exists() and not (out / "apt-lists").exists()


def test_a_dump_source_catalogs_makes_the_corpus_stage_build_the_catalog_corpus(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.stages import corpus as corpus_stage

    locale = tmp_path / "locale"
    write_mo(locale / "it" / "LC_MESSAGES" / "demo.mo", ENTRIES)
    descriptions = tmp_path / "corpus"
    for split in SPLITS:  # the description corpus exists: only the catalogs are missing
        path = split_path(descriptions, "en", "it", split)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = {"id": [0], "doc_id": ["d"], "text1": [f"a {split} line"], "text2": [f"una riga {split}"]}
        pq.write_table(pa.table(rows, schema=CORPUS_SCHEMA), path)
    catalogs = tmp_path / "catalogs"
    overrides = {
        "corpus.out_dir": str(descriptions),
        "corpus.dev_size": 0,
        "corpus.test_size": 0,
        "corpus.catalogs.out_dir": str(catalogs),
        "corpus.catalogs.from_system": True,
        "corpus.catalogs.system_dir": str(locale),
        "directions": ["it-en"],
        "dump.sources": ["train", "catalogs"],
    }
    cfg = load_config(None, overrides)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no apt-get: the system's catalogs only
    (record,) = corpus_stage.run(SimpleNamespace(cfg=cfg, corpus_dir=descriptions))
    train = read_direction(catalogs, "en", "it", "train")[1]
    assert record.status == "ran" and f"catalogs en-it: {len(train)} train pairs written" in record.message
    assert len(train) > 0
    # built once: a second run finds the pair and builds nothing
    (again,) = corpus_stage.run(SimpleNamespace(cfg=cfg, corpus_dir=descriptions))
    assert again.status == "skipped" and "train pairs written" not in again.message


def test_the_catalog_corpus_refuses_a_pivot_other_than_english_before_any_work(tmp_path):
    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.stages.corpus import build_catalogs
    from fastvocab.tasks.debian_translations import CorpusError

    out = tmp_path / "catalogs"
    overrides = {"corpus.pivot": "de", "corpus.languages": ["de", "it"], "corpus.catalogs.out_dir": str(out)}
    cfg = load_config(None, overrides)
    with pytest.raises(CorpusError, match="the pivot must be 'en', not 'de'"):
        build_catalogs(cfg.corpus, force=False)
    assert not out.exists()
