"""The docs' results tables are rendered from the JSON records they cite (benchmarks/render_tables.py): a
table edited by hand, or a record changed without rendering again, fails here. No torch: the script reads
JSON."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def render_tables():
    spec = importlib.util.spec_from_file_location("render_tables", ROOT / "benchmarks" / "render_tables.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_table_equals_what_its_records_render(render_tables, capsys):
    rc = render_tables.main(["--check"])
    assert rc == 0, capsys.readouterr().out
    marked = [d for d in render_tables.docs(ROOT) if "<!-- table:" in d.read_text()]
    names = {n for d in marked for n in render_tables.MARKER.findall(d.read_text()) for n in [n[0]]}
    assert names == set(render_tables.TABLES), "every table the script knows appears in a doc"


def _copy_docs(render_tables, dst: Path) -> None:
    for doc in render_tables.docs(ROOT):
        target = dst / doc.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(doc, target)
    # the maps' build record, manifests and file sizes (the card's table reads them)
    shutil.copytree(ROOT / "models" / "demo-maps", dst / "models" / "demo-maps", dirs_exist_ok=True)
    shutil.copytree(
        ROOT / "benchmarks" / "results",
        dst / "benchmarks" / "results",
        ignore=shutil.ignore_patterns("*.png", "*.html"),
    )


def test_a_changed_record_fails_the_check_naming_the_doc(render_tables, tmp_path, capsys):
    _copy_docs(render_tables, tmp_path)
    assert render_tables.main(["--check", "--root", str(tmp_path)]) == 0
    name, run = next((n, r) for label, n, r in render_tables.PEER if label == "greedy, batch 32")
    record = tmp_path / "benchmarks" / "results" / name
    data = json.loads(record.read_text())
    data["runs"][run]["systems"]["fastvocab clustered fp32"]["speed_vs_full"] = 9.99
    record.write_text(json.dumps(data))
    capsys.readouterr()
    assert render_tables.main(["--check", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "README.md: a table differs" in out and "docs/methods.md" not in out
    assert render_tables.main(["--write", "--root", str(tmp_path)]) == 0
    assert "**9.99x**" in (tmp_path / "README.md").read_text()
    assert render_tables.main(["--check", "--root", str(tmp_path)]) == 0
