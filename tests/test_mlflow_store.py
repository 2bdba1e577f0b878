"""One MLflow store across the commands, by one precedence (pipeline/tracking.py resolve_store):
--tracking-uri (run: the config's mlflow_tracking_uri, which its --tracking-uri sets), else
$MLFLOW_TRACKING_URI, else the default store <work dir>/mlflow.db, runs/demo for a command given none;
translate logs only to a store named one of the first two ways, and --no-mlflow logs nothing anywhere."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fastvocab.pipeline import tracking
from fastvocab.pipeline.cli import main
from fastvocab.pipeline.tracking import DEFAULT_WORK_DIR, Tracker, resolve_store

ROOT = Path(__file__).resolve().parents[1]
ENV = "MLFLOW_TRACKING_URI"


class Opened(Exception):
    """Raised by the fake Tracker.open: the command chose its store, nothing more is needed."""


class Working(Exception):
    """Raised where a command starts its work (the model loads, the stages run)."""


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A project folder without a store in the environment."""
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def opened(monkeypatch):
    """The stores Tracker.open is given; the command stops there, and where its work would start."""
    stores = []

    def fake_open(cls, store, experiment):
        stores.append(store)
        raise Opened

    def working(*args, **kwargs):
        raise Working

    monkeypatch.setattr(Tracker, "open", classmethod(fake_open))
    for target in (
        "fastvocab.pipeline.commands.load_model",  # experiment paper
        "fastvocab.pipeline.commands.tune.load_model",
        "fastvocab.pipeline.commands.bench.load_model",
        "fastvocab.pipeline.run._run_stages",
    ):
        monkeypatch.setattr(target, working)
    return stores


def sqlite(path: Path) -> str:
    return f"sqlite:///{path.resolve()}"


def test_resolve_store_precedence(here, monkeypatch):
    default = resolve_store()
    assert default.uri == sqlite(here / "runs/demo/mlflow.db") and default.is_default
    assert default.work_dir == DEFAULT_WORK_DIR
    assert resolve_store(None, Path("w")).uri == sqlite(here / "w/mlflow.db")
    monkeypatch.setenv(ENV, "http://mlflow:5000")
    env = resolve_store(None, Path("w"))
    assert (env.uri, env.source, env.is_default) == ("http://mlflow:5000", ENV, False)
    flag = resolve_store("sqlite:///x.db", Path("w"))
    assert (flag.uri, flag.source, flag.is_default) == ("sqlite:///x.db", "--tracking-uri", False)
    monkeypatch.setenv(ENV, "")  # set but empty: not a store
    assert resolve_store().is_default


def _run_config(here: Path) -> str:
    cfg = {"work_dir": "runs/mine", "model": str(ROOT / "models/demo"), "directions": ["en-it"]}
    (here / "run.yaml").write_text(yaml.safe_dump(cfg))
    return "run.yaml"


# argv of each command that logs by default, and the work dir its default store is in
COMMANDS = {
    "run": (["run", "run.yaml", "--no-progress"], "runs/mine"),
    "tune": (["tune", "--src-lang", "en", "--tgt-lang", "it"], "runs/demo"),
    "bench methods": (["bench", "methods", "--directions", "en-it"], "runs/demo"),
    "experiment paper": (["experiment", "paper", "--quick", "--parts", "figure2"], "runs/demo"),
}
WORK_DIR_FLAG = {"tune", "bench methods", "experiment paper"}  # --work-dir moves the default store


