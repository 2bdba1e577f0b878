"""``fastvocab eval`` reads what ``fastvocab translate`` writes, in each of its forms, with no column flag:
a text file, a Parquet file and a dataset folder (``-o DIR/``) hold the same translations, in input order;
a file from before the column had one name (``hypothesis``) is read too."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fastvocab.artifacts_schema.translations import TRANSLATIONS_SCHEMA
from fastvocab.pipeline.cli import main
from tests.conftest import synthetic_sentences


@pytest.fixture(scope="module")
def outputs(tiny_model_dir, tmp_path_factory):
    """translate's text, Parquet and dataset outputs of one input (parts of 4 lines: several parts)."""
    root = tmp_path_factory.mktemp("outputs")
    inp = root / "in.txt"
    lines = synthetic_sentences("en", 10, seed=7)
    inp.write_text("".join(f"{x}\n" for x in lines), encoding="utf-8")
    argv = [
        "translate",
        "--model",
        str(tiny_model_dir),
        "--src-lang",
        "en",
        "--tgt-lang",
        "it",
        "-i",
        str(inp),
    ]
    argv += ["--max-len", "6", "--chunk-lines", "4", "--no-progress"]
    for out in ("out.txt", "out.parquet", "out/"):
        assert main([*argv, "-o", f"{root}/{out}"]) == 0
    return root


def _eval(capsys, hyp, ref) -> dict:
    capsys.readouterr()
    assert main(["eval", "--hyp", str(hyp), "--ref", str(ref), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("form", ["out.parquet", "out"])
def test_eval_reads_translate_parquet_and_dataset_outputs_by_default(outputs, capsys, form):
    assert "translation" in pq.read_schema(outputs / "out.parquet").names
    result = _eval(capsys, outputs / form, outputs / "out.txt")
    assert result["sentences"] == 10 and result["chrf"] == pytest.approx(100.0)


def test_eval_still_reads_the_earlier_hypothesis_column(outputs, capsys, tmp_path):
    table = pq.read_table(outputs / "out.parquet")
    old = tmp_path / "old.parquet"
    schema = TRANSLATIONS_SCHEMA.set(3, pa.field("hypothesis", pa.string(), nullable=False))
    pq.write_table(pa.Table.from_arrays(table.columns, schema=schema), old)
    result = _eval(capsys, old, outputs / "out.txt")
    assert result["sentences"] == 10 and result["chrf"] == pytest.approx(100.0)
