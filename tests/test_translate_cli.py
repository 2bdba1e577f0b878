"""``fastvocab translate`` / ``fastvocab eval`` and the task functions behind them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import synthetic_sentences

from fastvocab.artifacts_schema.translations import TRANSLATIONS_SCHEMA
from fastvocab.decoding import Seq2SeqAdapter
from fastvocab.pipeline.cli import main
from fastvocab.tasks.decode_pool import DecodePool
from fastvocab.tasks.evaluate import score, search_error_rate
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.translate import SearchSettings, translate

MAX_LEN = 6


@pytest.fixture(scope="module")
def model_dir(spread_model_dir):
    return spread_model_dir


@pytest.fixture(scope="module")
def adapter(model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(model_dir)


def _lines() -> list[str]:
    s = synthetic_sentences("en", 7, seed=11)
    return [s[0], "", s[1], "   ", s[2], s[3], "", s[4], s[5], s[6], "\t"]


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _translate_args(model_dir, inp, out, *extra: str) -> list[str]:
    return [
        "translate",
        "--model",
        str(model_dir),
        "--src-lang",
        "en",
        "--tgt-lang",
        "it",
        "-i",
        str(inp),
        "-o",
        str(out),
        "--max-len",
        str(MAX_LEN),
        *extra,
    ]


# --------------------------------------------------------------------------- task functions


def test_translate_keeps_order_and_empty_lines(adapter):
    lines = _lines()
    proj = make_projection(adapter, "full")
    got = translate(
        adapter, proj, lines, "en", "it", SearchSettings(batch_size=3, max_len=MAX_LEN), progress=False
    ).hypotheses
    assert len(got) == len(lines)
    assert all(hyp == "" for line, hyp in zip(lines, got, strict=True) if not line.strip())
    # each line on its own gives the same output: sorting by length and batching restored the order
    alone = [
        translate(
            adapter, proj, [line], "en", "it", SearchSettings(max_len=MAX_LEN), progress=False
        ).hypotheses[0]
        for line in lines
    ]
    assert got == alone
    assert len({h for h in got if h}) > 2  # outputs differ by source, so the order check means something


def test_length_batches_split_off_a_source_far_longer_than_the_rest():
    from fastvocab.tasks.translate import SPLIT_ABOVE_TOKENS, length_batches

    lengths = [229, 120, 100, 90, 51, 50, 49, 30, 20, 16, 12, 9, 3]
    got = length_batches(lengths, 4)
    assert [i for b in got for i in b] == list(range(len(lengths)))  # every line once, in order
    assert all(1 <= len(b) <= 4 for b in got)
    assert got[:3] == [[0, 1], [2, 3, 4, 5], [6, 7]]  # 100 < 229/2 ends the first; 20 < 49/2 the third
    # sources of at most SPLIT_ABOVE_TOKENS never split: a batch of them is cheap however they spread
    short = [SPLIT_ABOVE_TOKENS, 9, 3, 1]
    assert length_batches(short, 4) == [[0, 1, 2, 3]]
    assert length_batches([], 4) == []


def test_translate_with_a_far_longer_line_keeps_every_output(adapter):
    """A line several times longer than the others decodes in a batch of its own, with the same outputs."""
    lines = _lines()
    long_line = " ".join(line for line in lines if line.strip())
    proj = make_projection(adapter, "full")
    search = SearchSettings(batch_size=8, max_len=MAX_LEN, max_input_tokens=1024)
    got = translate(adapter, proj, [*lines, long_line], "en", "it", search, progress=False).hypotheses
    alone = translate(adapter, proj, [long_line], "en", "it", search, progress=False).hypotheses
    assert (
        got[-1] == alone[0]
        and got[:-1] == translate(adapter, proj, lines, "en", "it", search, progress=False).hypotheses
    )


@pytest.mark.parametrize("parallel", ["processes", "threads"])
@pytest.mark.parametrize("beam", [1, 3])
def test_translate_workers_do_not_change_outputs(adapter, beam, parallel):
    """Batches decoded by parallel workers (CPU): the same outputs, in input order, as one at a time."""
    lines = _lines()
    proj = make_projection(adapter, "full")
    search = SearchSettings(beam=beam, batch_size=2, max_len=MAX_LEN)
    threads = torch.get_num_threads()
    one = translate(adapter, proj, lines, "en", "it", search, workers=1, progress=False)
    with DecodePool(adapter, proj, 3, parallel) as pool:
        three = translate(adapter, proj, lines, "en", "it", search, progress=False, pool=pool)
    assert three.hypotheses == one.hypotheses and three.target_tokens == one.target_tokens
    assert len({h for h in one.hypotheses if h}) > 2
    assert torch.get_num_threads() == threads  # a worker's thread setting does not leak


def test_caller_decodes_beside_its_forked_worker(adapter, monkeypatch, tmp_path):
    """Two worker processes are this process and one fork: both decode batches, and the outputs come back
    in input order, as one worker's."""
    import os

    import fastvocab.tasks.decode_pool as dp

    real, log = dp.decode, tmp_path / "pids"

    def logged(*args, **kwargs):
        with log.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    lines = [x for x in _lines() if x.strip()] * 3
    proj = make_projection(adapter, "full")
    search = SearchSettings(batch_size=1, max_len=MAX_LEN)
    one = translate(adapter, proj, lines, "en", "it", search, workers=1, progress=False)
    monkeypatch.setattr(dp, "decode", logged)
    with DecodePool(adapter, proj, 2, "processes") as pool:
        two = translate(adapter, proj, lines, "en", "it", search, progress=False, pool=pool)
    assert two.hypotheses == one.hypotheses
    pids = log.read_text().split()
    assert len(pids) == len(lines) and str(os.getpid()) in pids and len(set(pids)) == 2


