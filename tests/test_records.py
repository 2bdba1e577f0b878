"""Benchmark records: the current ones under benchmarks/results/, the superseded ones under
benchmarks/results/history/. What the product's docs cite must be current and must exist; the history folder's
index must name what it holds. Standard library only: the records are read as JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
HISTORY = RESULTS / "history"
# The product's docs: the README, every page under docs/ (the decision records too) and the benchmarks page.
CURRENT_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"\]\(([^)\s#]+)[^)]*\)")
# A record named in the text, outside a link: a dated file name (a glob, with *, is a pattern, not a file).
DATED = r"[a-z0-9][a-z0-9.-]*-20\d\d-\d\d-\d\d[\w.-]*\.(?:json|png|md|txt|html)"
NAMED = re.compile(rf"(?<![\w./*-])({DATED})(?![\w*])")


def cited_records(md: Path) -> tuple[list[Path], list[str]]:
    """The records ``md`` links (resolved), and the dated record names its text gives outside links."""
    text = md.read_text()
    links = [(md.parent / t).resolve() for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    results = RESULTS.resolve()
    records = [p for p in links if p.is_relative_to(results) or (not p.exists() and "results" in p.parts)]
    bare = NAMED.findall(LINK.sub("", text))
    return records, bare


def test_the_docs_cite_current_records_that_exist():
    assert len(CURRENT_DOCS) > 10, "the docs were not found: the check checks nothing"
    problems, cited = [], 0
    for md in CURRENT_DOCS:
        records, bare = cited_records(md)
        cited += len(records)
        where = md.relative_to(ROOT)
        problems += [f"{where}: {p.relative_to(ROOT)} is superseded" for p in records if HISTORY in p.parents]
        problems += [f"{where}: {p} does not exist" for p in records if not p.exists()]
        problems += [
            f"{where}: `{name}` is not a current record" for name in bare if not any(RESULTS.rglob(name))
        ] + [f"{where}: `{name}` is superseded" for name in bare if (HISTORY / name).exists()]
    assert cited > 50, "no record links found: the check checks nothing"
    assert not problems, "\n".join(problems)


def test_the_check_sees_a_superseded_or_missing_record(tmp_path):
    superseded = next(p for p in sorted(HISTORY.iterdir()) if p.suffix == ".json")
    doc = tmp_path / "docs" / "page.md"
    doc.parent.mkdir()
    doc.write_text(f"[a]({superseded}) [b]({RESULTS / 'nothing-cpu-2026-01-01.json'}) `{superseded.name}`\n")
    records, bare = cited_records(doc)
    assert [p for p in records if HISTORY in p.parents] == [superseded.resolve()]
    assert [p for p in records if not p.exists()] == [(RESULTS / "nothing-cpu-2026-01-01.json").resolve()]
    assert bare == [superseded.name]


def test_every_record_current_or_superseded_is_json_that_parses():
    """A record is read by path years later: both folders hold JSON that parses, each a dict."""
    records = sorted(RESULTS.rglob("*.json"))
    assert len(records) > 300 and any(HISTORY in p.parents for p in records)
    bad = []
    for path in records:
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            bad.append(f"{path.relative_to(ROOT)}: {exc}")
            continue
        if not isinstance(data, dict):
            bad.append(f"{path.relative_to(ROOT)}: not an object")
    assert not bad, "\n".join(bad)


def test_the_history_index_names_every_superseded_record():
    index = (HISTORY / "README.md").read_text()
    listed = set(re.findall(r"^\| \[([^\]]+)\]\(", index, re.M))
    held = {p.name for p in HISTORY.iterdir() if p.name != "README.md" and p.suffix != ".png"}
    assert listed == held, f"unlisted: {sorted(held - listed)}; listed, not there: {sorted(listed - held)}"