@pytest.mark.parametrize("name", list(COMMANDS))
@pytest.mark.parametrize("given", ["default", "work-dir", "env", "flag"])
def test_each_command_resolves_its_store_by_the_one_precedence(name, given, here, opened, monkeypatch):
    argv, work = COMMANDS[name]
    _run_config(here)
    if given == "work-dir":
        if name not in WORK_DIR_FLAG:
            pytest.skip(f"{name} takes its work dir from the config")
        argv, work = [*argv, "--work-dir", "elsewhere"], "elsewhere"
    if given in ("env", "flag"):
        monkeypatch.setenv(ENV, sqlite(here / "env.db"))
    if given == "flag":
        argv = [*argv, "--tracking-uri", sqlite(here / "flag.db")]
    with pytest.raises(Opened):
        main(argv)
    (store,) = opened
    want = {"env": here / "env.db", "flag": here / "flag.db"}.get(given, here / work / "mlflow.db")
    assert store.uri == sqlite(want)
    assert store.is_default == (given in ("default", "work-dir"))


@pytest.mark.parametrize("name", list(COMMANDS))
def test_no_mlflow_opens_no_store_whatever_names_one(name, here, opened, monkeypatch):
    argv, _ = COMMANDS[name]
    _run_config(here)
    monkeypatch.setenv(ENV, sqlite(here / "env.db"))
    with pytest.raises(Working):  # on to the work, no store opened
        main([*argv, "--tracking-uri", sqlite(here / "flag.db"), "--no-mlflow"])
    assert opened == []
    assert not list(here.rglob("*.db"))


def test_report_reads_where_the_commands_log(here, monkeypatch):
    from fastvocab.pipeline import report

    read = []

    def fake_write_report(run_id, output, uri):
        read.append(uri)
        raise Opened

    monkeypatch.setattr(report, "write_report", fake_write_report)
    for argv, want in [
        ([], here / "runs/demo/mlflow.db"),
        (["--work-dir", "runs/mine"], here / "runs/mine/mlflow.db"),
    ]:
        with pytest.raises(Opened):
            main(["report", "latest", *argv])
        assert read.pop() == sqlite(want)
    monkeypatch.setenv(ENV, sqlite(here / "env.db"))
    with pytest.raises(Opened):
        main(["report", "latest", "--work-dir", "runs/mine"])
    assert read.pop() == sqlite(here / "env.db")
    with pytest.raises(Opened):
        main(["report", "latest", "--tracking-uri", sqlite(here / "flag.db")])
    assert read.pop() == sqlite(here / "flag.db")


@pytest.mark.parametrize(
    ("env", "flags", "logged"),
    [
        (None, [], None),  # translate logs only to a store named so
        ("env.db", [], "env.db"),
        ("env.db", ["--tracking-uri", "{here}/flag.db"], "flag.db"),
        ("env.db", ["--tracking-uri", "{here}/flag.db", "--no-mlflow"], None),
    ],
)
def test_translate_logs_to_a_named_store_only(env, flags, logged, here, tiny_model_dir, monkeypatch):
    from fastvocab.pipeline.commands import translate

    uris = []
    monkeypatch.setattr(translate, "log_to_mlflow", lambda result, uri, *a: uris.append(uri) or "run-id")
    if env:
        monkeypatch.setenv(ENV, sqlite(here / env))
    (here / "in.txt").write_text("a b c\n")
    argv = ["translate", "--model", str(tiny_model_dir), "--src-lang", "en", "--tgt-lang", "it"]
    argv += ["-i", "in.txt", "-o", "out.txt", "--max-len", "4"]
    argv += [f.replace("{here}", f"sqlite:///{here.resolve()}") for f in flags]
    assert main(argv) == 0
    assert uris == ([] if logged is None else [sqlite(here / logged)])
    assert not list(here.rglob("*.db")) and not (here / "runs").exists()