def test_worker_processes_add_their_counts_to_the_callers_projection(adapter, tmp_path):
    """What forked workers count (a clustered projection's rows and columns, the timed steps) reaches the
    caller's projection: the same counts as one worker's."""
    ids = list(range(0, adapter.n_vocab, 3))
    _save_map(adapter, tmp_path / "maps", [ids[: len(ids) // 2], ids[len(ids) // 3 :], ids])
    lines = _lines()
    kw = dict(search=SearchSettings(batch_size=2, max_len=MAX_LEN), progress=False)
    tallies = []
    for parallel in ("processes", "threads"):
        proj = make_projection(adapter, "clustered", cluster_map=tmp_path / "maps" / "en-it")
        proj.time_steps()
        one = translate(adapter, proj, lines, "en", "it", workers=1, **kw)
        tallies.append(proj.tally())
        proj.time_steps()
        proj.reset_counters()
        with DecodePool(adapter, proj, 2, parallel) as pool:
            two = translate(adapter, proj, lines, "en", "it", pool=pool, **kw)
        assert two.hypotheses == one.hypotheses
        tallies.append(proj.tally())
    for t in tallies[1:]:
        assert {k: v for k, v in t.items() if k != "step_seconds"} == {
            k: v for k, v in tallies[0].items() if k != "step_seconds"
        }
        assert t["step_seconds"] > 0
    assert tallies[0]["rows"] > len(lines) and tallies[0]["columns"] > tallies[0]["rows"]


def test_worker_kind_forks_on_linux_only(monkeypatch):
    from fastvocab.tasks.decode_pool import worker_kind

    assert worker_kind("auto", 1) == worker_kind("processes", 1) == "one"
    assert worker_kind("threads", 2) == "threads" and worker_kind("processes", 2) == "processes"
    monkeypatch.setattr(sys, "platform", "linux")
    assert worker_kind("auto", 2) == "processes"
    # ONNX Runtime's step releases the GIL for its whole call: threads from 32 rows a batch
    assert (
        worker_kind("auto", 2, "onnx", 32) == "threads"
        and worker_kind("auto", 2, "static", 32) == "processes"
    )
    assert (
        worker_kind("auto", 2, "onnx", 8) == "processes"
        and worker_kind("processes", 2, "onnx", 32) == "processes"
    )
    monkeypatch.setattr(sys, "platform", "darwin")  # fork is unsafe there
    assert worker_kind("auto", 2) == "threads"


def _children(pid: int) -> list[int]:
    from pathlib import Path

    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        if int(fields[1]) == pid:  # the field after the state is the parent's pid
            kids.append(int(stat.parent.name))
    return kids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_worker_processes_end_with_a_killed_parent(model_dir):
    """kill -9 of a translating process takes its forked workers with it (they would otherwise wait on the
    pool's queue for ever). Three workers: this process and two forks."""
    import signal
    import time

    script = f"""
import time
import fastvocab.tasks.decode_pool as dp
import fastvocab.tasks.translate as tr
from fastvocab.decoding import Seq2SeqAdapter
from fastvocab.tasks.decode_pool import DecodePool
from fastvocab.tasks.projections import make_projection
adapter = Seq2SeqAdapter.load({str(model_dir)!r})
dp.decode = lambda *a, **k: time.sleep(120)  # a batch that lasts
proj = make_projection(adapter, "full")
pool = DecodePool(adapter, proj, 3, "processes")
tr.translate(adapter, proj, ["a b", "c d", "e f", "g h"], "en", "it", tr.SearchSettings(batch_size=1),
             progress=False, pool=pool)
"""
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        deadline = time.monotonic() + 90
        while len(kids := _children(proc.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(kids) == 2, "the workers did not start"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
        deadline = time.monotonic() + 20
        while (alive := [k for k in kids if Path(f"/proc/{k}").exists()]) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert alive == []
    finally:
        proc.kill()


@pytest.mark.parametrize("parallel", ["processes", "threads"])
def test_translate_worker_error_propagates(adapter, monkeypatch, parallel):
    import fastvocab.tasks.decode_pool as dp

    real = dp.decode

    def failing(adapter_, projection, batch, *args, **kwargs):
        if batch["input_ids"].shape[0] == 1:  # the last, short batch
            raise MemoryError("static decoder cache does not fit")
        return real(adapter_, projection, batch, *args, **kwargs)

    monkeypatch.setattr(dp, "decode", failing)
    lines = [x for x in _lines() if x.strip()][:5]
    proj = make_projection(adapter, "full")
    with pytest.raises(MemoryError, match="does not fit"), DecodePool(adapter, proj, 2, parallel) as pool:
        translate(
            adapter, proj, lines, "en", "it", SearchSettings(batch_size=2, max_len=MAX_LEN), progress=False,
            pool=pool,
        )  # fmt: skip


def test_translate_beam_and_errors(adapter):
    proj = make_projection(adapter, "full")
    lines = _lines()
    search = SearchSettings(beam=3, max_len=MAX_LEN)
    beam = translate(adapter, proj, lines, "en", "it", search, progress=False).hypotheses
    assert len(beam) == len(lines) and any(beam)
    assert beam == [
        translate(adapter, proj, [x], "en", "it", search, progress=False).hypotheses[0] for x in lines
    ]
    assert all(h == "" for line, h in zip(lines, beam, strict=True) if not line.strip())
    assert translate(adapter, proj, [], "en", "it", progress=False).hypotheses == []
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        translate(adapter, proj, lines, "xx", "it", progress=False)
    long_line = " ".join(["package"] * 50)
    with pytest.raises(ValueError, match=r"line 3 has \d+ tokens, more than max_input_tokens=20"):
        translate(
            adapter,
            proj,
            ["a", "", long_line],
            "en",
            "it",
            SearchSettings(max_input_tokens=20),
            progress=False,
        )


def test_score_and_search_error_rate():
    refs = ["the package for the network", "a library tool", "data file system"]
    perfect = score(refs, refs)
    assert perfect["bleu"] == pytest.approx(100.0) and perfect["chrf"] == pytest.approx(100.0)
    assert perfect["signatures"]["bleu"].startswith("nrefs:1|") and "tok:13a" in perfect["signatures"]["bleu"]
    assert perfect["signatures"]["chrf"].startswith("nrefs:1|")
    worse = score(["the package for a network", "a library", "data file system"], refs)
    assert 0 < worse["bleu"] < 100 and 0 < worse["chrf"] < 100
    assert search_error_rate(["a", "b", "c"], ["a", "x", "c"]) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="3 hypotheses but 2"):
        score(refs, refs[:2])


# --------------------------------------------------------------------------- the commands


def test_cli_text_round_trip(model_dir, adapter, tmp_path, capsys):
    lines = _lines()
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc, _, err = _cli(capsys, *_translate_args(model_dir, inp, out, "--batch-size", "4"))
    assert rc == 0
    got = out.read_text(encoding="utf-8").split("\n")
    assert got[-1] == "" and len(got) == len(lines) + 1  # one output line per input line
    expect = translate(
        adapter, make_projection(adapter), lines, "en", "it", SearchSettings(max_len=MAX_LEN), progress=False
    ).hypotheses
    assert got[:-1] == expect
    assert "translated 11 lines (7 non-empty" in err and "sentences/s" in err


def test_cli_beam(model_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("\n".join(_lines()), encoding="utf-8")  # no final newline
    rc, _, _ = _cli(capsys, *_translate_args(model_dir, inp, out, "--beam", "2", "--length-penalty", "0.8"))
    assert rc == 0 and len(out.read_text(encoding="utf-8").splitlines()) == len(_lines())


@pytest.mark.parametrize("beam", ["1", "2"])
def test_cli_graphs_on_equals_off(model_dir, tmp_path, capsys, monkeypatch, beam):
    """``--graphs on`` runs the captured stepper (on CPU its fixed-shape step eagerly): the same lines as
    ``off``; ``auto`` is the eager one on CPU; an unknown choice is refused by the parser."""
    import fastvocab.tasks.decode_pool as task

    seen, real = [], task.decode

    def recording(*a, **kw):
        seen.append(kw["graphs"])
        return real(*a, **kw)

    monkeypatch.setattr(task, "decode", recording)
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(_lines()) + "\n", encoding="utf-8")
    outs = {}
    for choice in ("off", "on", "auto"):
        outs[choice] = tmp_path / f"{choice}.txt"
        args = _translate_args(model_dir, inp, outs[choice], "--beam", beam, "--graphs", choice)
        assert _cli(capsys, *args)[0] == 0
        assert seen and set(seen) == {choice == "on"}
        seen.clear()
    text = outs["off"].read_text(encoding="utf-8")
    assert any(text.splitlines())
    assert outs["on"].read_text(encoding="utf-8") == text == outs["auto"].read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        main(_translate_args(model_dir, inp, tmp_path / "x.txt", "--graphs", "always"))


def test_pipeline_translate_graphs_key():
    """The translate stage's ``graphs`` key reaches the search settings its workers decode with."""
    from pydantic import ValidationError

    from fastvocab.pipeline.config import TranslateConfig

    assert TranslateConfig().search().graphs == "auto"
    assert TranslateConfig(graphs="on").search().graphs == "on"
    with pytest.raises(ValidationError):
        TranslateConfig(graphs="always")


@pytest.mark.parametrize(("flag", "rule"), [("true", True), ("never", "never"), ("model", None)])
def test_cli_early_stopping_reaches_the_search(model_dir, tmp_path, capsys, monkeypatch, flag, rule):
    import fastvocab.tasks.decode_pool as task

    seen, real = [], task.decode

    def recording(*a, **kw):
        seen.append(a[5].early_stopping)  # the search settings
        return real(*a, **kw)

    monkeypatch.setattr(task, "decode", recording)
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("\n".join(_lines()), encoding="utf-8")
    rc, _, _ = _cli(capsys, *_translate_args(model_dir, inp, out, "--beam", "2", "--early-stopping", flag))
    assert rc == 0 and seen and set(seen) == {rule}


def test_cli_early_stopping_refuses_an_unknown_rule(model_dir, tmp_path, capsys):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("the package\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exc:
        _cli(capsys, *_translate_args(model_dir, inp, out, "--early-stopping", "sometimes"))
    assert exc.value.code == 2
    assert "'sometimes': choose from model, true, false, never" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("content", "flags", "message"),
    [
        (b"fine line\nbad \xff byte\n", (), r"in\.txt: line 2: invalid UTF-8"),
        (b"the package\n", ("--tgt-lang", "xx"), r"unknown language 'xx' for model"),
        (b"the package\n" + b"package " * 40 + b"\n", ("--max-input-tokens", "16"), r"line 2 has \d+ tokens"),
    ],
    ids=["invalid-utf8", "unknown-language", "too-long"],
)
def test_cli_errors_leave_no_output(model_dir, tmp_path, capsys, content, flags, message):
    import re

    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_bytes(content)
    rc, _, err = _cli(capsys, *_translate_args(model_dir, inp, out), *flags)
    assert rc != 0
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
    assert err.startswith("fastvocab translate: error:")
    assert not out.exists()
    assert list(tmp_path.iterdir()) == [inp]  # no temporary files left either


def test_cli_invalid_utf8_exit_code_in_a_real_process(tmp_path):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_bytes(b"ok\n\xc3\x28 broken\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastvocab.pipeline.cli",
            "translate",
            "--model",
            str(tmp_path / "m"),
            "--src-lang",
            "en",
            "--tgt-lang",
            "it",
            "-i",
            str(inp),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        f"fastvocab translate: error: {inp}: line 2: invalid UTF-8 (byte 0xc3 at column 1)"
    ]
    assert not out.exists()


def test_cli_parquet_round_trip(model_dir, adapter, tmp_path, capsys):
    lines = _lines()
    ids = [100 + 7 * i for i in range(len(lines))]
    dataset = tmp_path / "dataset"
    dataset.mkdir()
    half = len(lines) // 2  # a dataset folder of two files
    for k, (lo, hi) in enumerate([(0, half), (half, len(lines))]):
        pq.write_table(
            pa.table({"id": ids[lo:hi], "source": lines[lo:hi], "other": [0] * (hi - lo)}),
            dataset / f"part-{k}.parquet",
        )
    out = tmp_path / "out.parquet"
    rc, _, _ = _cli(capsys, *_translate_args(model_dir, dataset, out, "--batch-size", "2"))
    assert rc == 0
    table = pq.read_table(out)
    assert table.schema.equals(TRANSLATIONS_SCHEMA)
    assert table.column("id").to_pylist() == ids
    assert table.column("source").to_pylist() == lines
    assert set(table.column("direction").to_pylist()) == {"en-it"}
    assert set(table.column("method").to_pylist()) == {"full"}
    expect = translate(
        adapter, make_projection(adapter), lines, "en", "it", SearchSettings(max_len=MAX_LEN), progress=False
    ).hypotheses
    assert table.column("translation").to_pylist() == expect

    # a single Parquet file in, text out: a `text` column needs no flag; no text column is a one-line error
    # naming the columns found and the flag
    single = tmp_path / "single.parquet"
    pq.write_table(pa.table({"text": lines}), single)
    txt = tmp_path / "out.txt"
    rc, _, _ = _cli(capsys, *_translate_args(model_dir, single, txt))
    assert rc == 0 and txt.read_text(encoding="utf-8").splitlines() == expect
    other = tmp_path / "other.parquet"
    pq.write_table(pa.table({"sentence": lines}), other)
    rc, _, err = _cli(capsys, *_translate_args(model_dir, other, tmp_path / "o.txt"))
    assert rc == 2 and "(columns: sentence); name one with --input-column" in err
    assert not (tmp_path / "o.txt").exists()
    rc, _, _ = _cli(capsys, *_translate_args(model_dir, other, txt, "--input-column", "sentence"))
    assert rc == 0 and txt.read_text(encoding="utf-8").splitlines() == expect

    # eval reads the Parquet hypotheses; scoring them against themselves is perfect
    refs = tmp_path / "refs.txt"
    refs.write_text("\n".join(expect) + "\n", encoding="utf-8")
    rc, stdout, _ = _cli(
        capsys, "eval", "--hyp", str(out), "--ref", str(refs), "--json", "--baseline", str(txt)
    )
    assert rc == 0
    result = json.loads(stdout)
    assert result["bleu"] == pytest.approx(100.0) and result["search_error_rate"] == 0.0


def test_cli_eval(tmp_path, capsys):
    hyp, ref = tmp_path / "hyp.txt", tmp_path / "ref.txt"
    hyp.write_text("the package for a network\na library\ndata file system\n", encoding="utf-8")
    ref.write_text("the package for the network\na library tool\ndata file system\n", encoding="utf-8")
    rc, stdout, _ = _cli(capsys, "eval", "--hyp", str(hyp), "--ref", str(ref))
    assert rc == 0
    bleu_line, chrf_line = stdout.strip().splitlines()
    expect = score(hyp.read_text().splitlines(), ref.read_text().splitlines())
    assert bleu_line == f"BLEU = {expect['bleu']:.2f}  {expect['signatures']['bleu']}"
    assert chrf_line == f"chrF = {expect['chrf']:.2f}  {expect['signatures']['chrf']}"
    short = tmp_path / "short.txt"
    short.write_text("one line\n", encoding="utf-8")
    rc, _, err = _cli(capsys, "eval", "--hyp", str(hyp), "--ref", str(short))
    assert rc == 2 and "3 lines" in err and "1" in err and len(err.strip().splitlines()) == 1


def _save_map(
    adapter: Seq2SeqAdapter, root, ids_per_cluster: list[list[int]], fingerprint: str | None = None
):
    """A cluster map folder ``<root>/en-it`` with random centroids and the given active ids per cluster."""
    import numpy as np

    from fastvocab.artifacts_schema.cluster_map import ClusterMap, MapManifest, save_cluster_map

    r = len(ids_per_cluster)
    centroids = np.random.default_rng(0).standard_normal((r, adapter.d_model)).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in ids_per_cluster])]).astype(np.int64)
    indices = np.concatenate([np.asarray(sorted(x), dtype=np.int32) for x in ids_per_cluster])
    manifest = MapManifest(
        model_fingerprint=fingerprint or adapter.fingerprint,
        direction="en-it",
        scope="direction",
        r=r,
        k=1,
        d=adapter.d_model,
        n_vocab=adapter.n_vocab,
        niter=1,
        seed=0,
        states_used=0,
    )
    cmap = ClusterMap(
        manifest, centroids, (centroids**2).sum(1), indptr, indices, np.ones(len(indices), dtype=np.int32)
    )
    return save_cluster_map(cmap, root / "en-it")


