"""The import contracts of pyproject.toml catch what they are meant to catch.

`make test` runs lint-imports over the installed package; here it runs over a copy of the rooms, laid out as
the wheel lays them out, once as it is (every contract kept) and once with an import planted where the
contracts forbid it (the product reaching into a harness, a room importing one above it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROOMS = ("artifacts_schema", "kernels", "decoding", "tasks", "experiments", "training", "pipeline")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of fastvocab/ with every room under it (what the wheel installs)."""
    root = tmp_path_factory.mktemp("tree")
    shutil.copytree(REPO / "fastvocab", root / "fastvocab")
    for room in ROOMS:
        shutil.copytree(REPO / room, root / "fastvocab" / room, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
    )


def planted(package: Path, tmp_path: Path, module: str, line: str) -> Path:
    """A copy of ``package`` with ``line`` appended to ``module`` (a path under fastvocab/)."""
    root = tmp_path / "planted"
    shutil.copytree(package, root)
    target = root / "fastvocab" / module
    target.write_text(target.read_text() + f"\n{line}\n")
    return root


def test_the_rooms_keep_every_contract(package):
    res = lint(package)
    assert res.returncode == 0, res.stdout + res.stderr
    status = contract_status(res.stdout)
    assert len(status) == 4 and set(status.values()) == {"KEPT"}, status


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # The pipeline's translate stage is product: it may not reach the fidelity harness.
        (
            "pipeline/stages/translate.py",
            "import fastvocab.experiments.fidelity",
            "The product never imports a harness or the training code",
        ),
        ("pipeline/commands/translate.py", "import fastvocab.training", "The product never imports"),
        # A unit of work below the harnesses may not import one.
        ("tasks/workers.py", "import fastvocab.experiments.tune", "Rooms import one way"),
        # The harnesses and the training code sit side by side, independent.
        ("experiments/tune.py", "import fastvocab.training.demo_model", "Rooms import one way"),
        ("decoding/search.py", "import ray", "The core runs without Ray or MLflow"),
        # The package's lazy Translator is the one import of the pipeline the contracts ignore: any other one
        # in the package's __init__ is a path from every room (which import it for __version__) upwards.
        ("__init__.py", "import fastvocab.pipeline.bulk_driver", "Rooms import one way"),
        # The switches sit below every room: they read none.
        ("switches.py", "import fastvocab.artifacts_schema.digest", "Rooms import one way"),
    ],
)
def test_a_planted_import_breaks_its_contract(package, tmp_path, module, line, contract):
    res = lint(planted(package, tmp_path, module, line))
    assert res.returncode != 0
    status = contract_status(res.stdout)
    broken = [name for name, state in status.items() if name.startswith(contract) and state == "BROKEN"]
    assert broken, res.stdout


def contract_status(stdout: str) -> dict[str, str]:
    """Contract name -> KEPT | BROKEN, from lint-imports' listing (a long name wraps over lines; a contract
    with ignored imports says how many after its state)."""
    listing = stdout.split("dependencies.", 1)[-1].split("Contracts:", 1)[0]
    text = " ".join(listing.split())
    text = text.lstrip("- ")
    return {
        name.strip("- "): state
        for name, state in re.findall(r"(.+?) (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?(?: |$)", text)
    }
