"""The corpus stage: Translation-index parsing, pairing, de-duplication, the document split, the user's files
and the CLI end to end on small fake apt lists folders (no network: apt-get is replaced by a script)."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastvocab.artifacts_schema.corpus import (
    SPLITS,
    mono_path,
    read_corpus_file,
    read_direction,
    read_mono,
    split_path,
)
from fastvocab.pipeline.cli import main
from fastvocab.tasks import corpus, corpus_import
from fastvocab.tasks import debian_translations as debian

EN = textwrap.dedent(
    """\
    Package: alpha
    Description-md5: 00000000000000000000000000000001
    Description-en: Alpha   tool
     First paragraph, wrapped
     over two   lines.
     .
     Second paragraph.
     .
     Features:
       * one
       * two
     .
     Last paragraph.

    Package: beta
    Description-md5: 00000000000000000000000000000002
    Description-en: Beta library
     Only one paragraph.

    Package: gamma
    Description-md5: 00000000000000000000000000000003
    Description-en: Gamma game
     Para one.
     .
     Para two.

    Package: gamma-data
    Description-md5: 00000000000000000000000000000004
    Description-en: Gamma game
     Para one.
    """
)
IT = textwrap.dedent(
    """\
    Package: alpha
    Description-md5: 00000000000000000000000000000001
    Description-it: Strumento   alfa
     Primo paragrafo,
     su due righe.
     .
     Secondo paragrafo.
     .
     Funzionalità:
       * uno
       * due
     .
     Ultimo paragrafo.

    Package: beta
    Description-md5: 00000000000000000000000000000002
    Description-it: Libreria beta
     Un solo paragrafo.
     .
     Un paragrafo in più.

    Package: gamma
    Description-md5: 00000000000000000000000000000003
    Description-it: Gioco gamma
     Paragrafo uno.
     .
     Paragrafo due.

    Package: gamma-data
    Description-md5: 00000000000000000000000000000004
    Description-it: Gioco gamma
     Paragrafo uno.

    Package: delta
    Description-md5: 00000000000000000000000000000099
    Description-it: Delta senza inglese
    """
)


def parse(text: str, lang: str) -> dict[str, debian.Description]:
    return dict(debian.parse_translation(text.split("\n"), lang))


# ----------------------------------------------------------------------------------------------- parsing


def test_parse_splits_short_description_and_paragraphs_normalising_whitespace():
    docs = parse(EN, "en")
    alpha = docs["00000000000000000000000000000001"]
    assert alpha.package == "alpha"
    # short, 3 paragraphs; the list paragraph keeps its index but is empty (left out when pairing)
    assert alpha.segments == (
        "Alpha tool",
        "First paragraph, wrapped over two lines.",
        "Second paragraph.",
        "",
        "Last paragraph.",
    )
    assert docs["00000000000000000000000000000002"].segments == ("Beta library", "Only one paragraph.")


@pytest.mark.parametrize(
    ("body", "segments"),
    [
        ([], ("Short",)),
        (["a", "b"], ("Short", "a b")),
        (["a", ".", "b"], ("Short", "a", "b")),
        (["a", ".", " . ", "b"], ("Short", "a", "", "b")),  # an empty paragraph keeps its index
        (["* item", "* item"], ("Short", "")),  # list items
        (["- item"], ("Short", "")),
        (["intro", "  code"], ("Short", "")),  # verbatim (indented) line
        (["-based word", "*nix"], ("Short", "-based word *nix")),  # not list items
        (["\u00a0a\u2028b\tc"], ("Short", "a b c")),  # Unicode whitespace normalised
    ],
)
def test_split_description(body, segments):
    assert debian.split_description("  Short ", body) == segments


def test_parse_keeps_nbsp_only_line_inside_the_stanza():
    # A translator's " \u00a0" line is a continuation line, not the end of the stanza.
    text = "Package: p\nDescription-md5: m\nDescription-fr: court\n un\n \u00a0\n deux\n .\n trois\n"
    assert parse(text, "fr")["m"].segments == ("court", "un deux", "trois")


def test_parse_ignores_other_fields_and_stanzas_without_description():
    text = (
        "Package: p\nDescription-md5: m\nX-Other: x\n continued\nDescription-de: kurz\n lang\n\nPackage: q\n"
    )
    assert parse(text, "de") == {"m": debian.Description("p", ("kurz", "lang"))}


def test_pair_descriptions_drops_mismatched_paragraph_counts_and_empty_segments():
    rows, stats = corpus.pair_descriptions(parse(EN, "en"), parse(IT, "it"))
    texts = [(r[1][-1], r[2], r[3]) for r in rows]
    assert texts == [
        ("1", "Alpha tool", "Strumento alfa"),
        ("1", "First paragraph, wrapped over two lines.", "Primo paragrafo, su due righe."),
        ("1", "Second paragraph.", "Secondo paragrafo."),
        ("1", "Last paragraph.", "Ultimo paragrafo."),
        ("3", "Gamma game", "Gioco gamma"),
        ("3", "Para one.", "Paragrafo uno."),
        ("3", "Para two.", "Paragrafo due."),
        ("4", "Gamma game", "Gioco gamma"),
        ("4", "Para one.", "Paragrafo uno."),
    ]
    assert [r[0] for r in rows] == list(range(len(rows)))
    assert stats["paragraphs_mismatch"] == 1  # beta: 1 vs 2 paragraphs
    assert stats["no_pivot"] == 1  # delta has no English description
    assert stats["descriptions_paired"] == 3


def test_deduplicate_keeps_first_pair():
    rows, _ = corpus.pair_descriptions(parse(EN, "en"), parse(IT, "it"))
    unique = corpus.deduplicate(rows)
    assert len(unique) == len(rows) - 2
    assert [r[0] for r in unique] == [0, 1, 2, 3, 4, 5, 6]  # gamma-data's two pairs repeat gamma's


# ----------------------------------------------------------------------------------------------- splitting


def synthetic_rows(n_docs: int = 300) -> list[corpus.Row]:
    """Documents of 1-5 pairs; some texts recur across documents (with other partners), as in Debian."""
    rows = []
    for d in range(n_docs):
        for s in range(1 + d % 5):
            src = f"shared source {d % 7}" if s == 0 else f"src {d}.{s}"
            tgt = f"shared target {d % 11}" if s == 1 else f"tgt {d}.{s}"
            rows.append((len(rows), f"doc{d}", src, tgt))
    return corpus.deduplicate(rows)


def test_split_has_no_document_or_text_leak_and_reaches_the_sizes():
    rows = synthetic_rows()
    splits, stats = corpus.split_rows(rows, dev_size=60, test_size=50, seed=3)
    docs = {s: {r[1] for r in splits[s]} for s in SPLITS}
    texts = {s: {t for r in splits[s] for t in r[2:]} for s in SPLITS}
    for a, b in [("train", "dev"), ("train", "test"), ("dev", "test")]:
        assert not docs[a] & docs[b], (a, b)
        assert not texts[a] & texts[b], (a, b)
    assert 50 <= len(splits["test"]) < 50 + 5  # whole documents: overshoot by less than one document
    assert 60 <= len(splits["dev"]) < 60 + 5
    assert stats["train_dropped_overlap"] > 0  # the shared texts did collide
    kept = sum(len(v) for v in splits.values())
    assert kept + stats["train_dropped_overlap"] + stats["dev_dropped_overlap"] == len(rows)
    for s in SPLITS:
        assert [r[0] for r in splits[s]] == sorted(r[0] for r in splits[s])


def test_split_is_deterministic_and_depends_on_the_seed():
    rows = synthetic_rows()
    a, _ = corpus.split_rows(rows, dev_size=30, test_size=30, seed=0)
    b, _ = corpus.split_rows(list(rows), dev_size=30, test_size=30, seed=0)
    c, _ = corpus.split_rows(rows, dev_size=30, test_size=30, seed=1)
    assert a == b
    assert {r[1] for r in a["test"]} != {r[1] for r in c["test"]}


def test_split_deterministic_across_processes():
    # sha256, not Python's salted hash(): another interpreter (another PYTHONHASHSEED) gives the same split
    code = (
        "from fastvocab.tasks.corpus import split_rows\n"
        "rows = [(i, f'd{i // 2}', f's{i}', f't{i}') for i in range(200)]\n"
        "print(sorted({r[1] for r in split_rows(rows, dev_size=10, test_size=10, seed=5)[0]['test']}))\n"
    )
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_split_with_zero_held_out_sizes_puts_everything_in_train():
    rows = synthetic_rows(20)
    splits, _ = corpus.split_rows(rows, dev_size=0, test_size=0, seed=0)
    assert splits["train"] == sorted(rows) and not splits["dev"] and not splits["test"]


def _reference_split(rows, dev_size, test_size, seed):
    """The split of the module docstring, written plainly in memory: the oracle of the streamed one."""
    import hashlib

    seen, unique = set(), []
    for row in rows:
        if (row[2], row[3]) not in seen:
            seen.add((row[2], row[3]))
            unique.append(row)
    docs = {}
    for row in unique:
        docs.setdefault(row[1], []).append(row)
    rank = lambda d: hashlib.sha256(f"{seed}\x00{d}".encode()).digest()  # noqa: E731
    order = iter(sorted(docs, key=lambda d: (rank(d), d)))
    held, out = set(), {"test": [], "dev": [], "train": []}
    for split, size in (("test", test_size), ("dev", dev_size)):
        while len(out[split]) < size and (doc := next(order, None)) is not None:
            out[split] += [r for r in docs[doc] if r[2] not in held and r[3] not in held]
        held |= {t for r in out[split] for t in r[2:]}
    for doc in order:
        out["train"] += [r for r in docs[doc] if r[2] not in held and r[3] not in held]
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("seed", range(6))
def test_streamed_split_equals_the_plain_one(seed):
    """Random documents whose texts recur a lot, so dev often needs more documents than first read."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(int(rng.integers(5, 200))):
        src, tgt = f"s{rng.integers(0, 25)}", f"t{rng.integers(0, 25)}"
        rows.append((i, f"doc{rng.integers(0, 40)}", src, tgt))
    dev, test = int(rng.integers(0, 15)), int(rng.integers(0, 15))
    got, _ = corpus.split_rows(rows, dev_size=dev, test_size=test, seed=seed)
    assert got == _reference_split(rows, dev, test, seed)