@pytest.mark.parametrize("mode", ["union", "per-row"])
def test_cli_clustered_method(model_dir, adapter, tmp_path, capsys, mode):
    """Every id active in every cluster: the clustered method must reproduce the full output exactly."""
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(_lines()) + "\n", encoding="utf-8")
    full_out, clu_out, small_out = tmp_path / "full.txt", tmp_path / "clu.txt", tmp_path / "small.txt"
    assert _cli(capsys, *_translate_args(model_dir, inp, full_out, "--beam", "2"))[0] == 0
    everything = list(range(adapter.n_vocab))
    maps = tmp_path / "maps"
    _save_map(adapter, maps, [everything, everything, everything])
    flags = ("--beam", "2", "--method", "clustered", "--clusters", str(maps), "--selection", mode)
    assert _cli(capsys, *_translate_args(model_dir, inp, clu_out, *flags))[0] == 0
    assert clu_out.read_text(encoding="utf-8") == full_out.read_text(encoding="utf-8")

    # few active ids (different per cluster): outputs change, lines stay aligned, empty lines stay empty
    small = tmp_path / "small_maps"
    _save_map(adapter, small, [list(range(4, 40)), list(range(40, 80)), list(range(80, 120))])
    flags = ("--method", "clustered", "--clusters", str(small), "--selection", mode)
    assert _cli(capsys, *_translate_args(model_dir, inp, small_out, *flags))[0] == 0
    got = small_out.read_text(encoding="utf-8").splitlines()
    assert len(got) == len(_lines())
    assert all(h == "" for line, h in zip(_lines(), got, strict=True) if not line.strip())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--method", "full", "--probes", "2"),
            "--clusters and --probes apply to --method clustered, not --method full",
        ),
        (("--method", "clustered", "--probes", "0"), "--probes must be an integer >= 1, got 0"),
        (("--method", "clustered", "--probes", "2", "--selection", "per-row"), "--probes > 1 needs union"),
    ],
    ids=["not-clustered", "zero", "per-row"],
)
def test_cli_probes_refusals(model_dir, adapter, tmp_path, capsys, flags, message):
    from fastvocab.pipeline.config import TranslateConfig

    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("the package\n", encoding="utf-8")
    maps = tmp_path / "maps"
    _save_map(adapter, maps, [list(range(adapter.n_vocab))])
    rc, _, err = _cli(capsys, *_translate_args(model_dir, inp, out, "--clusters", str(maps), *flags))
    assert rc != 0 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    with pytest.raises(ValueError, match="probes > 1 needs union selection"):
        TranslateConfig(probes=2, selection="per-row")


