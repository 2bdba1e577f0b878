"""``fastvocab.Translator``: the Python API gives the CLI's outputs, loads once, and refuses in one line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fastvocab
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.pipeline import translator as translator_module
from fastvocab.pipeline.cli import main
from fastvocab.pipeline.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "models" / "demo"
MAPS = ROOT / "models" / "demo-maps"

pytestmark = pytest.mark.skipif(
    not (DEMO / "config.json").exists() or not (MAPS / "en-it").is_dir(),
    reason="models/demo or models/demo-maps is not built",
)

LINES = [
    "Free software for everyone.",
    "",
    "The package manager installs the library.",
    "   ",
    "A tool for the network server.",
    "Software libero per tutti.",
]
# (compute_type, maps) and the CLI's flags for the same
SETUPS = {
    "full-float32": (("float32", None), ()),
    "clustered-int8": (("int8", MAPS), ("--clusters", str(MAPS), "--dtype", "int8")),
}


@pytest.fixture(autouse=True)
def _torch_threads():
    """A Translator's ``threads`` is torch's, for the whole process: what a test sets ends with it."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def translators():
    made = {
        name: fastvocab.Translator(DEMO, maps=maps, compute_type=dtype)
        for name, ((dtype, maps), _) in SETUPS.items()
    }
    yield made
    for t in made.values():
        t.close()


@pytest.fixture(scope="module")
def cli_outputs(tmp_path_factory) -> dict[str, str]:
    """``fastvocab translate -i -o`` of LINES in each set-up: the text the API must reproduce."""
    tmp = tmp_path_factory.mktemp("cli")
    inp = tmp / "in.txt"
    inp.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    outputs = {}
    for name, (_, flags) in SETUPS.items():
        out = tmp / f"{name}.txt"
        argv = ["translate", "--model", str(DEMO), "--src-lang", "en", "--tgt-lang", "it"]
        assert main([*argv, "-i", str(inp), "-o", str(out), "--no-progress", *flags]) == 0
        outputs[name] = out.read_text(encoding="utf-8")
    return outputs


def _text(hypotheses: list[str]) -> str:
    return "".join(h + "\n" for h in hypotheses)


@pytest.mark.parametrize("name", SETUPS)
def test_translate_batch_gives_the_cli_outputs(translators, cli_outputs, name):
    got = translators[name].translate_batch(LINES, "en", "it")
    assert len(got) == len(LINES)
    assert [h for line, h in zip(LINES, got, strict=True) if not line.strip()] == ["", ""]
    assert all(h.strip() for line, h in zip(LINES, got, strict=True) if line.strip())
    assert _text(got) == cli_outputs[name]


def test_maps_decode_with_the_shortlist_tables_beside_them(translators):
    """The CLI's rule: maps imply the clustered method, and the tables beside them join the sets."""
    t = translators["clustered-int8"]
    t.translate_batch(LINES[:1], "en", "it")
    assert t.method == "clustered"
    (method,) = t._methods.values()
    assert Path(method.options.cluster_map) == MAPS / "en-it"
    assert Path(method.options.shortlist) == MAPS / "shortlist" / "en-it"
    assert translators["full-float32"].method == "full"


def test_a_second_call_reuses_the_projection_and_its_workers(monkeypatch):
    built = []
    real = translator_module.method_projection

    def counted(*args, **kwargs):
        built.append(args[1].method)
        return real(*args, **kwargs)

    monkeypatch.setattr(translator_module, "method_projection", counted)
    # two threads, one line a batch: the call decodes beside a forked worker that the pool keeps
    with fastvocab.Translator(DEMO, maps=MAPS, threads=2) as t:
        first = t.translate_batch(LINES, "en", "it", batch_size=1)
        (method,) = t._methods.values()
        projection, executor = method.projection, method.pool._executor
        assert executor is not None
        monkeypatch.setattr(Seq2SeqAdapter, "load", _refused_load)  # no model loads again
        assert t.translate_batch(LINES, "en", "it", batch_size=1) == first
        (again,) = t._methods.values()
        assert again.projection is projection and again.pool._executor is executor
        assert built == ["clustered"]
        # another direction is another map: a projection of its own, kept beside the first
        t.translate_batch(["Il gestore di pacchetti."], "it", "en")
        assert built == ["clustered", "clustered"] and len(t._methods) == 2
    assert all(m.pool._executor is None for m in t._methods.values())  # close() ended the workers