def test_parallel_import_streams_in_batches_with_the_same_files(tmp_path, switch):
    lines = [f"src {i % 17}\ttgt {i % 13}" for i in range(60)]
    tsv = tmp_path / "x.tsv"
    tsv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    kw = {"dev_size": 5, "test_size": 5}
    source = corpus_import.ParallelFile(tsv, "tsv")
    whole = corpus_import.import_parallel(tmp_path / "one", source, "de", "fr", **kw)
    switch(CORPUS_BATCH_ROWS=4)
    batched = corpus_import.import_parallel(tmp_path / "two", source, "de", "fr", **kw)
    assert batched.counts == whole.counts and batched.stats == whole.stats
    for split in SPLITS:
        one, two = (read_corpus_file(split_path(tmp_path / d, "de", "fr", split)) for d in ("one", "two"))
        assert one.equals(two) and one.num_rows == whole.counts[split]
    assert pq.ParquetFile(split_path(tmp_path / "two", "de", "fr", "train")).metadata.num_row_groups > 1


# ------------------------------------------------------------------------------------ CLI on fake apt lists


def many_descriptions(lang: str, n: int) -> str:
    word = {"en": "package", "it": "pacchetto", "fr": "paquet"}[lang]
    stanzas = []
    for i in range(n):
        paragraphs = [f" {word} {i} paragraph {p} text." for p in range(1 + i % 3)]
        body = "\n .\n".join(paragraphs)
        stanzas.append(
            f"Package: p{i}\nDescription-md5: {i + 1000:032x}\nDescription-{lang}: {word} {i} short\n{body}\n"
        )
    return "\n".join(stanzas)