def test_cli_clustered_map_applies_in_another_dtype(model_dir, adapter, tmp_path, capsys):
    """A map built from the float32 load (as the pipeline builds them) serves ``--dtype bfloat16`` too."""
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("the package\n", encoding="utf-8")
    maps = tmp_path / "maps"
    _save_map(adapter, maps, [list(range(adapter.n_vocab))])
    flags = ("--method", "clustered", "--clusters", str(maps), "--dtype", "bfloat16")
    rc, _, err = _cli(capsys, *_translate_args(model_dir, inp, out, *flags))
    assert rc == 0, err
    assert len(out.read_text(encoding="utf-8").splitlines()) == 1


def test_cli_clustered_refuses_foreign_or_missing_map(model_dir, adapter, tmp_path, capsys):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("the package\n", encoding="utf-8")
    maps = tmp_path / "maps"
    _save_map(adapter, maps, [list(range(adapter.n_vocab))], fingerprint="sha256:other:N1:d1")
    rc, _, err = _cli(
        capsys, *_translate_args(model_dir, inp, out, "--method", "clustered", "--clusters", str(maps))
    )
    assert rc == 2 and "was built for model sha256:other" in err and not out.exists()
    rc, _, err = _cli(capsys, *_translate_args(model_dir, inp, out, "--method", "clustered"))
    assert rc == 2 and "needs --clusters" in err and not out.exists()
    # a folder without maps (tmp_path itself counts as a work dir: its maps/ holds the foreign map)
    (tmp_path / "empty").mkdir()
    rc, _, err = _cli(
        capsys,
        *_translate_args(model_dir, inp, out, "--method", "clustered", "--clusters", str(tmp_path / "empty")),
    )
    assert rc == 2 and "no cluster map for en-it" in err and not out.exists()


