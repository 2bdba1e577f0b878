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