@pytest.fixture
def lists_dir(tmp_path) -> Path:
    """A fake apt lists folder: main suite en (plain) + it (gzip) + fr (plain), and an updates suite."""
    d = tmp_path / "lists"
    d.mkdir()
    prefix = "mirror_debian_dists_bookworm"
    (d / f"{prefix}_main_i18n_Translation-en").write_text(many_descriptions("en", 60), encoding="utf-8")
    with gzip.open(d / f"{prefix}_main_i18n_Translation-it.gz", "wt", encoding="utf-8") as f:
        f.write(many_descriptions("it", 60))
    (d / f"{prefix}_main_i18n_Translation-fr").write_text(many_descriptions("fr", 40), encoding="utf-8")
    (d / "mirror_debian_dists_bookworm-updates_main_i18n_Translation-en").write_text(EN, encoding="utf-8")
    (d / f"{prefix}_InRelease").write_text("Origin: Debian\nSuite: stable\nCodename: bookworm\n\nMD5Sum:\n")
    return d


def run_cli(*argv: str) -> int:
    return main(["corpus", *[str(a) for a in argv]])


def test_cli_end_to_end_on_fake_lists(tmp_path, lists_dir, capsys):
    out = tmp_path / "corpus"
    args = [
        "--output",
        out,
        "--lists-dir",
        lists_dir,
        "--languages",
        "en,it,fr",
        "--dev-size",
        "10",
        "--test-size",
        "12",
    ]
    assert run_cli(*args) == 0
    printed = capsys.readouterr().out
    assert "en-it" in printed and "en-fr" in printed and "written" in printed
    manifest = json.loads((out / "corpus.json").read_text())
    assert manifest["languages"] == ["en", "fr", "it"]
    for lang, n_docs in [("it", 60), ("fr", 40)]:
        tables = {s: read_corpus_file(split_path(out, "en", lang, s)) for s in SPLITS}
        counts = {s: t.num_rows for s, t in tables.items()}
        record = manifest["pairs"][f"en-{lang}"]
        assert record["counts"] == counts
        # every description: short + 1-3 paragraphs, all distinct, none dropped
        assert sum(counts.values()) == sum(2 + i % 3 for i in range(n_docs)) == record["stats"]["pairs"]
        assert 12 <= counts["test"] <= 12 + 3 and 10 <= counts["dev"] <= 10 + 3
        assert tables["train"].schema.names == ["id", "doc_id", "text1", "text2"]
        row = tables["train"].slice(0, 1).to_pylist()[0]
        assert row["text1"].startswith("package") and row["text2"].split()[0] in ("pacchetto", "paquet")
        assert record["source"]["release"][0]["codename"] == "bookworm"
    # the updates suite's extra English descriptions are merged but have no translation: same counts
    _, src, tgt = read_direction(out, "it", "en", "test", limit=3)
    assert src[0].startswith("pacchetto") and tgt[0].startswith("package")