DEMO = Path(__file__).resolve().parents[1] / "models"


def test_clusters_imply_the_method_and_the_tables_beside_the_maps(tmp_path, capsys):
    """The shipped maps decode with their shortlist tables unless told not to: without them, "PolyglotMan -
    Reverse compile man pages" came out as "tikziseiseise des pages de manuel en direct" (en-fr).
    ``--clusters`` alone is the fast path; a map folder named directly finds the tables in its parent's
    ``shortlist/``."""
    inp = tmp_path / "in.txt"
    inp.write_text("Free Software for everyone.\nPolyglotMan - Reverse compile man pages\nThe manager.\n")

    def run(name: str, *flags: str) -> tuple[str, str]:
        out = tmp_path / f"{name}.txt"
        argv = ["translate", "--model", str(DEMO / "demo"), "--src-lang", "en", "--tgt-lang", "fr"]
        rc, _, err = _cli(capsys, *argv, "-i", str(inp), "-o", str(out), "--no-progress", *flags)
        assert rc == 0, err
        return out.read_text(encoding="utf-8"), err

    maps = str(DEMO / "demo-maps")
    told, _ = run("told", "--method", "clustered", "--clusters", maps, "--with-shortlist", maps)
    implied, err = run("implied", "--clusters", maps)
    assert implied == told and "[clustered, beam 1" in err, err
    assert run("direct", "--clusters", f"{maps}/en-fr")[0] == told
    alone, err = run("alone", "--clusters", maps, "--no-shortlist")
    assert "warning: --no-shortlist: decoding without the shortlist tables beside the maps" in err, err
    assert alone != told  # what the tables are for: these lines change without them


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--method", "full", "--clusters", "M"),
            "--clusters applies to --method clustered, not --method full",
        ),
        (("--no-shortlist",), "--no-shortlist applies to --method clustered, not --method full"),
        (
            ("--clusters", "M", "--no-shortlist", "--with-shortlist", "M"),
            "--no-shortlist and --with-shortlist",
        ),
    ],
    ids=["clusters-with-full", "no-shortlist-with-full", "both"],
)
def test_flags_of_another_method_are_refused(tmp_path, capsys, flags, message):
    inp, out = tmp_path / "in.txt", tmp_path / "out.txt"
    inp.write_text("the package\n", encoding="utf-8")
    flags = tuple(str(DEMO / "demo-maps") if f == "M" else f for f in flags)
    argv = ["translate", "--model", str(DEMO / "demo"), "--src-lang", "en", "--tgt-lang", "it"]
    rc, _, err = _cli(capsys, *argv, "-i", str(inp), "-o", str(out), *flags)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ((), {"inactive_mass": "none"}),  # greedy reads logits only
        (("--beam", "4"), {"inactive_mass": "normaliser"}),  # the measured best for beam search
        (("--beam", "4", "--inactive-mass", "moments"), {"inactive_mass": "moments"}),
        (("--beam", "4", "--exact"), {"inactive_mass": "normaliser", "exact_k": 8}),
        (("--exact",), {"inactive_mass": "none", "exact_k": 1}),
        (("--probes", "1"), {"inactive_mass": "none", "probes": 1}),  # unset: the map's own
        (("--beam", "4", "--probes", "3"), {"inactive_mass": "normaliser", "probes": 3}),
    ],
)
def test_cli_inactive_mass_auto_and_exact_options(adapter, tmp_path, flags, want):
    """What the translate flags hand the clustered projection; the pipeline's translate section makes the
    same options."""
    from fastvocab.pipeline.cli import build_parser
    from fastvocab.pipeline.commands.translate import _check_args
    from fastvocab.pipeline.config import TranslateConfig

    maps = tmp_path / "maps"
    _save_map(adapter, maps, [list(range(adapter.n_vocab))])
    argv = [
        "translate",
        "--src-lang",
        "en",
        "--tgt-lang",
        "it",
        "-i",
        "x",
        "-o",
        "y",
        "--method",
        "clustered",
    ]
    args = build_parser("translate").parse_args([*argv, "--clusters", str(maps), *flags])
    options = _check_args(args)  # the map folder resolved, as translate does before the job
    got = options.projection_kwargs(args.beam)
    assert got == {"cluster_map": maps / "en-it", "selection": "union", **want}
    cfg = TranslateConfig(
        beam=args.beam,
        inactive_mass=args.inactive_mass or "auto",
        exact=bool(args.exact),
        probes=args.probes,
    )
    assert cfg.clustered(maps / "en-it") == options


