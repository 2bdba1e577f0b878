"""Translation in row-range parts (every ``fastvocab translate``, the pipeline's ``bulk`` stage), on Ray
actors or in-process: each part what ``translate`` makes of its lines, the same on Ray as in this process,
resumable after any kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import synthetic_sentences

from fastvocab.artifacts_schema.bulk_parts import MANIFEST, METHOD_KEY, PLAN_KEY, part_file
from fastvocab.decoding import Seq2SeqAdapter
from fastvocab.kernels.clustered_parts import ClusteredOptions
from fastvocab.kernels.full import FullOptions
from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk
from fastvocab.pipeline.errors import UserError
from fastvocab.tasks.projections import make_projection, method_projection
from fastvocab.tasks.translate import SearchSettings, translate
from fastvocab.tasks.translate_job import TranslateWorker

MAX_LEN = 6
SEARCH = SearchSettings(batch_size=4, max_len=MAX_LEN)


@pytest.fixture(scope="module")
def model_dir(spread_model_dir):
    return spread_model_dir


@pytest.fixture(scope="module")
def adapter(model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(model_dir)


def _lines(n: int = 23) -> list[str]:
    lines = synthetic_sentences("en", n, seed=5)
    lines[3] = ""  # an empty line stays an empty output, in its place
    return lines


def _expect(adapter, lines, beam=1, projection=None):
    projection = projection or make_projection(adapter)
    return translate(
        adapter, projection, lines, "en", "it", replace(SEARCH, beam=beam), progress=False
    ).hypotheses


def _request(model_dir, inp, out, **kw) -> BulkRequest:
    kw.setdefault("search", SEARCH)
    kw.setdefault("lines_per_part", 5)
    return BulkRequest(str(inp), str(out), model_dir, "en", "it", **kw)


def _write_text(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# ------------------------------------------------------------------------- in-process: inputs and outputs


def test_string_id_parquet_dataset_of_three_files_needs_no_flags(model_dir, adapter, tmp_path):
    """A hive-partitioned dataset of 3 files with string ids and a ``text`` column: a dataset of parts whose
    ids, sources and translations follow the files' order, the method in each part's metadata."""
    lines = _lines(14)
    ids = [f"doc-{i:03d}" for i in range(len(lines))]
    data = tmp_path / "data"
    bounds = [(0, 5), (5, 9), (9, 14)]
    for k, (lo, hi) in enumerate(bounds):
        folder = data / f"shard={k}"
        folder.mkdir(parents=True)
        pq.write_table(pa.table({"id": ids[lo:hi], "text": lines[lo:hi]}), folder / "part.parquet")
    out = tmp_path / "out"
    # -o out (no trailing /) names a text file, which would drop the string ids: refused with the hint
    with pytest.raises(
        UserError,
        match=r"is a text file, which keeps no ids: the input's string ids \(column "
        r"'id'\) would be lost; name a Parquet file \(out.parquet\) or a dataset folder \(out/\)",
    ):
        run_bulk(_request(model_dir, data, str(out), lines_per_part=3), progress=False)
    assert not out.exists() and not (tmp_path / "out.parts").exists()
    result = run_bulk(_request(model_dir, data, str(out) + "/", lines_per_part=3), progress=False)
    assert result.lines == 14 and result.parts == 2 + 2 + 2 and result.parts_translated == 6
    table = pq.read_schema(part_file(out, 0))
    assert table.field("id").type == pa.string() and table.metadata[METHOD_KEY] == b"full"
    got = pa.concat_tables([pq.read_table(part_file(out, i)) for i in range(6)])
    assert got.column("id").to_pylist() == ids
    assert got.column("source").to_pylist() == lines
    assert got.column("translation").to_pylist() == _expect(adapter, lines)
    assert (out / MANIFEST).is_file()
    # a dataset without a text column: one line naming the columns found and the flag
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.table({"id": [1], "sentence": ["a"]}), bad)
    with pytest.raises(UserError, match=r"no text column 'text' or 'source' \(columns: id, sentence\); name"):
        run_bulk(_request(model_dir, bad, str(tmp_path / "bad_out") + "/"), progress=False)
    assert not (tmp_path / "bad_out").exists()


def test_text_input_resumes_and_redoes_a_corrupt_part(model_dir, adapter, tmp_path, monkeypatch):
    lines = _lines()
    inp = _write_text(tmp_path / "in.txt", lines)
    out = tmp_path / "out"
    first = run_bulk(_request(model_dir, inp, str(out) + "/"), progress=False)
    assert first.parts == 5 and first.parts_translated == 5 and first.lines == 23
    plan = pq.read_schema(part_file(out, 0)).metadata[PLAN_KEY]
    assert b'"digest":"sha256:' in plan and b'"signature":"method:full|' in plan
    # damage part 2's translations: the rerun redoes it alone and names it
    t = pq.read_table(part_file(out, 2))
    bad = t.set_column(2, "translation", pa.array(["x"] * t.num_rows)).replace_schema_metadata(
        t.schema.metadata
    )
    pq.write_table(bad, part_file(out, 2))
    again = run_bulk(_request(model_dir, inp, str(out) + "/"), progress=False)
    assert (again.parts_translated, again.parts_reused) == (1, 4)
    assert again.corrupt_redone == ["part-00002.parquet"]
    got = pa.concat_tables([pq.read_table(part_file(out, i)) for i in range(5)])
    assert got.column("translation").to_pylist() == _expect(adapter, lines)
    assert got.column("id").to_pylist() == list(range(23))
    # the steps run another way (--graphs), with the same results: every part reused
    graphs = run_bulk(_request(model_dir, inp, str(out) + "/", search=replace(SEARCH, graphs="on")))
    assert (graphs.parts_translated, graphs.parts_reused) == (0, 5)
    # other search settings: every part redone
    beam = run_bulk(_request(model_dir, inp, str(out) + "/", search=SearchSettings(beam=2, max_len=MAX_LEN)))
    assert beam.parts_translated == 5


# ------------------------------------------------------------------------------------- on Ray actors


@pytest.fixture(scope="module")
def ray_session():
    import ray

    from fastvocab.pipeline.ray_session import RaySession

    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield RaySession(None, 2)
    if started:
        ray.shutdown()


def _cluster_map(adapter, root: Path) -> Path:
    """A map whose clusters keep a third of the vocabulary each: clustered outputs differ from full ones."""
    import numpy as np

    from fastvocab.artifacts_schema.cluster_map import ClusterMap, MapManifest, save_cluster_map

    n = adapter.n_vocab
    sets = [list(range(0, n // 2)), list(range(n // 3, n)), list(range(0, n, 2))]
    centroids = np.random.default_rng(0).standard_normal((3, adapter.d_model)).astype(np.float32)
    indptr = np.concatenate([[0], np.cumsum([len(x) for x in sets])]).astype(np.int64)
    indices = np.concatenate([np.asarray(x, dtype=np.int32) for x in sets])
    manifest = MapManifest(
        model_fingerprint=adapter.fingerprint,
        direction="en-it",
        scope="direction",
        r=3,
        k=1,
        d=adapter.d_model,
        n_vocab=n,
        niter=1,
        seed=0,
        states_used=0,
    )
    cmap = ClusterMap(
        manifest, centroids, (centroids**2).sum(1), indptr, indices, np.ones(len(indices), dtype=np.int32)
    )
    return save_cluster_map(cmap, root / "en-it")


def _by_range(adapter, inp, options=None, beam=1):
    """The text the parts must make of ``inp``: ``translate`` on each range of 5 lines, the parts' size, by
    itself (a clustered union's columns depend on which lines share a batch, so the ranges must be alike)."""
    lines = inp.read_text(encoding="utf-8").splitlines()
    projection = method_projection(adapter, options or FullOptions(), beam=beam)
    hypotheses = []
    for start in range(0, len(lines), 5):
        hypotheses += translate(
            adapter,
            projection,
            lines[start : start + 5],
            "en",
            "it",
            replace(SEARCH, beam=beam),
            progress=False,
        ).hypotheses
    return "".join(f"{h}\n" for h in hypotheses)


def test_parts_in_process_equal_translate_by_range_full_and_clustered_greedy_and_beam(
    model_dir, adapter, tmp_path
):
    inp = _write_text(tmp_path / "in.txt", _lines())
    map_dir = _cluster_map(adapter, tmp_path / "maps")
    outputs = {}
    for method in ("full", "clustered"):
        for beam in (1, 2):
            options = ClusteredOptions(map_dir) if method == "clustered" else FullOptions()
            search = SearchSettings(beam=beam, batch_size=4, max_len=MAX_LEN)
            out = tmp_path / f"{method}-{beam}.txt"
            req = _request(model_dir, inp, out, options=options, search=search)
            assert run_bulk(req, progress=False).parts_translated == 5
            outputs[method, beam] = out.read_text(encoding="utf-8")
            assert outputs[method, beam] == _by_range(adapter, inp, options, beam)
    assert outputs["clustered", 2] != outputs["full", 2]  # the map is used: the comparison can fail


class DiesOnce(TranslateWorker):
    """A worker whose process dies (SIGKILL) the first time it takes range 2."""

    marker = ""

    def translate_range(self, r, **kw):
        if r.index == 2 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().translate_range(r, **kw)


def test_two_ray_workers_one_killed_equal_translate_by_range(model_dir, adapter, tmp_path, ray_session):
    """Clustered, beam 2, on 2 actors pulling parts from one queue, one of them SIGKILLed as it takes a
    range: the range is retried on a new actor, each part is written once, and the text assembled from the
    parts is what the in-process run makes (``translate`` by range), line for line."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors run this module's class
    DiesOnce.marker = str(tmp_path / "died")
    inp = _write_text(tmp_path / "in.txt", _lines())
    options = ClusteredOptions(_cluster_map(adapter, tmp_path / "maps"))
    search = SearchSettings(beam=2, batch_size=4, max_len=MAX_LEN)
    out = tmp_path / "out.txt"
    req = _request(model_dir, inp, out, options=options, search=search, workers=2)
    result = run_bulk(req, ray=ray_session, progress=False, worker_cls=DiesOnce)
    assert Path(DiesOnce.marker).exists() and result.parts_retried == 1
    assert result.parts_translated == 5 and result.lines == 23 and result.tokens > 0  # each range once
    # the engine the actors decoded with ("auto" is static here: the suite's cache folder is not writable)
    assert result.params["engine"] == "static" and result.record().params["engine"] == "static"
    assert out.read_text(encoding="utf-8") == _by_range(adapter, inp, options, 2)
    assert not Path(str(out) + ".parts").exists()


class _NoRay:
    """Stands in for RaySession where a job must not start Ray."""

    def __init__(self, *a, **k):
        raise AssertionError("Ray was started")


def test_a_small_job_for_two_workers_runs_in_this_process_and_says_so(
    model_dir, tmp_path, capsys, monkeypatch
):
    """--workers 2 without --ray-address for an input below --min-ray-lines: decoded in this process (no
    Ray session made), with one line on standard error naming why and the flag that sends it to Ray."""
    import fastvocab.pipeline.ray_session

    monkeypatch.setattr(fastvocab.pipeline.ray_session, "RaySession", _NoRay)
    inp = _write_text(tmp_path / "in.txt", _lines(6))
    rc, err = _cli(capsys, model_dir, inp, tmp_path / "out.txt", "--workers", "2", "--min-ray-lines", "7")
    assert rc == 0, err
    said = [line for line in err.splitlines() if "decoding in this process" in line]
    assert said == [
        "6 lines: decoding in this process with 2 threads, faster than starting Ray for 2 workers "
        "(below 7 lines); --min-ray-lines 0 to use Ray anyway"
    ]
    assert ", 2 threads]" in err and "Ray worker" not in err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 6
    # at the threshold, or with a named cluster, Ray it is (RaySession refuses here: the job goes to it)
    for extra in (("--min-ray-lines", "6"), ("--ray-address", "local")):
        with pytest.raises(AssertionError, match="Ray was started"):
            _cli(capsys, model_dir, inp, tmp_path / "ray.txt", "--workers", "2", *extra)


def test_min_ray_lines_0_sends_a_small_job_to_ray(model_dir, tmp_path, capsys, ray_session):
    """--min-ray-lines 0: the same small job on Ray actors (the module's Ray, which the job's session
    reuses); the summary names the engine the actors ran, not "auto"."""
    inp = _write_text(tmp_path / "in.txt", _lines(6))
    rc, err = _cli(
        capsys, model_dir, inp, tmp_path / "out.txt", "--workers", "2", "--min-ray-lines", "0",
        "--chunk-lines", "3",
    )  # fmt: skip
    assert rc == 0, err
    assert "decoding in this process" not in err and " a worker, " in err and "used of 2]" in err
    # the suite's cache folder cannot be written (conftest): "auto" is the static engine, on Ray too
    assert ", engine static, " in err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 6


def test_parts_of_a_ray_run_and_of_an_in_process_run_resume_each_other(
    model_dir, adapter, tmp_path, ray_session
):
    """A Ray run's parts (some lost, as after a kill) are reused by a run in this process, which redoes only
    the missing ones, and the other way round; the dataset is what ``translate`` makes of the lines."""
    lines = _lines()
    inp = _write_text(tmp_path / "in.txt", lines)
    out = f"{tmp_path / 'out'}/"
    first = run_bulk(_request(model_dir, inp, out, workers=2), ray=ray_session, progress=False)
    assert first.on_ray and first.parts_translated == 5 and first.params["decoded_on"] == "ray"
    for i in (1, 3):
        part_file(out, i).unlink()
    here = run_bulk(_request(model_dir, inp, out, workers=2), progress=False)  # 23 lines: in this process
    assert not here.on_ray and (here.parts_reused, here.parts_translated) == (3, 2)
    for i in (0, 4):
        part_file(out, i).unlink()
    again = run_bulk(_request(model_dir, inp, out, workers=2), ray=ray_session, progress=False)
    assert again.on_ray and (again.parts_reused, again.parts_translated) == (3, 2)
    got = pa.concat_tables([pq.read_table(part_file(out, i)) for i in range(5)])
    assert got.column("translation").to_pylist() == _expect(adapter, lines)


DRIVER = """
import os, signal, sys
from pathlib import Path
from fastvocab.pipeline.bulk_driver import BulkRequest, run_bulk
from fastvocab.tasks.translate_job import TranslateWorker
from fastvocab.tasks.translate import SearchSettings

class KillsTheDriver(TranslateWorker):
    def translate_range(self, r, **kw):
        if r.index == 3:  # parts 0-2 are written: the driver dies, as under kill -9
            os.kill(os.getpid(), signal.SIGKILL)
        return super().translate_range(r, **kw)

inp, out, model = sys.argv[1:4]
req = BulkRequest(inp, out, Path(model), "en", "it", search=SearchSettings(batch_size=4, max_len=6),
                  lines_per_part=5)
run_bulk(req, progress=False, worker_cls=KillsTheDriver)
"""


def test_resume_after_sigkill_of_the_driver_retranslates_no_finished_part(model_dir, adapter, tmp_path):
    lines = _lines()
    inp = _write_text(tmp_path / "in.txt", lines)
    out = tmp_path / "out.txt"
    script = tmp_path / "driver.py"
    script.write_text(textwrap.dedent(DRIVER))
    proc = subprocess.run(
        [sys.executable, str(script), str(inp), str(out), str(model_dir)], capture_output=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    parts = Path(str(out) + ".parts")
    done = sorted(p.name for p in parts.glob("part-*.parquet"))
    assert done == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"] and not out.exists()
    seen: list[int] = []

    class Records(TranslateWorker):
        def translate_range(self, r, **kw):
            seen.append(r.index)
            return super().translate_range(r, **kw)

    rerun = run_bulk(_request(model_dir, inp, out), progress=False, worker_cls=Records)  # the same job
    assert seen == [3, 4] and (rerun.parts_reused, rerun.parts_translated) == (3, 2)
    assert out.read_text(encoding="utf-8").split("\n")[:-1] == _expect(adapter, lines)
    assert not parts.exists()


# ------------------------------------------------------------------------------- pipeline stage and MLflow


def test_bulk_stage_logs_one_mlflow_run_that_the_report_renders(model_dir, tmp_path, monkeypatch):
    from mlflow import MlflowClient

    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.report import write_report
    from fastvocab.pipeline.run import run_pipeline
    from fastvocab.pipeline.tracking import SAMPLE_TABLE, NullTracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    inp = _write_text(tmp_path / "in.txt", _lines())
    base = {"work_dir": str(tmp_path / "work"), "model": str(model_dir), "directions": ["en-it"]}
    off = run_pipeline(load_config(None, base), stages=["bulk"], progress=False, tracker=NullTracker())
    assert off.records == []  # no bulk.input: the stage does nothing, the demo run is unchanged
    over = base | {"bulk.input": str(inp), "bulk.chunk_lines": 5, "translate.max_len": MAX_LEN}
    result = run_pipeline(load_config(None, over), stages=["bulk"], progress=False)
    (rec,) = result.records
    assert (rec.stage, rec.unit, rec.status) == ("bulk", "en-it", "ran")
    parts = sorted((tmp_path / "work" / "bulk" / "en-it").glob("part-*.parquet"))
    assert len(parts) == 5
    client = MlflowClient(result.tracking_uri)
    (child,) = client.search_runs(
        [client.get_run(result.parent_run_id).info.experiment_id],
        f"tags.mlflow.parentRunId = '{result.parent_run_id}'",
    )
    m, p = child.data.metrics, child.data.params
    assert m["lines"] == 23 and m["tokens"] > 0 and m["tokens_per_s"] > 0 and m["parts_retried"] == 0
    assert "empty_outputs" in m and m["tokens_per_s_per_worker"] > 0
    assert p["method"] == "full" and p["model_fingerprint"].startswith("sha256:") and p["workers"] == "1"
    assert client.get_metric_history(child.info.run_id, "throughput_tokens_per_s")
    arts = [a.path for a in client.list_artifacts(child.info.run_id)]
    assert arts == ["throughput.png", SAMPLE_TABLE]
    sample = json.loads(Path(client.download_artifacts(child.info.run_id, SAMPLE_TABLE)).read_text())
    assert sample["columns"] == ["id", "source", "translation"]
    assert [row[1] for row in sample["data"]] == _lines()  # 23 lines, below SAMPLE_ROWS: every one
    html = write_report(result.parent_run_id, tmp_path / "report.html", result.tracking_uri)[0].read_text()
    assert "bulk:en-it" in html and "throughput.png" in html and "5 of 5 parts translated" in html


# ------------------------------------------------------------------- rough edges of fastvocab translate


def _cli(capsys, model_dir, inp, out, *extra: str) -> tuple[int, str]:
    from fastvocab.pipeline.cli import main

    argv = ["translate", "--model", str(model_dir), "--src-lang", "en", "--tgt-lang", "it", "-i", str(inp)]
    rc = main([*argv, "-o", str(out), "--max-len", str(MAX_LEN), "--no-progress", *extra])
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("dataset", [False, True], ids=["file", "dataset"])
def test_a_too_long_line_is_named_by_file_and_real_line(model_dir, tmp_path, capsys, dataset):
    lines = _lines(30)
    lines[24] = "package " * 40  # line 25, in the third part of 10
    inp = _write_text(tmp_path / "in.txt", lines)
    out = f"{tmp_path / 'out'}/" if dataset else tmp_path / "out.txt"
    rc, err = _cli(capsys, model_dir, inp, out, "--chunk-lines", "10", "--max-input-tokens", "16")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert f"{inp}: line 25 has " in err and "more than --max-input-tokens=16" in err
    parts = tmp_path / ("out" if dataset else "out.txt.parts")
    assert f"; 2 finished parts kept in {parts}/ (a rerun resumes)" in err
    assert sorted(p.name for p in parts.glob("part-*")) == ["part-00000.parquet", "part-00001.parquet"]
    assert not (tmp_path / "out.txt").exists()


def test_chunk_lines_0_is_refused_before_the_model_loads(tmp_path, capsys):
    inp = _write_text(tmp_path / "in.txt", ["the package"])
    rc, err = _cli(capsys, tmp_path / "no-model", inp, tmp_path / "out.txt", "--chunk-lines", "0")
    assert rc == 2 and err.strip() == "fastvocab translate: error: --chunk-lines must be >= 1, got 0"


@pytest.mark.parametrize("kind", ["text", "parquet"])
def test_the_progress_bar_counts_lines_as_batches_finish(model_dir, tmp_path, capsys, monkeypatch, kind):
    import tqdm.auto

    updates: list[int] = []

    class Bar:
        def __init__(self, *a, total=0, unit="it", **k):
            self.n, self.unit = 0, unit

        def update(self, n):
            self.n += n
            if self.unit == "line":  # the file's bar (translate's own per-call bar is off)
                updates.append(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    inp = _write_text(tmp_path / "in.txt", _lines(18))
    if kind == "parquet":  # a Parquet input, read range by range
        pq.write_table(pa.table({"text": _lines(18)}), tmp_path / "in.parquet")
        inp = tmp_path / "in.parquet"
    rc, _ = _cli(capsys, model_dir, inp, tmp_path / "out.txt", "--batch-size", "4")
    assert rc == 0 and sum(updates) == 18 and len(updates) >= 5  # 17 non-empty lines in batches of 4


def test_summary_line_counts_and_edge_inputs(model_dir, tmp_path, capsys):
    """dtype, the engine "auto" picked, threads and empty outputs in the summary; one line is "1 line"; an
    empty input says "0 lines" and writes an empty output (deliberately not refused: an empty shard of a
    larger job is normal); -o into a missing folder creates it (documented)."""
    inp = _write_text(tmp_path / "in.txt", _lines(6))
    rc, err = _cli(capsys, model_dir, inp, tmp_path / "new" / "sub" / "out.txt", "--threads", "1")
    # the suite's cache folder cannot be written (conftest): "auto" is the static engine here
    assert rc == 0 and "translated 6 lines (5 non-empty" in err
    assert ", float32, engine static, 1 thread]" in err
    assert " empty output" in err and (tmp_path / "new" / "sub" / "out.txt").is_file()
    one = _write_text(tmp_path / "one.txt", ["the package"])
    rc, err = _cli(capsys, model_dir, one, tmp_path / "one-out.txt")
    assert rc == 0 and "translated 1 line (1 non-empty" in err
    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    for out in (tmp_path / "e.txt", f"{tmp_path / 'e-dataset'}/"):
        rc, err = _cli(capsys, model_dir, empty, out)
        assert rc == 0 and "translated 0 lines: the input is empty; wrote an empty output" in err
    assert (tmp_path / "e.txt").read_text() == "" and (tmp_path / "e-dataset" / MANIFEST).is_file()


def test_null_texts_and_repeated_ids_are_warned_about(model_dir, tmp_path, capsys, caplog):
    """A null text translates to an empty output with a warning; repeated ids are warned about, not
    refused (checking them across parts would hold every id in the driver's memory)."""
    texts = synthetic_sentences("en", 6, seed=2)
    texts[2] = None
    inp = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": [1, 2, 3, 3, 4, 5], "text": texts}), inp)
    out = tmp_path / "out.parquet"
    with caplog.at_level("WARNING"):
        rc, err = _cli(capsys, model_dir, inp, out)
    assert rc == 0, err
    assert "1 null text in column 'text' read as empty lines" in caplog.text
    assert "ids repeat within parts (1 repeated rows)" in caplog.text
    table = pq.read_table(out)
    assert table.column("source").to_pylist()[2] == "" and table.column("translation").to_pylist()[2] == ""
    assert table.column("id").to_pylist() == [1, 2, 3, 3, 4, 5]


def test_the_deploy_bulk_job_example_parses_with_the_real_cli():
    import re
    import shlex

    from fastvocab.pipeline.cli import build_parser

    text = (Path(__file__).resolve().parent.parent / "docs" / "bulk.md").read_text()
    block = next(
        b
        for b in re.findall(r"```bash\n(.*?)```", text, re.S)
        if "ray job submit" in b and "fastvocab translate" in b
    )
    argv = shlex.split(block.split(" -- ", 1)[1].replace("\\\n", " "))
    args = build_parser(load="translate").parse_args(argv[1:])
    assert args.workers == 16 and args.output.endswith("/") and str(args.input).startswith("/mnt/fastvocab/")


def test_cli_job_with_a_tracking_uri_is_one_mlflow_run(model_dir, tmp_path, capsys, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    inp = _write_text(tmp_path / "in.txt", _lines(6))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    rc, err = _cli(capsys, model_dir, inp, tmp_path / "out.txt", "--tracking-uri", uri)
    assert rc == 0 and f"in {uri}" in err, err
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "fastvocab-bulk"]
    runs = client.search_runs([exp.experiment_id])
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert child.data.metrics["lines"] == 6 and child.data.params["workers"] == "1"
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").count("\n") == 6


def test_a_finished_dataset_rerun_changes_no_file(model_dir, tmp_path):
    inp = _write_text(tmp_path / "in.txt", _lines(8))
    out = tmp_path / "out"
    run_bulk(_request(model_dir, inp, f"{out}/"), progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = run_bulk(_request(model_dir, inp, f"{out}/"), progress=False)
    assert again.parts_translated == 0 and again.parts_reused == 2
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    assert again.record().status == "skipped"


def test_a_second_job_on_the_same_output_is_refused_while_the_first_lives(model_dir, tmp_path):
    import json
    import socket

    from fastvocab.artifacts_schema.lock import LOCK_FILE

    inp = _write_text(tmp_path / "in.txt", _lines(4))
    out = tmp_path / "out"
    out.mkdir()
    owner = subprocess.Popen(["sleep", "60"])
    try:
        lock = {"pid": owner.pid, "host": socket.gethostname(), "started": "", "command": "fastvocab"}
        (out / LOCK_FILE).write_text(json.dumps(lock))
        with pytest.raises(UserError, match="another job is writing its parts"):
            run_bulk(_request(model_dir, inp, f"{out}/"), progress=False)
        assert not list(out.glob("part-*"))
    finally:
        owner.kill()
        owner.wait()
    # its owner gone, the lock is taken over and the job runs
    assert run_bulk(_request(model_dir, inp, f"{out}/"), progress=False).parts_translated == 1
    assert not (out / LOCK_FILE).exists()


def test_planning_reads_large_strings_and_narrow_ids_and_counts_null_texts(tmp_path):
    from fastvocab.tasks.bulk import describe_input, plan_input

    table = pa.table(
        {"id": pa.array([1, 2, 3], pa.int32()), "text": pa.array(["a", None, "c"], pa.large_string())}
    )
    pq.write_table(table, tmp_path / "in.parquet")
    inp, ranges = plan_input(describe_input(tmp_path / "in.parquet"), 2)
    assert (inp.rows, inp.nulls, inp.id_type, [r.lines for r in ranges]) == (3, 1, "int", [2, 1])
    assert ranges[0].load() == ([1, 2], ["a", ""]) and ranges[1].load() == ([3], ["c"])


def test_an_existing_folder_is_a_dataset_output_only_when_named_with_a_slash(model_dir, tmp_path):
    pq.write_table(pa.table({"text": ["the package"]}), tmp_path / "in.parquet")
    folder = tmp_path / "out"
    folder.mkdir()
    with pytest.raises(UserError, match=r"is a folder; name it .*out/ for a Parquet dataset of parts"):
        run_bulk(_request(model_dir, tmp_path / "in.parquet", folder), progress=False)
    assert list(folder.iterdir()) == [] and not (tmp_path / "out.parts").exists()


def test_a_resumed_job_counts_the_lines_an_earlier_run_translated(model_dir, tmp_path):
    inp = _write_text(tmp_path / "in.txt", _lines(12))
    out = tmp_path / "out"
    first = run_bulk(_request(model_dir, inp, f"{out}/"), progress=False)
    (out / "part-00001.parquet").unlink()  # as if the first run had been killed before that part
    again = run_bulk(_request(model_dir, inp, f"{out}/"), progress=False)
    assert again.parts_reused == first.parts - 1 and again.parts_translated == 1
    assert again.sentences + again.reused_sentences == first.sentences == sum(1 for x in _lines(12) if x)
    assert again.empty_outputs == first.empty_outputs
    assert f"({first.sentences} non-empty," in again.summary() and "translated now" in again.summary()