def test_cli_resume_force_and_seed(tmp_path, lists_dir, capsys):
    out = tmp_path / "corpus"
    base = [
        "--output",
        out,
        "--lists-dir",
        lists_dir,
        "--languages",
        "en,it",
        "--dev-size",
        "8",
        "--test-size",
        "8",
    ]
    files = [split_path(out, "en", "it", s) for s in SPLITS]
    assert run_cli(*base, "--seed", "1") == 0
    first = [f.read_bytes() for f in files]
    mtimes = [f.stat().st_mtime_ns for f in files]
    capsys.readouterr()
    assert run_cli(*base, "--seed", "1") == 0  # outputs exist and validate: nothing rebuilt
    assert "up to date" in capsys.readouterr().out
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    assert run_cli(*base, "--seed", "1", "--force") == 0
    assert "written" in capsys.readouterr().out
    assert [f.read_bytes() for f in files] == first  # same seed: same files
    assert run_cli(*base, "--seed", "2") == 0  # another seed is another build
    assert [f.read_bytes() for f in files] != first
    files[1].write_bytes(b"not parquet")  # a damaged output is rebuilt
    capsys.readouterr()
    assert run_cli(*base, "--seed", "2") == 0
    assert "written" in capsys.readouterr().out
    assert read_corpus_file(files[1]).num_rows > 0