# -------------------------------------------------------------------------- long inputs: parts and resume


def _stream(model_dir, inp, out, chunk_lines=3, beam=1, graphs="auto"):
    """``fastvocab translate``'s run of a text file in this process, in parts of ``chunk_lines`` lines."""
    from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk

    search = SearchSettings(beam=beam, batch_size=4, max_len=MAX_LEN, graphs=graphs)
    request = BulkRequest(
        str(inp), str(out), model_dir, "en", "it", search=search, lines_per_part=chunk_lines
    )
    return run_bulk(request, progress=False)


@pytest.fixture
def long_input(adapter, tmp_path):
    lines = _lines()
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    expect = translate(
        adapter,
        make_projection(adapter),
        lines,
        "en",
        "it",
        SearchSettings(batch_size=4, max_len=MAX_LEN),
        progress=False,
    ).hypotheses
    return inp, expect


def test_parts_give_the_whole_file_translation_in_order(model_dir, long_input, tmp_path):
    inp, expect = long_input
    out = tmp_path / "out.txt"
    res = _stream(model_dir, inp, out, chunk_lines=3)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expect
    assert res.sentences == 7 and res.parts == 4 and not (tmp_path / "out.txt.parts").exists()
    _stream(model_dir, inp, tmp_path / "out.parquet")
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.equals(TRANSLATIONS_SCHEMA, check_metadata=False)
    assert table.column("id").to_pylist() == list(range(len(expect)))
    assert table.column("translation").to_pylist() == expect


