"""``fastvocab report RUN_ID``: the HTML page of a run logged the way the pipeline logs it
(pipeline/tracking.py), read back with the standard library's HTML parser."""

from __future__ import annotations

import base64
import shutil
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from fastvocab.pipeline.cli import main
from fastvocab.pipeline.report_artifacts import PNG_SIGNATURE, fmt_number, markdown_blocks
from fastvocab.pipeline.tracking import SAMPLE_TABLE, StageRecord, Tracker

HOSTILE = "<script>alert('x')</script> & <b>bold</b>"
# a translation sample as the translate stage logs it: text that reads as a number stays as written
SAMPLE = {
    "id": [0, 1],
    "source": ["Free software.", HOSTILE],
    "reference": ["Software libero.", "3.14159265"],
    "hypothesis_full": ["Software libero.", "1e5"],
}


class Page(HTMLParser):
    """Tables (header, rows of (text, title)), images, every start tag and the visible text of a page."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[dict] = []
        self.images: list[str] = []
        self.tags: list[str] = []
        self.text: list[str] = []
        self._cell: list[str] | None = None
        self._title = ""
        self._in_head = False
        self.feed(html)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if tag == "table":
            self.tables.append({"header": [], "rows": []})
        elif tag == "thead":
            self._in_head = True
        elif tag == "tbody":
            self._in_head = False
        elif tag == "tr" and not self._in_head:
            self.tables[-1]["rows"].append([])
        elif tag in ("td", "th"):
            self._cell, self._title = [], a.get("title") or ""
        elif tag == "img":
            self.images.append(a.get("src") or "")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None:
            text = "".join(self._cell).strip()
            if self._in_head:
                self.tables[-1]["header"].append(text)
            else:
                self.tables[-1]["rows"][-1].append((text, self._title))
            self._cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def rows_starting(self, first: str) -> list[tuple[list[str], list[tuple[str, str]]]]:
        """(header, row) of every body row whose first cell reads ``first``."""
        return [(t["header"], row) for t in self.tables for row in t["rows"] if row and row[0][0] == first]


def _png(path: Path, width: int = 3, height: int = 2) -> Path:
    """A small valid PNG written by hand (no imaging library needed)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    path.write_bytes(
        PNG_SIGNATURE + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> dict:
    """A pipeline-shaped run (parent, one child per stage and direction, a nested run) logged through the
    pipeline's own Tracker; then the work dir is moved, as a user copying a run elsewhere would."""
    from mlflow import MlflowClient

    tmp = tmp_path_factory.mktemp("report")
    orig = tmp / "orig"
    files = orig / "files"
    files.mkdir(parents=True)
    (files / "table.csv").write_text(f"method,<x>&y,bleu\nfull,{HOSTILE},18.5\nclustered,a,18.25\n")
    (files / "table.md").write_text("# Table 2\n\n| method | bleu |\n| --- | ---: |\n| full | 18.5 |\n")
    (files / "manifest.json").write_text('{"r": 8, "note": "' + HOSTILE.replace("'", "") + '"}')
    extra_png = _png(files / "extra.png")

    tracker = Tracker(f"sqlite:///{orig / 'mlflow.db'}", "report-test", orig / "mlartifacts")
    parent = tracker.start(
        "run <one> & two", {"kmeans": {"r": 8}, "note": HOSTILE}, {"fastvocab.stages": "all"}
    )
    records = [
        StageRecord("dump", "en-it", "ran", HOSTILE, {"k": 5}, {"states": 120.0, "states_per_s": 12.345678}),
        StageRecord("dump", "it-en", "ran", "", {"k": 5}, {"states": 80.0, "states_per_s": 9.5}),
        StageRecord(
            "kmeans",
            "en-it",
            "ran",
            params={"r": 8},
            metrics={"objective": 3.25},
            series={"objective_by_iteration": [5.0, 4.0, 3.25]},
            artifacts=[files / "table.csv", files / "table.md", files / "manifest.json", extra_png],
        ),
        StageRecord(
            "maps",
            "en-it",
            "ran",
            metrics={"active_fraction_mean": 0.0123},
            fractions={1: np.linspace(0.01, 0.02, 8), 3: np.linspace(0.02, 0.04, 8)},
        ),
        StageRecord(
            "translate", "en-it", "ran", metrics={"tokens_per_s_full": 50.0}, tables={SAMPLE_TABLE: SAMPLE}
        ),
        StageRecord("evaluate", "en-it", "skipped", "outputs exist"),
    ]
    children = [tracker.log_stage(rec) for rec in records]
    client = MlflowClient(tracker.uri)
    # An experiment-style grid: a child with a run of its own below it.
    nested = client.create_run(
        tracker.experiment_id, run_name="grid:r=8", tags={"mlflow.parentRunId": parent}
    )
    client.log_metric(nested.info.run_id, "speed", 2.5)
    leaf = client.create_run(
        tracker.experiment_id, run_name="grid:r=8:k=3", tags={"mlflow.parentRunId": nested.info.run_id}
    )
    client.log_metric(leaf.info.run_id, "speed", 3.5)
    for run_id in (leaf.info.run_id, nested.info.run_id):
        client.set_terminated(run_id, "FINISHED")
    tracker.end()

    work = tmp / "work"
    shutil.move(orig, work)  # the store still names orig/mlartifacts: the report must find work/mlartifacts
    return {
        "uri": f"sqlite:///{work / 'mlflow.db'}",
        "work": work,
        "tmp": tmp,
        "parent": parent,
        "children": children,
        "nested": [nested.info.run_id, leaf.info.run_id],
    }


@pytest.fixture(scope="module")
def page(store) -> tuple[Page, str]:
    out = store["tmp"] / "report.html"
    assert main(["report", store["parent"], "--tracking-uri", store["uri"], "-o", str(out)]) == 0
    html = out.read_text(encoding="utf-8")
    return Page(html), html


def test_a_row_per_child_run_with_its_metrics(store, page):
    from mlflow import MlflowClient

    doc, _ = page
    client = MlflowClient(store["uri"])
    overview = next(t for t in doc.tables if t["header"][:2] == ["run", "stage"])
    names = [row[0][0].strip() for row in overview["rows"]]
    for run_id in store["children"] + store["nested"]:
        run = client.get_run(run_id)
        assert run.info.run_name in names
        unit = run.data.tags.get("fastvocab.unit") or run.info.run_name
        for key, value in run.data.metrics.items():
            cells = [row[header.index(key)] for header, row in doc.rows_starting(unit) if key in header]
            assert cells, f"{run.info.run_name}: no row with metric {key}"
            assert any(title == repr(float(value)) and text == fmt_number(value) for text, title in cells)
    assert len(store["children"]) + len(store["nested"]) == len(overview["rows"])


def test_every_figure_is_an_embedded_png(page):
    doc, _ = page
    # extra.png, the maps stage's active-fraction figure, the k-means objective by iteration
    assert len(doc.images) == 3
    for src in doc.images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        assert base64.b64decode(src[len(prefix) :], validate=True).startswith(PNG_SIGNATURE)


def test_text_from_the_store_is_escaped(page):
    doc, html = page
    assert "script" not in doc.tags and "b" not in doc.tags  # what the run logged stays text
    assert "link" not in doc.tags  # self-contained: no stylesheet, script or font from elsewhere
    assert "&lt;script&gt;" in html
    text = "".join(doc.text)
    assert HOSTILE in text  # the message tag and the config param, shown as written
    assert "fastvocab report: run <one> & two" in text


def test_csv_and_markdown_artifacts_are_tables(page):
    doc, _ = page
    csv_table = next(t for t in doc.tables if t["header"] == ["method", "<x>&y", "bleu"])
    assert [[c[0] for c in row] for row in csv_table["rows"]] == [
        ["full", HOSTILE, "18.5"],
        ["clustered", "a", "18.25"],
    ]
    assert any(t["header"] == ["method", "bleu"] and t["rows"][0][1][0] == "18.5" for t in doc.tables)


def test_a_translation_sample_is_a_table_of_text(page):
    doc, _ = page
    table = next(t for t in doc.tables if t["header"] == list(SAMPLE))
    rows = [[c[0] for c in row] for row in table["rows"]]
    assert rows == [[str(i), *(SAMPLE[k][i] for k in list(SAMPLE)[1:])] for i in range(2)]


def _logged(uri: str, experiment: str, name: str, tags: dict[str, str]) -> str:
    tracker = Tracker(uri, experiment)
    run_id = tracker.start(name, {}, tags)
    tracker.log_stage(StageRecord("tune", "r8", "ran"))
    tracker.end()
    return run_id


def test_latest_is_the_latest_pipeline_run_and_says_so(tmp_path, capsys):
    """After `fastvocab run` then `fastvocab tune` (and a translate) in one store, `report latest` reports
    the pipeline run, names it, and names the newer run it passed over with the command that reports it."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    pipeline = _logged(uri, "fastvocab", "run 1", {"fastvocab.kind": "pipeline"})
    tune = _logged(uri, "fastvocab-tune", "tune:en-it:beam1", {"fastvocab.tune": "chosen"})
    out = tmp_path / "latest.html"
    assert main(["report", "latest", "--tracking-uri", uri, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"report of run {pipeline}" in captured.out
    (why,) = [line for line in captured.err.splitlines() if line.startswith("latest:")]
    assert why.startswith(f"latest: pipeline run {pipeline} (run 1, started ")
    assert f"a tune run started since: {tune}" in why and f"`fastvocab report {tune}`" in why
    page = Page(out.read_text(encoding="utf-8"))
    assert [row[1][0] for _, row in page.rows_starting("chosen as")] == [why]
    # a store without a pipeline run: its newest run, said so
    only = f"sqlite:///{tmp_path / 'tune-only.db'}"
    bulk = _logged(only, "fastvocab-bulk", "translate en-it", {"fastvocab.kind": "bulk"})
    assert main(["report", "latest", "--tracking-uri", only, "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"report of run {bulk}" in captured.out
    assert f"latest: no pipeline run in the store; the newest run, a bulk run: {bulk}" in captured.err


def test_latest_run_in_the_work_dirs_store(store, monkeypatch, capsys):
    # --work-dir names the default store; the environment's store comes first, as for the commands that log
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    out = store["tmp"] / "latest.html"
    assert main(["report", "latest", "--work-dir", str(store["work"]), "-o", str(out)]) == 0
    assert store["parent"] in capsys.readouterr().out
    assert store["parent"] in "".join(Page(out.read_text(encoding="utf-8")).text)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store['tmp'] / 'elsewhere' / 'mlflow.db'}")
    assert main(["report", "latest", "--work-dir", str(store["work"]), "-o", str(out)]) == 2
    assert "elsewhere" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["0123456789abcdef0123456789abcdef"], "not found"),
        (["latest", "--tracking-uri", "sqlite:///{tmp}/none/mlflow.db"], "no MLflow store"),
        (["latest", "--work-dir", "{tmp}/missing"], "no MLflow store"),
        (["latest", "--tracking-uri", "sqlite:///{tmp}/not-mlflow.db"], "not an MLflow store"),
        (["latest", "--tracking-uri", "ftp://host/x"], "unknown scheme"),
    ],
)
def test_bad_run_or_store_is_one_line(store, capsys, args, message):
    tmp = store["tmp"]
    (tmp / "not-mlflow.db").write_bytes(b"")
    args = [a.format(tmp=tmp) for a in args]
    if "--tracking-uri" not in args and "--work-dir" not in args:
        args += ["--tracking-uri", store["uri"]]
    out = tmp / "bad.html"
    assert main(["report", *args, "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("fastvocab report: error:") and message in err
    assert not out.exists()
    assert not (tmp / "none").exists() and not (tmp / "missing").exists()  # no store created


@pytest.mark.parametrize(
    "value, text",
    [(50812.0, "50,812"), (3.5671, "3.5671"), (1015626.3125, "1,015,626"), (8.4714e-05, "8.4714e-05")],
)
def test_number_format(value, text):
    assert fmt_number(value) == text


def test_markdown_pipe_table_with_escaped_bar():
    blocks = markdown_blocks("intro\n\n| a | b \\| c |\n|:--|--:|\n| 1 | x |\n\ntail")
    assert [b.text for b in blocks if b.table is None] == ["intro", "tail"]
    table = next(b.table for b in blocks if b.table is not None)
    assert table.header == ["a", "b | c"] and [c.text for c in table.rows[0]] == ["1", "x"]