def test_the_full_projection_serves_every_direction(monkeypatch, translators):
    t = translators["full-float32"]
    t.translate_batch(LINES[:1], "en", "it")
    monkeypatch.setattr(translator_module, "method_projection", _refused)
    assert t.translate_batch(["Software libero per tutti."], "it", "en")[0].strip()
    assert len(t._methods) == 1


# a clustered union's columns depend on which lines share a batch: only parts cut as the CLI's were (one, at
# its default size) give its text; the full projection's outputs do not depend on the cut
@pytest.mark.parametrize(
    ("name", "chunk_lines", "parts"), [("full-float32", 4, 2), ("clustered-int8", None, 1)]
)
def test_translate_file_writes_the_cli_text_without_loading_again(
    translators, cli_outputs, tmp_path, monkeypatch, name, chunk_lines, parts
):
    inp, out = tmp_path / "in.txt", tmp_path / "sub" / "out.txt"
    inp.write_text("".join(line + "\n" for line in LINES), encoding="utf-8")
    monkeypatch.setattr(Seq2SeqAdapter, "load", _refused_load)  # the job decodes with the Translator's model
    cut = {} if chunk_lines is None else {"chunk_lines": chunk_lines}
    result = translators[name].translate_file(inp, out, "en", "it", **cut)
    assert out.read_text(encoding="utf-8") == cli_outputs[name]
    assert (result.lines, result.parts, result.parts_translated) == (len(LINES), parts, parts)
    assert result.params["method"] == translators[name].method
    assert not (tmp_path / "sub" / "out.txt.parts").exists()


def test_refusals_are_one_line(translators, monkeypatch):
    t = translators["full-float32"]
    with pytest.raises(UserError, match=r"unknown language 'xx' for model .*valid: .*en") as unknown:
        t.translate_batch(["Free software."], "xx", "it")
    with pytest.raises(UserError, match="both en"):
        t.translate_batch(["Free software."], "en", "en")
    with pytest.raises(UserError, match="one string"):
        t.translate_batch("Free software.", "en", "it")
    with pytest.raises(UserError, match="beam_size must be >= 1, got 0"):
        t.translate_batch(["Free software."], "en", "it", beam_size=0)
    monkeypatch.setattr(Seq2SeqAdapter, "load", _refused_load)  # refused before the model loads
    with pytest.raises(UserError, match=r"compute_type must be one of float32, .*int8; got 'int4'") as dtype:
        fastvocab.Translator(DEMO, compute_type="int4")
    with pytest.raises(UserError, match="compute_type int8 runs on CPU only") as device:
        fastvocab.Translator(DEMO, compute_type="int8", device="cuda")
    for exc in (unknown, dtype, device):
        assert "\n" not in str(exc.value)


def test_a_map_of_another_direction_is_refused():
    with fastvocab.Translator(DEMO, maps=MAPS / "en-it") as one_map:
        with pytest.raises(ArtifactError, match="was built for en-it, not it-en") as exc:
            one_map.translate_batch(["Il gestore di pacchetti."], "it", "en")
        assert "\n" not in str(exc.value)
        assert not one_map._methods  # nothing built for the refused direction
        assert one_map.translate_batch(["Free software."], "en", "it")[0].strip()  # its own direction decodes


def test_import_fastvocab_stays_light():
    code = (
        "import sys, fastvocab\n"
        "assert 'torch' not in sys.modules and 'fastvocab.pipeline' not in sys.modules, sorted(sys.modules)\n"
        "from fastvocab.pipeline.translator import Translator\n"
        "assert fastvocab.Translator is Translator\n"
        "try:\n"
        "    fastvocab.Nothing\n"
        "except AttributeError as exc:\n"
        "    print(exc)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "has no attribute 'Nothing'" in res.stdout


@classmethod  # type: ignore[misc]  # stands in for Seq2SeqAdapter.load, a classmethod
def _refused_load(cls, *args, **kwargs):
    raise AssertionError("a model loaded again")


def _refused(*args, **kwargs):
    raise AssertionError("built again")