def test_a_killed_run_resumes_after_its_last_finished_part(model_dir, long_input, tmp_path, monkeypatch):
    from fastvocab.artifacts_schema.bulk_parts import part_file
    from fastvocab.tasks import translate_job as task

    inp, expect = long_input
    out = tmp_path / "out.txt"
    parts = tmp_path / "out.txt.parts"
    calls = []
    real = task.translate

    def dies_on_third_part(*args, **kwargs):
        calls.append(len(args[2]))
        if len(calls) == 3:
            raise KeyboardInterrupt  # what a kill leaves: the parts before, nothing after
        return real(*args, **kwargs)

    monkeypatch.setattr(task, "translate", dies_on_third_part)
    with pytest.raises(KeyboardInterrupt):
        _stream(model_dir, inp, out)
    assert not out.exists() and sorted(p.name for p in parts.iterdir()) == [
        "part-00000.parquet",
        "part-00001.parquet",
    ]
    calls.clear()
    monkeypatch.setattr(task, "translate", lambda *a, **k: calls.append(len(a[2])) or real(*a, **k))
    # A part whose translations no longer match their digest is redone, not reused.
    first = pq.read_table(part_file(parts, 0))
    bad = first.set_column(2, "translation", pa.array(["x"] * first.num_rows)).replace_schema_metadata(
        first.schema.metadata
    )
    pq.write_table(bad, part_file(parts, 0))
    # resumed with the steps run another way (--graphs): how a step runs is not part of a part's plan
    resumed = _stream(model_dir, inp, out, graphs="on")
    assert calls == [3, 3, 2]  # parts 0 (corrupt), 2 and 3; part 1 reused
    assert resumed.corrupt_redone == ["part-00000.parquet"] and resumed.parts_reused == 1
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expect
    calls.clear()
    _stream(model_dir, inp, out, beam=2)  # other settings: nothing reused
    assert calls == [3, 3, 3, 2]


def test_cli_chunked_equals_unchunked(model_dir, long_input, tmp_path, capsys):
    inp, expect = long_input
    out = tmp_path / "out.txt"
    rc, _, err = _cli(
        capsys, *_translate_args(model_dir, inp, out, "--batch-size", "4", "--chunk-lines", "2")
    )
    assert rc == 0, err
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == expect