def fake_apt_get(bin_dir: Path, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / "apt-get"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_cli_fetches_with_apt_get_when_the_lists_are_missing(tmp_path, lists_dir, monkeypatch, capsys):
    # The fake apt-get copies the fixture indexes into Dir::State::Lists and logs its arguments.
    log = tmp_path / "apt-args"
    fake_apt_get(
        tmp_path / "bin",
        f"""for a in "$@"; do echo "$a" >> {log}; case "$a" in Dir::State::Lists=*) d="${{a#*=}}";; esac; done
cp {lists_dir}/* "$d"/
""",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    out = tmp_path / "corpus"
    assert run_cli("--output", out, "--languages", "en,it", "--dev-size", "5", "--test-size", "5") == 0
    args = log.read_text().split("\n")
    assert "Acquire::Languages=en,it" in args and "update" in args
    assert f"Dir::State::Lists={(out / 'apt-lists').resolve()}" in args
    assert (out / "apt-lists" / "partial").is_dir()
    assert read_corpus_file(split_path(out, "en", "it", "train")).num_rows > 0


def test_cli_apt_get_failure_is_one_line(tmp_path, monkeypatch, capsys):
    fake_apt_get(
        tmp_path / "bin", 'echo "W: some warning" >&2; echo "E: Could not resolve the mirror" >&2; exit 100\n'
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    out = tmp_path / "corpus"
    assert run_cli("--output", out, "--languages", "en,it") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "apt-get update" in err and "E: Could not resolve the mirror" in err
    assert not (out / "en-it").exists()


def test_cli_without_apt_get_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert run_cli("--output", tmp_path / "corpus", "--languages", "en,it") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "apt-get not found" in err


def test_cli_missing_language_after_fetch(tmp_path, lists_dir, monkeypatch, capsys):
    fake_apt_get(tmp_path / "bin", "exit 0\n")  # "succeeds" but brings no Translation-pt
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    assert run_cli("--output", tmp_path / "c", "--lists-dir", lists_dir, "--languages", "en,pt") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no Translation-pt index" in err


@pytest.mark.skipif(
    not (Path("/usr/lib/apt/apt-helper").exists() and shutil.which("lz4")), reason="needs apt-helper and lz4"
)
def test_reads_lz4_indexes_through_apt_helper(tmp_path):
    plain = tmp_path / "x_dists_s_main_i18n_Translation-it"
    plain.write_text(IT, encoding="utf-8")
    packed = tmp_path / "y_dists_s_main_i18n_Translation-it.lz4"
    subprocess.run(["lz4", "-q", str(plain), str(packed)], check=True)
    assert debian.read_index_lines(packed) == debian.read_index_lines(plain)


# ----------------------------------------------------------------------------------------------- user data


def test_tsv_import_splits_and_stores_pivot_first(tmp_path, capsys):
    tsv = tmp_path / "data.tsv"
    lines = [f"frase  {i}\tsentence {i}" for i in range(50)] + ["frase 0\tsentence 0"]  # one duplicate
    tsv.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "corpus"
    argv = ["--output", out, "--from-tsv", tsv, "--src-lang", "it", "--tgt-lang", "en"]
    assert run_cli(*argv, "--dev-size", "5", "--test-size", "5") == 0
    tables = {s: read_corpus_file(split_path(out, "en", "it", s)).to_pylist() for s in SPLITS}
    assert sum(len(t) for t in tables.values()) == 50
    assert len(tables["test"]) == 5 and len(tables["dev"]) == 5
    row = next(r for r in tables["train"] if r["id"] == 2)
    assert row == {"id": 2, "doc_id": "2", "text1": "sentence 1", "text2": "frase 1"}  # id = line number
    _, src, tgt = read_direction(out, "it", "en", "train", limit=1)
    assert src[0].startswith("frase") and tgt[0].startswith("sentence")
    capsys.readouterr()
    assert run_cli(*argv, "--dev-size", "5", "--test-size", "5") == 0
    assert "up to date" in capsys.readouterr().out
    tsv.write_text("\n".join(lines[:40]) + "\n", encoding="utf-8")  # another input: rebuilt
    assert run_cli(*argv, "--dev-size", "5", "--test-size", "5") == 0
    assert "written" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("content", "line", "message"),
    [
        (b"a\tb\nbad \xff byte\tc\n", 2, "invalid UTF-8"),
        (b"a\tb\nno tab here\n", 2, "found 0 tabs"),
        (b"a\tb\nc\td\te\n", 2, "found 2 tabs"),
        (b"a\tb\n\n", 2, "found 0 tabs"),
        (b"\tb\n", 1, "empty first column"),
        (b"a\t \r\n", 1, "empty second column"),
    ],
)
def test_tsv_errors_are_one_line_naming_file_and_line(tmp_path, capsys, content, line, message):
    tsv = tmp_path / "bad.tsv"
    tsv.write_bytes(content)
    out = tmp_path / "corpus"
    assert run_cli("--output", out, "--from-tsv", tsv, "--src-lang", "en", "--tgt-lang", "it") != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{tsv}:{line}:" in err and message in err
    assert not out.exists()


def test_too_small_for_dev_and_test_is_an_error(tmp_path, capsys):
    tsv = tmp_path / "small.tsv"
    tsv.write_text("a\tb\nc\td\n", encoding="utf-8")
    assert run_cli("--output", tmp_path / "c", "--from-tsv", tsv, "--src-lang", "en", "--tgt-lang", "it") == 2
    assert "none left for train" in capsys.readouterr().err


def test_parquet_import_keeps_documents_whole(tmp_path):
    src = tmp_path / "in.parquet"
    n = 60
    pq.write_table(
        pa.table(
            {
                "de": [f"Satz {i}" for i in range(n)],
                "fr": [f"phrase {i}" for i in range(n)],
                "doc": [f"d{i // 4}" for i in range(n)],
            }
        ),
        src,
    )
    out = tmp_path / "corpus"
    argv = ["--output", out, "--from-parquet", src, "--src-lang", "de", "--tgt-lang", "fr", "--src-col", "de"]
    assert run_cli(*argv, "--tgt-col", "fr", "--doc-col", "doc", "--dev-size", "6", "--test-size", "6") == 0
    tables = {s: read_corpus_file(split_path(out, "de", "fr", s)).to_pylist() for s in SPLITS}
    assert len(tables["test"]) == 8 and len(tables["dev"]) == 8  # two documents of 4 rows each
    docs = {s: {r["doc_id"] for r in t} for s, t in tables.items()}
    assert not (docs["train"] & docs["test"] or docs["train"] & docs["dev"] or docs["dev"] & docs["test"])
    assert tables["train"][0]["text1"].startswith("Satz")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--src-col", "nope", "--tgt-col", "fr"], "no column 'nope'"),
        (["--src-col", "de"], "needs --tgt-col"),
        (["--src-col", "de", "--tgt-col", "n"], "is int64, not text"),
    ],
)
def test_parquet_import_errors(tmp_path, capsys, extra, message):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"de": ["a"], "fr": ["b"], "n": [1]}), src)
    argv = ["--output", tmp_path / "c", "--from-parquet", src, "--src-lang", "de", "--tgt-lang", "fr", *extra]
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_mono_import(tmp_path, capsys):
    text = tmp_path / "it.txt"
    text.write_text("Una frase.\n\n  Un'altra   frase. \nUna frase.\nTerza.\n", encoding="utf-8")
    out = tmp_path / "corpus"
    assert run_cli("--output", out, "--mono", text, "--lang", "it") == 0
    assert read_mono(out, "it") == ([1, 3, 5], ["Una frase.", "Un'altra frase.", "Terza."])
    manifest = json.loads((out / "corpus.json").read_text())
    assert manifest["mono"]["it"]["stats"] == {"lines": 5, "empty": 1, "duplicates_removed": 1}
    capsys.readouterr()
    assert run_cli("--output", out, "--mono", text, "--lang", "it") == 0
    assert "up to date" in capsys.readouterr().out
    with pytest.raises(Exception, match="no monolingual fr file"):
        read_mono(out, "fr")


