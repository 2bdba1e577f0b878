"""``fastvocab tune`` on the tiny model: states dumped by the dump task, candidate maps built with Faiss
k-means, successive halving on the dev split, the test-split check, the record, MLflow; the choice is within
the budget on the dev split and the fastest of those within it as measured; an unmeetable budget is a
one-line error."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
import torch

from fastvocab.pipeline.cli import main
from tests.conftest import parent_and_children, slow_down, synthetic_sentences, write_en_it_split

pytest.importorskip("faiss")

# min_count 100000 prunes every set to nothing: those candidates make search errors, the others need not.
# Confidence 0 compares the rates themselves: 8 dev sentences bound no rate below 25% at 90%.
GRID = (
    "--confidence",
    "0",
    "--r",
    "3,6",
    "--k",
    "1,3",
    "--min-count",
    "1,100000",
    "--selection",
    "union,per-row",
    "--rungs",
    "4,8",
)


def _dump(model_dir: Path, states: Path, texts: list[str], k: int, beams: tuple[int, ...]) -> None:
    """en-it states of ``texts`` (top-``k`` ids a step) under ``states``, along each of ``beams``, by the dump
    task, in shards of half the sentences."""
    from fastvocab.artifacts_schema.hidden_states import beam_root
    from fastvocab.tasks.context import RunContext, describe_model
    from fastvocab.tasks.dump import DumpDecoder, DumpSettings, plan_shards, run_dump_shard

    threads = torch.get_num_threads()
    decoder = DumpDecoder(
        RunContext(describe_model(model_dir), torch_threads=1), DumpSettings(k=k, max_len=8, batch_size=8)
    )
    for beam in beams:
        along = decoder.along(beam)
        for spec in plan_shards("en-it", list(range(len(texts))), texts, shard_sentences=len(texts) // 2):
            run_dump_shard(along, spec, beam_root(states, beam))
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_model_dir) -> Path:
    """A work dir with en-it states (top-3 per step) from the dump task, and a corpus with dev and test."""
    root = tmp_path_factory.mktemp("tune")
    _dump(tiny_model_dir, root / "work" / "states", synthetic_sentences("en", 40, seed=3), k=3, beams=(1,))
    write_en_it_split(root / "corpus", "dev", 8, seed=11)
    write_en_it_split(root / "corpus", "test", 6, seed=12)
    return root


def _tune(capsys, work: Path, tiny_model_dir: Path, *extra: str) -> tuple[int, str, str]:
    argv = ["tune", "--model", str(tiny_model_dir), "--work-dir", str(work / "work")]
    argv += [
        "--corpus",
        str(work / "corpus"),
        "--src-lang",
        "en",
        "--tgt-lang",
        "it",
        "--max-len",
        "8",
        "--batch-size",
        "4",
    ]
    argv += ["--threads", "1", *GRID, *extra]
    rc = main(argv)
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_tune_picks_the_fastest_configuration_within_the_budget(
    work, tiny_model_dir, tmp_path, capsys, monkeypatch
):
    import time

    from fastvocab.experiments import tune as tt

    slow_down(monkeypatch, tt, "decode_passes", 0.2)  # a rung's decoding lasts at least 0.2 s
    before = time.time()
    rc, out, err = _tune(capsys, work, tiny_model_dir, "--budget", "0.25", "--json", str(tmp_path / "t.json"))
    after = time.time()
    record = json.loads((tmp_path / "t.json").read_text())
    assert rc == (0 if record["within_budget_on_test"] else 3), err  # 3: the choice missed it on test
    assert record == json.loads((work / "work" / "tune" / "en-it-beam1" / "tune.json").read_text())
    rows, chosen = record["rows"], record["chosen"]
    assert record["candidates"] == 16 and {r["rung"] for r in rows} == {0, 1}
    first = [r for r in rows if r["rung"] == 0]
    assert len(first) == 16  # every candidate tried on the first rung
    # the empty sets' errors (more than the final rung's budget of 2 sentences) end them on the first rung
    assert record["allowed_error_sentences"] == 2
    for r in first:
        assert (r["decided"] == "errors") == (r["search_error_sentences"] > 2)
    assert any(r["decided"] == "errors" for r in first)
    final = [r for r in rows if r["rung"] == 1]
    assert 1 <= len(final) <= 11  # the fastest third, the fastest error-free one, each set size's fastest
    sizes = {(r["k"], r["min_count"]) for r in first if r["decided"] != "errors"}
    assert {(r["k"], r["min_count"]) for r in final} == sizes
    # within the budget on the dev split, and the fastest of those within it as measured
    assert chosen["rung"] == 1 and chosen["sentences"] == 8 and chosen["search_errors"] <= 0.25
    within = [r for r in final if r["search_errors"] <= 0.25]
    assert chosen["speed_ratio"] == max(r["speed_ratio"] for r in within)
    # every row: the yardstick's agreement, within its bounds
    for r in rows:
        assert 0 <= r["search_errors"] <= 1 - r["identical"] + 1e-9 and r["sent_per_s"] > 0
    # the deciding rung and the test check: speed as the median of paired passes, their spread judged
    for row in [*final, record["test"]]:
        passes = row["speed_ratio_passes"]
        assert 3 <= len(passes) <= 6
        assert abs(row["speed_ratio"] - statistics.median(passes)) <= 1e-3
        assert row["speed_stable"] or len(passes) == 6  # more passes until steady, or flagged
    assert all("speed_ratio_passes" not in r for r in first)  # earlier rungs: one pass, as --repeats says
    # the test split was decoded with the choice and judged against the budget
    test = record["test"]
    assert test["split"] == "test" and test["label"] == chosen["label"] and test["sentences"] == 6
    assert record["within_budget_on_test"] == (test["search_errors"] <= 0.25)
    # the chosen map: saved, loadable for this model, with the chosen r and K, usable by translate
    from fastvocab.artifacts_schema.cluster_map import load_cluster_map
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    adapter = Seq2SeqAdapter.load(tiny_model_dir)
    cmap = load_cluster_map(record["map_path"], expect_fingerprint=adapter.fingerprint)
    assert (cmap.manifest.r, cmap.manifest.k) == (chosen["r"], chosen["k"]) and cmap.normaliser is not None
    assert cmap.manifest.probes == chosen["probes"] == 1
    keys = chosen["config_keys"]
    assert keys == {
        "kmeans.r": chosen["r"],
        "maps.k": chosen["k"],
        "maps.min_count": chosen["min_count"],
        "maps.probes": 1,
        "maps.beams": [1],
        "maps.normaliser_rank": 32,
        "translate.selection": chosen["selection"],
        "translate.beam": 1,
    }
    assert record["meta"]["state_beams"] == [1]
    assert f"map:    {record['map_path']}" in out and f"--set kmeans.r={chosen['r']}" in out
    assert "--set maps.beams=[1]" in out
    assert f"chosen: {chosen['label']}" in out
    # the table artifacts and MLflow: one parent run, one child run per tried configuration
    folder = Path(record["map_path"]).parent
    assert (folder / "tune.csv").read_text().count("\n") == len(rows) + 1
    assert chosen["label"] in (folder / "tune.md").read_text()
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'work' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("fastvocab-tune").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 1 + 16
    parent = parents[0]
    # a choice that misses the budget on test is no finished tune: the run says so
    on_test = record["within_budget_on_test"]
    assert parent.info.status == ("FINISHED" if on_test else "FAILED")
    assert parent.data.tags["fastvocab.tune"] == ("chosen" if on_test else "budget-not-met-on-test")
    assert parent.data.tags["fastvocab.tune.kmeans.r"] == str(chosen["r"])
    assert parent.data.metrics["chosen_dev_search_errors"] == chosen["search_errors"]
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {"tune.json", "tune.csv", "tune.md"}
    children = {r.data.params["decided"] for r in runs if r.info.run_id != parent.info.run_id}
    assert "chosen" in children
    # each configuration's child run spans its rungs' decoding, inside the parent's span of the command
    info, spans = parent_and_children(client.tracking_uri, "fastvocab-tune")
    assert int(before * 1000) <= info.start_time and info.end_time <= int(after * 1000) + 1
    for label in {r["label"] for r in rows}:
        mine = [r for r in rows if r["label"] == label]
        child = spans[f"tune:{label}"]
        assert child.start_time == int(mine[0]["started"] * 1000)
        assert child.end_time == int(mine[-1]["ended"] * 1000)
        assert child.end_time - child.start_time >= 200 * len(mine), label
        assert info.start_time <= child.start_time and child.end_time <= info.end_time
    # the rungs run one after the other: the first rung's work ends before the second's begins
    assert max(r["ended"] for r in first) <= min(r["started"] for r in final)


def test_probes_are_an_axis_and_a_shortlist_keeps_the_union():
    from fastvocab.experiments.tune import TuneSettings

    settings = TuneSettings(rs=(3,), ks=(1,), min_counts=(1,), probes=(4, 1))
    assert [c.label for c in settings.candidates(recorded_k=3)] == [
        "r=3 K=1 min_count=1 union",
        "r=3 K=1 min_count=1 per-row",
        "r=3 K=1 min_count=1 probes=4 union",
        "r=3 K=1 min_count=1 probes=4 per-row",
    ]
    assert settings.candidates(3)[-1].config_keys(1)["maps.probes"] == 4
    with_shortlist = TuneSettings(rs=(3,), ks=(1,), min_counts=(1,), shortlist="table")
    assert [c.selection for c in with_shortlist.candidates(3)] == ["union"]  # it joins a batch's union
    with pytest.raises(ValueError, match="per-row selection does not take one"):
        TuneSettings(selections=("per-row",), shortlist="table")
    with pytest.raises(ValueError, match="probes"):
        TuneSettings(probes=(0,))


def _row(label: str, errors: int, n: int, speed: float) -> dict:
    return {
        "label": label,
        "search_errors": errors / n,
        "search_error_sentences": errors,
        "sentences": n,
        "speed_ratio": speed,
    }


def test_the_choice_keeps_a_margin_its_dev_rate_bounds():
    from fastvocab.experiments.tune import (
        TuneSettings,
        allowed_errors,
        choose,
        error_bound,
        sentences_for_budget,
    )

    # Clopper-Pearson's one-sided bound: 0 errors in n at 90% is 1 - 0.1^(1/n)
    assert error_bound(0, 100, 0.9) == pytest.approx(1 - 0.1 ** (1 / 100))
    assert error_bound(4, 100, 0.9) == pytest.approx(0.0783, abs=5e-4)  # 4 in 100 is no proof of 5%
    assert error_bound(4, 100, 0.0) == 0.04 and error_bound(3, 3, 0.9) == 1.0
    assert allowed_errors(0.05, 100, 0.9) == 1 and allowed_errors(0.05, 100, 0.0) == 5
    assert allowed_errors(0.01, 100, 0.9) == -1  # not even an error-free run of 100 bounds 1%
    assert sentences_for_budget(0.05, 0.9) == 45 and sentences_for_budget(0.01, 0.9) == 230
    assert error_bound(0, 230, 0.9) <= 0.01 < error_bound(0, 229, 0.9)
    # the last rung grows to what an error-free run needs; --rungs that already reach it are kept
    assert TuneSettings(budget=0.01, grid="quick").resolved_rungs == (30, 230)
    assert TuneSettings(budget=0.05, grid="quick").resolved_rungs == (30, 100)
    assert TuneSettings(budget=0.01, confidence=0.0, grid="quick").resolved_rungs == (30, 100)
    # the fastest at 4 errors in 100 passed a 5% budget on its rate; its bound leaves it out
    rows = [_row("fast", 4, 100, 3.0), _row("safe", 1, 100, 2.0)]
    assert choose(rows, 0.05, "speed_ratio")["label"] == "fast"
    assert choose(rows, 0.05, "speed_ratio", confidence=0.9)["label"] == "safe"
    with pytest.raises(ValueError, match="bounds a rate at 0"):
        TuneSettings(budget=0.0)
    with pytest.raises(ValueError, match="confidence"):
        TuneSettings(confidence=1.0)


def test_a_budget_nothing_meets_is_a_clear_error(work, tiny_model_dir, tmp_path, capsys):
    from fastvocab.experiments.tune import BudgetNotMet, choose

    rows = [_row("a", 2, 10, 2.0), _row("b", 1, 10, 1.5)]
    with pytest.raises(
        BudgetNotMet, match=r"lowest is b \(10\.0% measured on 10 sentences\), so --budget 10% is reachable"
    ):
        choose(rows, 0.05, "speed_ratio")
    assert choose(rows, 0.15, "speed_ratio")["label"] == "b"
    assert choose(rows, 0.2, "speed_ratio")["label"] == "a"
    # on the model: sets pruned to nothing (min_count far above any count) cannot meet a budget of 0
    argv = ("--min-count", "100000", "--budget", "0", "--no-mlflow", "--output", str(tmp_path), "--k", "1")
    rc, out, err = _tune(capsys, work, tiny_model_dir, *argv)
    assert rc == 2 and "no configuration is within the search-error budget of 0%" in err
    assert "map:" not in out
    record = json.loads((tmp_path / "en-it-beam1" / "tune.json").read_text())
    assert record["chosen"] is None and record["rows"]


def test_bad_options_are_one_line_errors(work, tiny_model_dir, capsys):
    assert _tune(capsys, work, tiny_model_dir, "--budget", "lots", "--no-mlflow")[0] == 2
    rc, _, err = _tune(capsys, work, tiny_model_dir, "--k", "9", "--no-mlflow")
    assert rc == 2 and "exceeds the K=3 the dump recorded" in err
    rc, _, err = _tune(capsys, work, tiny_model_dir, "--states", str(work / "nowhere"), "--no-mlflow")
    assert rc == 2 and "no hidden-state shards" in err
    rc, _, err = _tune(capsys, work, tiny_model_dir, "--probes", "0", "--no-mlflow")
    assert rc == 2 and "probes" in err
    rc, _, err = _tune(capsys, work, tiny_model_dir, "--with-shortlist", str(work / "nowhere"), "--no-mlflow")
    assert rc == 2 and "--with-shortlist" in err and "no shortlist artifact" in err
    rc, _, err = _tune(
        capsys, work, tiny_model_dir, "--by", "coverage", "--with-shortlist", "x", "--no-mlflow"
    )
    assert rc == 2 and "tune with a shortlist by decode" in err


@pytest.fixture(scope="module")
def beam_work(tmp_path_factory, tiny_model_dir, work) -> Path:
    """``work``'s corpus and a states root with the greedy path's states and beam 2's (top-4 per state)."""
    root = tmp_path_factory.mktemp("tune-beams")
    _dump(tiny_model_dir, root / "work" / "states", synthetic_sentences("en", 30, seed=5), k=4, beams=(1, 2))
    (root / "corpus").symlink_to(work / "corpus")
    return root


