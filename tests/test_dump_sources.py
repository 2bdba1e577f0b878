"""A direction's dump input: sources in order, de-duplicated, no dev or test line, rebuilt only on change."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastvocab.artifacts_schema.corpus import CORPUS_SCHEMA, MONO_SCHEMA, mono_path, split_path
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.tasks.dump_sources import build_sources


def _pair(corpus, lang1, lang2, split, pairs):
    path = split_path(corpus, lang1, lang2, split)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = list(zip(*pairs, strict=True)) if pairs else [[], []]
    table = pa.table(
        {
            "id": list(range(len(pairs))),
            "doc_id": [f"d{i}" for i in range(len(pairs))],
            "text1": list(rows[0]),
            "text2": list(rows[1]),
        },
        schema=CORPUS_SCHEMA,
    )
    pq.write_table(table, path)


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    _pair(root, "en", "it", "train", [("a cat", "un gatto"), ("a dog", "un cane"), ("a cat", "il gatto")])
    _pair(root, "en", "it", "dev", [("the dev line", "la riga dev")])
    _pair(root, "en", "it", "test", [("the test line", "la riga di test")])
    _pair(root, "en", "fr", "train", [("a dog", "un chien"), ("a bird", "un oiseau")])
    mono = mono_path(root, "en")
    mono.parent.mkdir(parents=True)
    lines = ["a fish", "the  test   line", "", "a cat", "a fish", "the dev line", "a cow"]
    pq.write_table(pa.table({"id": list(range(len(lines))), "text": lines}, schema=MONO_SCHEMA), mono)
    return root


def test_sources_in_order_without_repeats_or_held_out_lines(corpus, tmp_path):
    out = tmp_path / "sources" / "en-it.parquet"
    user = tmp_path / "user.txt"
    user.write_text("a horse\n\na cat\nthe test line\n", encoding="utf-8")
    result = build_sources(corpus, "en-it", ["train", "pairs", "mono", str(user)], out)
    rows = pq.read_table(out).to_pylist()
    assert [r["text"] for r in rows] == ["a cat", "a dog", "a bird", "a fish", "a cow", "a horse"]
    assert [r["id"] for r in rows] == list(range(6))
    # the train lines carry their reference (the first copy's); the others none
    assert [r["reference"] for r in rows] == ["un gatto", "un cane", None, None, None, None]
    assert [r["origin"] for r in rows] == ["train", "train", "pairs:en-fr", "mono", "mono", str(user)]
    assert (result.rows, result.with_reference) == (6, 2)
    # every dev or test line is dropped and counted, whitespace or not, wherever it came from
    assert result.stats["mono"] == {"lines": 7, "empty": 1, "held_out": 2, "duplicates": 2, "kept": 2}
    assert result.stats[str(user)]["held_out"] == 1 and result.held_out == 3
    assert result.stats["train"] == {"lines": 3, "empty": 0, "held_out": 0, "duplicates": 1, "kept": 2}

    # current: not rebuilt; a changed input: rebuilt
    mtime = out.stat().st_mtime_ns
    assert build_sources(corpus, "en-it", ["train", "pairs", "mono", str(user)], out).skipped
    assert out.stat().st_mtime_ns == mtime
    user.write_text("a horse\na zebra\n", encoding="utf-8")
    again = build_sources(corpus, "en-it", ["train", "pairs", "mono", str(user)], out)
    assert not again.skipped and again.rows == 7


def test_the_reverse_direction_reads_the_other_column(corpus, tmp_path):
    result = build_sources(corpus, "it-en", ["train"], tmp_path / "it-en.parquet")
    rows = pq.read_table(tmp_path / "it-en.parquet").to_pylist()
    assert [(r["text"], r["reference"]) for r in rows] == [
        ("un gatto", "a cat"),
        ("un cane", "a dog"),
        ("il gatto", "a cat"),
    ]
    assert result.held_out == 0


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        (["mono"], r"no monolingual it file .*--mono-debian"),
        (["no/such/file.txt"], r"dump source 'no/such/file.txt': input file not found"),
    ],
)
def test_a_missing_source_is_a_one_line_error(corpus, tmp_path, entries, message):
    with pytest.raises(ArtifactError, match=message):
        build_sources(corpus, "it-en", entries, tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_invalid_utf8_names_the_file_and_line_and_writes_nothing(corpus, tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff oops\n")
    with pytest.raises(ArtifactError, match=r"bad\.txt: line 2: invalid UTF-8"):
        build_sources(corpus, "en-it", ["train", str(bad)], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_sources_that_hold_only_held_out_lines_are_an_error(corpus, tmp_path):
    only_test = tmp_path / "t.txt"
    only_test.write_text("the test line\nthe dev line\n", encoding="utf-8")
    with pytest.raises(ArtifactError, match="no line outside dev and test"):
        build_sources(corpus, "en-it", [str(only_test)], tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_config_refuses_dev_and_test_as_sources():
    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.errors import UserError

    with pytest.raises(UserError, match="'test' is held out"):
        load_config(None, {"dump.sources": ["train", "test"]})


def test_catalogs_source_reads_references_and_holds_out_its_dev_and_test(corpus, tmp_path):
    catalogs = tmp_path / "catalogs"
    _pair(
        catalogs, "en", "it", "train", [("Open file", "Apri file"), ("the dev line", "x"), ("a cat", "gatto")]
    )
    _pair(catalogs, "en", "it", "dev", [("Save file", "Salva file")])
    _pair(catalogs, "en", "it", "test", [("Quit", "Esci")])
    # the catalogs' held-out messages appear in the other sources: they must never reach the dump input
    _pair(corpus, "en", "fr", "train", [("Quit", "Quitter"), ("a bird", "un oiseau")])
    out = tmp_path / "it-en.parquet"
    built = build_sources(corpus, "it-en", ["train", "catalogs"], out, catalogs_dir=catalogs)
    assert (built.rows, built.with_reference) == (6, 6)
    rows = pq.read_table(out).to_pylist()
    # it-en reads the en-it pairs swapped: the Italian side is the source, the English its reference
    assert [(r["text"], r["reference"], r["origin"]) for r in rows] == [
        ("un gatto", "a cat", "train"),
        ("un cane", "a dog", "train"),
        ("il gatto", "a cat", "train"),
        ("Apri file", "Open file", "catalogs"),
        ("x", "the dev line", "catalogs"),
        ("gatto", "a cat", "catalogs"),
    ]
    en = build_sources(
        corpus, "en-it", ["catalogs", "pairs"], tmp_path / "en-it.parquet", catalogs_dir=catalogs
    )
    texts = [r["text"] for r in pq.read_table(tmp_path / "en-it.parquet").to_pylist()]
    assert texts == ["Open file", "a cat", "a bird"]  # description dev line, catalog test line: held out
    assert en.stats["catalogs"]["held_out"] == 1 and en.stats["pairs:en-fr"]["held_out"] == 1
    # the catalogs' dev and test files are part of the record: a changed held-out split rebuilds the input
    _pair(catalogs, "en", "it", "test", [("Quit", "Esci"), ("a bird", "un uccello")])
    again = build_sources(
        corpus, "en-it", ["catalogs", "pairs"], tmp_path / "en-it.parquet", catalogs_dir=catalogs
    )
    assert not again.skipped and again.rows == 2


def test_catalogs_source_needs_its_folder(corpus, tmp_path):
    with pytest.raises(ArtifactError, match="catalog corpus"):
        build_sources(corpus, "en-it", ["train", "catalogs"], tmp_path / "out.parquet")
    with pytest.raises(ArtifactError, match=r"en-it|it-en|train"):
        build_sources(corpus, "en-it", ["catalogs"], tmp_path / "out.parquet", catalogs_dir=tmp_path / "none")
