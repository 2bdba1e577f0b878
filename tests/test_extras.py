"""The pipeline extra (pipeline/extras.py): where its modules are missing, a command fails with one line
naming what to install, before any work; the demo model's default where fastvocab has no source checkout.

Modules are hidden with None in sys.modules (what Python reads as "not installed"); the wheel installed in a
fresh venv and run the same way is in tests/test_packaging.py.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from fastvocab.pipeline import commands
from fastvocab.pipeline.cli import main
from fastvocab.pipeline.errors import UserError
from fastvocab.pipeline.extras import INSTALL, MODULES, MissingExtra, missing, needed, require

ROOT = Path(__file__).resolve().parents[1]


def _hide(monkeypatch, *names: str) -> None:
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)


def _guarded(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether an import sits inside ``with needed():`` or ``if TYPE_CHECKING:``."""
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.With) and any(
            isinstance(item.context_expr, ast.Call) and getattr(item.context_expr.func, "id", "") == "needed"
            for item in node.items
        ):
            return True
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            return True
    return False


def test_every_import_of_the_extra_in_the_pipeline_is_guarded():
    # a new `import mlflow` in the pipeline outside `with needed():` would be a traceback without the extra
    bare = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(n.partition(".")[0] in MODULES for n in names) and not _guarded(node, parents):
                bare.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bare, f"imports of the pipeline extra outside `with needed():`: {bare}"


def test_the_message_names_what_needs_it_and_what_to_install():
    assert str(missing(["ray"])) == f"Ray is not installed: {INSTALL}"
    assert str(missing(["ray", "mlflow", "faiss"], "the pipeline", "or not")) == (
        f"the pipeline needs Ray, MLflow and Faiss, which are not installed: {INSTALL} (or not)"
    )
    assert INSTALL == "pip install 'fastvocab[pipeline]'"
    # a UserError made from its message alone: commands re-raise one with their file names put back
    err = missing(["mlflow"])
    assert isinstance(err, UserError)
    assert str(type(err)(str(err))) == str(err)


def test_require_names_only_what_is_missing_in_one_order(monkeypatch):
    require("x", "ray", "mlflow")  # installed here: nothing raised
    _hide(monkeypatch, "mlflow", "ray")
    with pytest.raises(MissingExtra) as exc:
        require("y", "mlflow", "faiss", "ray", "mlflow")
    assert str(exc.value) == f"y needs Ray and MLflow, which are not installed: {INSTALL}"


def test_needed_converts_only_the_extra_itself(monkeypatch):
    _hide(monkeypatch, "ray")
    with pytest.raises(MissingExtra, match=r"^Ray is not installed: pip install"), needed():
        import ray.util  # noqa: F401
    with pytest.raises(MissingExtra, match=r"^MLflow is not installed: pip install"), needed():
        _hide(monkeypatch, "mlflow")
        from mlflow import MlflowClient  # noqa: F401
    # a module that an installed extra's module fails to find is a broken install: its own error
    monkeypatch.delitem(sys.modules, "ray")
    with pytest.raises(ModuleNotFoundError, match="_raylet"), needed():
        raise ModuleNotFoundError("No module named 'ray._raylet'", name="ray._raylet")


def test_ray_session_and_tracker_without_the_extra(monkeypatch, tmp_path):
    from fastvocab.pipeline.ray_session import RaySession
    from fastvocab.pipeline.report_store import open_client
    from fastvocab.pipeline.tracking import Tracker

    _hide(monkeypatch, "ray", "mlflow")
    session = RaySession(None, 3)
    assert session.cpus() == 3  # Ray not imported: not started, its limit is the local one
    with pytest.raises(MissingExtra, match=r"^Ray is not installed"):
        session.ensure()
    with pytest.raises(MissingExtra, match=r"^MLflow is not installed"):
        Tracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "e")
    with pytest.raises(MissingExtra, match=r"^MLflow is not installed"):
        open_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert not list(tmp_path.iterdir())


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def test_translate_checks_before_the_model_loads(monkeypatch, capsys, tmp_path):
    # --model names a folder that does not exist: each error comes before the model is looked at
    base = ["translate", "--model", str(tmp_path / "no-model"), "--src-lang", "en", "--tgt-lang", "it"]
    base += ["-i", str(tmp_path / "in.txt"), "-o", str(tmp_path / "out.txt")]
    (tmp_path / "in.txt").write_text("Free software.\n")
    _hide(monkeypatch, "faiss", "mlflow")
    assert main([*base, "--method", "graph"]) == 2
    assert _one_line(capsys) == (
        f"fastvocab translate: error: --method graph needs Faiss, which is not installed: {INSTALL}"
    )
    assert main([*base, "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"]) == 2
    assert _one_line(capsys) == (
        "fastvocab translate: error: logging to MLflow (--tracking-uri) needs MLflow, which is not "
        f"installed: {INSTALL} (or --no-mlflow)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_a_harness_logging_to_its_default_store_says_no_mlflow_does_without(monkeypatch, capsys, tmp_path):
    _hide(monkeypatch, "mlflow")
    argv = ["tune", "--model", str(tmp_path / "no-model"), "--src-lang", "en", "--tgt-lang", "it"]
    assert main([*argv, "--work-dir", str(tmp_path / "work")]) == 2
    assert _one_line(capsys) == (
        "fastvocab tune: error: logging to MLflow (the default store) needs MLflow, which is not installed: "
        f"{INSTALL} (or --no-mlflow)"
    )
    assert not list(tmp_path.iterdir())


def test_a_missing_module_the_command_did_not_check_is_one_line(monkeypatch, capsys):
    # the CLI's net for an import of the extra outside `with needed():` (a harness, the core's Faiss)
    def run(args):
        raise ModuleNotFoundError("No module named 'faiss'", name="faiss")

    _hide(monkeypatch, "faiss")
    monkeypatch.setattr("fastvocab.pipeline.commands.evaluate.run", run)
    assert main(["eval", "--hyp", "h.txt", "--ref", "r.txt"]) == 2
    assert _one_line(capsys) == f"fastvocab eval: error: Faiss is not installed: {INSTALL}"


def test_the_demo_model_is_the_checkouts_and_model_is_required_without_one(monkeypatch, capsys, tmp_path):
    assert commands.source_checkout() == ROOT  # the editable install links into this checkout
    monkeypatch.chdir(tmp_path)
    assert commands.default_model() == ROOT / "models" / "demo"
    monkeypatch.setattr(commands, "source_checkout", lambda: None)  # as installed from a wheel
    assert commands.default_model() is None
    assert main(["translate", "--src-lang", "en", "--tgt-lang", "it", "-i", "in.txt"]) == 2
    assert _one_line(capsys) == f"fastvocab translate: error: {commands.NO_DEMO_MODEL}"
    (tmp_path / "models" / "demo").mkdir(parents=True)  # the current folder's models/demo comes first
    assert commands.default_model() == Path("models/demo")