def test_tune_at_a_beam_reads_the_states_of_every_dumped_beam(beam_work, tiny_model_dir, capsys, caplog):
    from fastvocab.artifacts_schema.cluster_map import load_cluster_map
    from fastvocab.artifacts_schema.hidden_states import beam_root, shard_rows, validate_direction

    states = beam_work / "work" / "states"
    rows = {b: sum(shard_rows(validate_direction(beam_root(states, b), "en-it"))) for b in (1, 2)}
    argv = ["tune", "--model", str(tiny_model_dir), "--work-dir", str(beam_work / "work")]
    argv += ["--corpus", str(beam_work / "corpus"), "--src-lang", "en", "--tgt-lang", "it", "--max-len", "8"]
    argv += ["--batch-size", "4", "--threads", "1", "--beam", "2", "--r", "3", "--min-count", "1"]
    argv += [
        "--selection",
        "union",
        "--rungs",
        "4,6",
        "--budget",
        "0.5",
        "--no-mlflow",
        "--normaliser-rank",
        "3",
    ]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    record = json.loads((beam_work / "work" / "tune" / "en-it-beam2" / "tune.json").read_text())
    # both beams' states, and at beam 2 the grid's K are 2, 3 and 4 (2 x beam: what beam search keeps a row)
    assert record["meta"]["state_beams"] == [1, 2]
    assert record["meta"]["ks"] == [2, 3, 4] and record["candidates"] == 3
    assert record["chosen"]["config_keys"]["maps.beams"] == [1, 2] and "--set maps.beams=[1,2]" in out
    cmap = load_cluster_map(record["map_path"])
    assert cmap.manifest.extra["stored_states"] == rows[1] + rows[2]
    assert cmap.normaliser is not None and cmap.normaliser.curv.shape[1:] == (3, 3)
    assert record["chosen"]["config_keys"]["maps.normaliser_rank"] == 3

    # --state-beams picks the greedy path's alone (with a warning that beam 2 is then not served) ...
    argv_greedy = [*argv, "--state-beams", "1", "--output", str(beam_work / "greedy-only")]
    assert main(argv_greedy) == 0
    capsys.readouterr()
    assert "tuning for beam 2 from states dumped along beams [1] only" in caplog.text
    record = json.loads((beam_work / "greedy-only" / "en-it-beam2" / "tune.json").read_text())
    assert record["meta"]["state_beams"] == [1]
    assert load_cluster_map(record["map_path"]).manifest.extra["stored_states"] == rows[1]
    # ... and a beam without states is a one-line error
    assert main([*argv, "--state-beams", "1,3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no hidden-state shards for en-it" in err and "beam=3" in err and len(err.splitlines()) == 1


def test_tune_by_coverage_picks_the_cheapest_point_within_the_budget(work, tiny_model_dir, tmp_path, capsys):
    """No candidate decoded: every (r, K, probes) point predicted from full softmax's dev path; the choice is
    the point within the budget whose union batch computes fewest columns, checked on the test split."""
    argv = ["tune", "--by", "coverage", "--model", str(tiny_model_dir), "--work-dir", str(work / "work")]
    argv += [
        "--corpus",
        str(work / "corpus"),
        "--src-lang",
        "en",
        "--tgt-lang",
        "it",
        "--max-len",
        "8",
        "--batch-size",
        "4",
    ]
    argv += ["--r", "3,6", "--k", "1,3", "--probes", "1,2", "--threads", "1", "--budget", "0.5"]
    argv += ["--output", str(tmp_path)]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    record = json.loads((tmp_path / "en-it-coverage" / "coverage.json").read_text())
    full = record["dumped_sentences"]
    assert full == 40 and record["sizes"][-1] == 40
    points = [r for r in record["rows"] if r["sentences"] == full]
    assert len(points) == 2 * 2 * 2
    chosen = record["chosen"]
    assert chosen["sentence_differ"] <= 0.5
    within = [r for r in points if r["sentence_differ"] <= 0.5]
    assert chosen["union_batch"] == min(r["union_batch"] for r in within)
    assert record["test"]["sentences"] == 6 and 0 <= record["test"]["sentence_differ"] <= 1
    assert f"maps.probes: {chosen['probes']}" in out and "| r | K | probes |" in out
    # a budget nothing meets: a one-line error naming the best point
    argv[argv.index("0.5")] = "-1"
    assert main(argv) == 2
    assert "no (r, K, probes) point is within" in capsys.readouterr().err
    # beam search is not predicted by coverage
    assert main([*argv, "--beam", "2"]) == 2
    assert "--by coverage predicts greedy outputs" in capsys.readouterr().err