def test_a_default_translate_does_not_import_mlflow(here, tiny_model_dir):
    code = (
        "import sys\n"
        "from fastvocab.pipeline.cli import main\n"
        f"rc = main(['translate', '--model', {str(tiny_model_dir)!r}, '--src-lang', 'en', '--tgt-lang', 'it',"
        " '--max-len', '4'])\n"
        "print('mlflow imported' if 'mlflow' in sys.modules else 'mlflow not imported', file=sys.stderr)\n"
        "sys.exit(rc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ENV}
    proc = subprocess.run(
        [sys.executable, "-c", code], input="a b c\n", cwd=here, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip().endswith("mlflow not imported"), proc.stderr[-2000:]
    assert not list(here.rglob(tracking.DB_FILE))


# ------------------------------------------------------------- what the runs say: times, stages, artifacts


def _fake_stages(monkeypatch, stages: dict):
    """``_run_stages`` with stages that take a known time: each is (seconds, records, error)."""
    import time
    from types import SimpleNamespace

    from fastvocab.pipeline import run as run_module

    def stage_function(name):
        seconds, records, error = stages[name]

        def stage(ctx):
            time.sleep(seconds)
            if error is not None:
                raise error
            return [tracking.StageRecord(name, unit, status) for unit, status in records]

        return stage

    monkeypatch.setattr(run_module, "stage_function", stage_function)
    ctx = SimpleNamespace(
        cfg=SimpleNamespace(model_dump=lambda mode: {"work_dir": "w"}),
        work_dir=Path("w"),
        ray=SimpleNamespace(shutdown=lambda: None),
    )
    return run_module, ctx, SimpleNamespace(update=lambda **kw: None)


def _runs(tracker: Tracker):
    from mlflow import MlflowClient

    client = MlflowClient(tracker.uri)
    parent = client.get_run(tracker.parent_id)
    children = {client.get_run(c).info.run_name: client.get_run(c).info for c in tracker.children}
    return parent, children


def test_child_runs_span_their_stage_and_the_parent_the_run(here, monkeypatch):
    import time

    stages = {
        "corpus": (0.3, [("en-it", "ran"), ("it-en", "skipped")], None),
        "dump": (0.2, [("en-it", "skipped")], None),
        "kmeans": (0.0, [], None),  # nothing configured for it: skipped too
    }
    run_module, ctx, lock = _fake_stages(monkeypatch, stages)
    tracker = Tracker(sqlite(here / "mlflow.db"), "spans")
    started = time.time() - 5.0  # the run began before the tracker opened (the model was described)
    before = time.time()
    run_module._run_stages(ctx, list(stages), tracker, lock, "r", time.perf_counter(), started)
    after = time.time()
    parent, children = _runs(tracker)
    info = parent.info
    assert info.start_time == int(started * 1000) and info.end_time <= int(after * 1000)
    corpus = [children["corpus:en-it"], children["corpus:it-en"]]
    # both units of a stage share its span, which is its work's (0.3 s), not the logging call's
    assert corpus[0].start_time == corpus[1].start_time and corpus[0].end_time == corpus[1].end_time
    assert corpus[0].end_time - corpus[0].start_time >= 300
    dump = children["dump:en-it"]
    assert dump.end_time - dump.start_time >= 200
    assert int(before * 1000) <= corpus[0].start_time < corpus[0].end_time <= dump.start_time
    assert dump.end_time <= info.end_time  # the parent ends after its last stage
    tags = parent.data.tags
    assert tags["fastvocab.kind"] == "pipeline"
    assert tags["fastvocab.stages_selected"] == "corpus,dump,kmeans"
    assert tags["fastvocab.stages"] == "corpus"  # the stages that ran, not those selected
    assert tags["fastvocab.stages_skipped"] == "dump,kmeans"
    assert "fastvocab.stage_failed" not in tags


def test_a_failed_run_names_its_stage_and_only_the_stages_that_ran(here, monkeypatch):
    stages = {
        "corpus": (0.0, [("en-it", "skipped")], None),
        "dump": (0.0, [("en-it", "ran")], None),
        "kmeans": (0.0, [], RuntimeError("k-means broke")),
        "maps": (0.0, [("en-it", "ran")], None),
    }
    run_module, ctx, lock = _fake_stages(monkeypatch, stages)
    tracker = Tracker(sqlite(here / "mlflow.db"), "failed")
    with pytest.raises(RuntimeError):
        run_module._run_stages(ctx, list(stages), tracker, lock, "r", 0.0)
    parent, _ = _runs(tracker)
    assert parent.info.status == "FAILED"
    tags = parent.data.tags
    assert (tags["fastvocab.stages"], tags["fastvocab.stages_skipped"]) == ("dump", "corpus")
    assert tags["fastvocab.stage_failed"] == "kmeans"
    assert tags["fastvocab.stages_selected"] == "corpus,dump,kmeans,maps"


def test_an_experiment_in_a_sqlite_store_keeps_its_artifacts_beside_the_database(here, monkeypatch):
    from mlflow import MlflowClient

    store = here / "store"
    store.mkdir()
    elsewhere = here / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # MLflow's own default would be ./mlruns of this folder
    for uri in (sqlite(store / "named.db"), "sqlite:///../store/relative.db"):
        tracker = Tracker(uri, "beside")
        exp = MlflowClient(uri).get_experiment(tracker.experiment_id)
        assert exp.artifact_location == (store / tracking.ARTIFACTS_DIR).resolve().as_uri()
    assert tracking.artifact_root_for("http://host:5000") is None
    assert tracking.artifact_root_for("sqlite://") is None
    assert tracking.artifact_root_for("sqlite:///:memory:") is None
    # the default store: <work_dir>/mlartifacts, as before
    default = Tracker.open(resolve_store(None, here / "work"), "default")
    exp = MlflowClient(default.uri).get_experiment(default.experiment_id)
    assert exp.artifact_location == (here / "work" / tracking.ARTIFACTS_DIR).resolve().as_uri()
    assert not (elsewhere / "mlruns").exists()


def test_translate_logs_its_time_and_a_sample_beside_its_store(here, tiny_model_dir):
    """``fastvocab translate --tracking-uri``: the experiment's artifacts beside the store (not ./mlruns), the
    child run spans the job (the output was written inside it), the parent the command, and the child holds
    the first lines as a table: source and translation."""
    import json
    import time

    from mlflow import MlflowClient

    lines = [f"the package {i} for the system" for i in range(60)]
    (here / "in.txt").write_text("\n".join(lines) + "\n")
    (here / "store").mkdir()
    uri = sqlite(here / "store" / "t.db")
    argv = ["translate", "--model", str(tiny_model_dir), "--src-lang", "en", "--tgt-lang", "it"]
    argv += ["-i", "in.txt", "-o", "out.txt", "--max-len", "4", "--chunk-lines", "20", "--tracking-uri", uri]
    before = int(time.time() * 1000)
    assert main(argv) == 0
    after = int(time.time() * 1000)
    written = (here / "out.txt").stat().st_mtime_ns // 1_000_000
    assert not (here / "mlruns").exists()

    client = MlflowClient(uri)
    exp = client.get_experiment_by_name("fastvocab-bulk")
    assert exp.artifact_location == (here / "store" / tracking.ARTIFACTS_DIR).resolve().as_uri()
    (parent,) = client.search_runs([exp.experiment_id], filter_string="tags.`fastvocab.kind` = 'bulk'")
    (child,) = client.search_runs(
        [exp.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    p, c = parent.info, child.info
    assert before <= p.start_time <= c.start_time <= written <= c.end_time <= p.end_time <= after

    sample = Path(client.download_artifacts(c.run_id, tracking.SAMPLE_TABLE, str(here / "dl")))
    table = json.loads(sample.read_text())
    assert table["columns"] == ["id", "source", "translation"]
    rows = table["data"]
    assert len(rows) == tracking.SAMPLE_ROWS  # the first 50 of 60 lines, across three parts
    translations = (here / "out.txt").read_text().splitlines()
    assert [r[1] for r in rows] == lines[: tracking.SAMPLE_ROWS]
    assert [r[2] for r in rows] == translations[: tracking.SAMPLE_ROWS]