def test_mono_import_streams_in_batches_with_the_same_result(tmp_path, switch):
    """Batches of 2 lines (duplicates across batches, an empty last batch) give what one batch gives."""

    lines = ["a b", "c", "", "a  b", "d", "c", "e", "f"]
    text = tmp_path / "x.txt"
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    whole = corpus_import.import_mono(tmp_path / "one", text, "it")
    switch(CORPUS_BATCH_ROWS=2)
    batched = corpus_import.import_mono(tmp_path / "two", text, "it")
    assert read_mono(tmp_path / "two", "it") == read_mono(tmp_path / "one", "it")
    assert read_mono(tmp_path / "two", "it") == ([1, 2, 5, 7, 8], ["a b", "c", "d", "e", "f"])
    assert batched.stats == whole.stats == {"lines": 8, "empty": 1, "duplicates_removed": 2}
    assert pq.ParquetFile(mono_path(tmp_path / "two", "it")).metadata.num_row_groups == 3


def test_mono_bad_utf8_is_an_error(tmp_path, capsys):
    text = tmp_path / "bad.txt"
    text.write_bytes(b"ok\n\xc3\x28\n")
    assert run_cli("--output", tmp_path / "c", "--mono", text, "--lang", "it") == 2
    err = capsys.readouterr().err.strip()
    assert f"{text}:2: invalid UTF-8" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--from-tsv", "x.tsv", "--src-lang", "en", "--tgt-lang", "it", "--languages", "en,it"],
            "--languages",
        ),
        (["--from-tsv", "x.tsv", "--src-lang", "en"], "needs --tgt-lang"),
        (["--mono", "x.txt"], "needs --lang"),
        (["--lang", "it"], "--lang cannot be used with the Debian corpus"),
        (["--languages", "en,it;rm"], "invalid language code"),
        (["--languages", "en"], "no languages besides the pivot"),
        (["--dev-size", "-1"], "corpus.dev_size"),
    ],
)
def test_cli_flag_errors(tmp_path, capsys, argv, message):
    assert run_cli("--output", tmp_path / "c", *argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_mono_pt_reads_the_brazilian_descriptions_too(tmp_path):
    from fastvocab.tasks.corpus import write_debian_mono

    lists = tmp_path / "lists"
    lists.mkdir()
    prefix = "mirror_debian_dists_bookworm_main_i18n_Translation-"

    def index(lang, texts):
        return "\n".join(
            f"Package: p{i}\nDescription-md5: {i + 1000:032x}\nDescription-{lang}: {t}\n"
            for i, t in enumerate(texts)
        )

    (lists / f"{prefix}pt").write_text(index("pt", ["um editor", "uma biblioteca"]), encoding="utf-8")
    # the same description in both, and one only Brazilian: each distinct text once, pt's first
    (lists / f"{prefix}pt%5fBR").write_text(index("pt_BR", ["um editor", "uma ferramenta"]), encoding="utf-8")
    result = write_debian_mono(tmp_path / "corpus", lists, "pt")
    assert read_mono(tmp_path / "corpus", "pt")[1] == ["um editor", "uma biblioteca", "uma ferramenta"]
    assert result.stats == {"descriptions": 4, "segments": 4, "duplicates_removed": 1}
    assert write_debian_mono(tmp_path / "corpus", lists, "pt").skipped
