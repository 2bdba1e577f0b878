"""``fastvocab experiment paper`` on the tiny model: every table and figure written and logged as one parent
run with a child per part, readable by ``fastvocab report``; the table arithmetic on hand-made rows; the
states loader's sentence budget; a direction without stored states dumped from a monolingual file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from fastvocab.pipeline.cli import main
from tests.conftest import slow_down, synthetic_sentences, write_en_it_split

pytest.importorskip("faiss")
pytest.importorskip("mlflow")

PARTS = ("table2", "table3", "table4", "table5", "figure2", "figure3", "figure4")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """en-it train/dev/test, and French monolingual text (Figure 2's pool fr-en reads it)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from fastvocab.artifacts_schema.corpus import MONO_SCHEMA, mono_path

    root = tmp_path_factory.mktemp("corpus")
    write_en_it_split(root, "train", 40, seed=0)
    write_en_it_split(root, "dev", 6, seed=2)
    write_en_it_split(root, "test", 6, seed=1)
    path = mono_path(root, "fr")
    path.parent.mkdir(parents=True)
    texts = synthetic_sentences("fr", 30)
    pq.write_table(pa.table({"id": list(range(30)), "text": texts}, schema=MONO_SCHEMA), path)
    return root


@pytest.fixture(scope="module")
def work(tmp_path_factory, tiny_model_dir, corpus) -> Path:
    """A work dir as the pipeline leaves it: it-en states under states/, an it-en map under maps/ (built
    here with the experiment's own pieces: dump, k-means, counts)."""
    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.artifacts_schema.fingerprint import ModelRef
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
    from fastvocab.experiments import experiment_paper as ep
    from fastvocab.tasks.maps import MapParams, make_cluster_map

    work = tmp_path_factory.mktemp("work")
    adapter = Seq2SeqAdapter.load(tiny_model_dir)
    ref = ModelRef(str(tiny_model_dir), adapter.fingerprint, adapter.d_model, adapter.n_vocab)
    settings = ep.PaperSettings(max_len=12, niter=4)
    files = ep.dump_direction(ref, "cpu", corpus, "it-en", 40, work / "states", settings)
    states = ep.load_states(files)
    centroids = ep.kmeans(states, 8, settings)
    counter = ep.active_counters(states, centroids, (5,), adapter.n_vocab)[5]
    cmap = make_cluster_map(
        centroids, counter, MapParams(k=5), model_fingerprint=adapter.fingerprint, name="it-en", niter=4,
        seed=1234,
    )  # fmt: skip
    save_cluster_map(cmap, work / "maps" / "it-en")
    return work


def test_paper_end_to_end(tiny_model_dir, corpus, work, tmp_path, monkeypatch):
    import time

    from fastvocab.experiments import bench_methods as bm
    from fastvocab.experiments import experiment_paper as ep

    # work of a known least length: each decoding run's passes and Figure 2 take at least 0.2 s
    slow_down(monkeypatch, bm, "decode_passes", 0.2)
    slow_down(monkeypatch, ep, "figure2", 0.2)
    out = tmp_path / "out"
    argv = [
        "experiment", "paper", "--quick",
        "--model", str(tiny_model_dir), "--corpus", str(corpus), "--work-dir", str(work),
        "--directions", "it-en", "--fig-direction", "it-en", "--fig2-pool", "fr-en",
        "--sentences", "4", "--set2-sentences", "4", "--fig3-sentences", "4", "--max-len", "12",
        "--fig2-rs", "4,8", "--fig2-sentences", "20", "--fig3-rs", "4,8", "--fig4-r", "8",
        "--ks", "1,3", "--niter", "4", "--threads", "1", "--output", str(out),
    ]  # fmt: skip
    before = time.time()
    assert main(argv) == 0
    after = time.time()
    for name in ("table2", "table3", "table4", "table5"):
        assert (out / f"{name}.csv").is_file() and (out / f"{name}.md").read_text().startswith("# Table")
    for name in ("figure2", "figure3", "figure4"):
        assert (out / f"{name}.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((out / "paper.json").read_text())
    assert record["meta"]["loadavg_before"] and record["command"].startswith("fastvocab experiment paper")

    # Tables: one row per direction and setting, shares within range, set 2 read from the dev split.
    t2 = record["tables"]["table2"]
    assert [(r["beam"], r["batch"]) for r in t2] == [(1, 1), (2, 20)]
    for r in t2:
        assert 0 < r["active_pct"] <= 100 and r["full_us"] > 0 and r["clustered_us"] > 0
        assert r["active_columns"] <= r["n_vocab"]
    t3 = record["tables"]["table3"]
    assert [r["direction"] for r in t3] == ["it-en", "XE AVG"]
    for tag in ("b1_n1", "b2_n20"):
        assert 0 <= t3[0][f"search_err_pct_{tag}"] <= 100 - t3[0][f"identical_pct_{tag}"] + 1e-9
        assert t3[0][f"sentences_{tag}"] == 4
    assert {r["split"] for r in record["bench_rows"] if r["set"] == 2} == {"dev"}
    t5 = record["tables"]["table5"][0]
    assert t5["rss_peak_full_mib"] > 0 and t5["map_bytes"] > 0

    # Figure 2: the target-only map pools it-en's and fr-en's states (fr-en dumped from the mono file).
    fig2 = {(r["scope"], r["r"]): r for r in record["figure2"]}
    assert set(fig2) == {(s, r) for s in ("source+target", "target only") for r in (4, 8)}
    assert fig2[("target only", 4)]["states"] > fig2[("source+target", 4)]["states"]
    assert fig2[("source+target", 4)]["sentences"] == 20
    assert record["meta"]["states"]["fr-en"]["origin"] == "dumped"
    assert record["meta"]["states"]["it-en"]["origin"] == "stored"
    # Figures 3-4: every (r, K); a cluster's K=1 set lies inside its K=3 set (same assignment).
    assert {(r["r"], r["k"]) for r in record["figure3"]} == {(4, 1), (4, 3), (8, 1), (8, 3)}
    k1, k3 = np.array(record["figure4"]["k1"]), np.array(record["figure4"]["k3"])
    assert len(k1) == 8 and (k1 <= k3).all() and (k3 > 0).any()
    with (out / "figure4.csv").open() as f:
        assert len(list(csv.DictReader(f))) == 8

    # MLflow: one parent in the work dir's store, one child per part with its files; the report renders it.
    from mlflow import MlflowClient

    from fastvocab.pipeline.report import write_report

    uri = f"sqlite:///{(work / 'mlflow.db').resolve()}"
    client = MlflowClient(uri)
    (exp,) = [e for e in client.search_experiments() if e.name == "fastvocab-experiments"]
    (parent,) = client.search_runs([exp.experiment_id], "tags.`fastvocab.experiment` = 'paper'")
    children = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    by_part = {c.data.tags["fastvocab.stage"]: c for c in children}
    assert set(by_part) == set(PARTS)
    names = {a.path for a in client.list_artifacts(by_part["table3"].info.run_id)}
    assert names == {"table3.csv", "table3.md"}
    assert "figure3.png" in {a.path for a in client.list_artifacts(by_part["figure3"].info.run_id)}
    assert (
        by_part["figure2"].data.metrics["target only.r4.max_active_pct"]
        == fig2[("target only", 4)]["max_active_pct"]
    )
    # each part's child run spans its work, inside the parent's span of the command: Tables 2 and 3 the
    # two runs of set 1, Table 5 its last, Table 4 set 2's run after them, then Figure 2, then Figures 3
    # and 4 together (two decoding runs, one per r)
    span = {name: (c.info.start_time, c.info.end_time) for name, c in by_part.items()}
    assert span == {name: (int(a * 1000), int(b * 1000)) for name, (a, b) in record["spans"].items()}
    whole = (parent.info.start_time, parent.info.end_time)
    assert int(before * 1000) <= whole[0] and whole[1] <= int(after * 1000) + 1
    least = {"table2": 400, "table3": 400, "table5": 200, "table4": 200, "figure2": 200, "figure3": 400}
    for name, ms in least.items():
        assert span[name][1] - span[name][0] >= ms, name
    assert all(whole[0] <= start <= end <= whole[1] for start, end in span.values())
    assert span["table2"] == span["table3"] and span["table5"][1] == span["table2"][1]
    assert span["table2"][1] <= span["table4"][0] and span["table4"][1] <= span["figure2"][0]
    assert span["figure2"][1] <= span["figure3"][0] and span["figure3"] == span["figure4"]
    html, data = write_report(parent.info.run_id, tmp_path / "report.html", uri)
    text = html.read_text()
    assert len(data.descendants) == 7 and text.count("data:image/png;base64") >= 3
    assert "Table 3" in text and "XE AVG" in text


def test_table_arithmetic():
    from fastvocab.experiments import experiment_paper as ep

    def row(direction, method, **kw):
        base = {
            "set": 1, "split": "test", "direction": direction, "beam": 2, "batch": 20, "method": method,
            "tok_per_s": 100.0, "tok_per_s_full": 100.0, "candidate_fraction": 1.0,
            "candidates_per_row": 1000.0,
            "projection_seconds": 0.5, "projection_calls": 100, "bleu": 30.0, "bleu_full": 30.0,
            "identical": 1.0, "search_errors": 0.0, "sentences": 10, "rss_peak_mib": 500.0,
            "rss_delta_mib": 5.0, "memory_method": "VmHWM", "artifact_bytes": None,
        }  # fmt: skip
        return {**base, **kw}

    rows = []
    for d, speed, ident in (("en-it", 125.0, 0.9), ("en-fr", 150.0, 0.8), ("it-en", 110.0, 1.0)):
        rows.append(row(d, "full"))
        rows.append(
            row(d, "clustered", tok_per_s=speed, candidate_fraction=0.05, candidates_per_row=50.0,
                projection_seconds=0.1, identical=ident, search_errors=1 - ident, artifact_bytes=2**20)
        )  # fmt: skip
    settings = ep.PaperSettings(settings=((2, 20),))
    t2 = ep.table2(rows, settings)
    assert t2[0]["full_us"] == 5000.0 and t2[0]["clustered_us"] == 1000.0
    assert t2[0]["projection_speedup_x"] == 5.0 and t2[0]["active_pct"] == 5.0
    t3 = {r["direction"]: r for r in ep.table3(rows, settings)}
    assert t3["en-it"]["speedup_pct_b2_n20"] == 25.0 and t3["en-fr"]["identical_pct_b2_n20"] == 80.0
    assert t3["EX AVG"]["speedup_pct_b2_n20"] == 37.5  # mean of en-it and en-fr only
    assert t3["XE AVG"]["speedup_pct_b2_n20"] == 10.0
    assert ep.table5(rows, settings)[0]["map_bytes"] == 2**20
    assert ep.table4(rows, settings) == []  # no set-2 rows


def test_load_states_sentence_budget(tmp_path):
    import pyarrow.parquet as pq

    from fastvocab.artifacts_schema.hidden_states import ShardMeta, shard_table

    meta = ShardMeta(model_fingerprint="sha256:x", d=2, k=3, direction="it-en")
    sent = np.array([7, 7, 7, 3, 3, 9, 9, 9, 9], dtype=np.int64)
    step = np.array([0, 1, 2, 0, 1, 0, 1, 2, 3], dtype=np.int32)
    hidden = np.arange(18, dtype=np.float16).reshape(9, 2)
    topk = np.arange(27, dtype=np.int32).reshape(9, 3)
    path = tmp_path / "part-00000.parquet"
    pq.write_table(shard_table(meta, sent, step, hidden, topk), path)
    from fastvocab.experiments.experiment_paper import load_states

    two = load_states([path], 2)
    assert two.sentences == 2 and len(two.hidden) == 5 and two.topk[-1].tolist() == [12, 13, 14]
    every = load_states([path])
    assert every.sentences == 3 and len(every.hidden) == 9


def test_pool_without_source_text_is_refused_before_any_work(tiny_model_dir, corpus, work, tmp_path, capsys):
    """Figure 2's pool names a direction with no stored states and no text (es-en): one-line error naming
    it and the fix, exit 2, nothing written (the tables, minutes to hours, never ran)."""
    out = tmp_path / "out"
    argv = [
        "experiment", "paper", "--quick",
        "--model", str(tiny_model_dir), "--corpus", str(corpus), "--work-dir", str(work),
        "--directions", "it-en", "--fig-direction", "it-en", "--fig2-pool", "fr-en,es-en",
        "--states-cache", str(tmp_path / "cache"), "--no-mlflow", "--output", str(out),
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    named = err.split("no source text for ", 1)[1].split(" in ", 1)[0]
    assert named == "es-en" and "--pool-corpus" in err  # fr-en has text (the corpus' mono/fr.parquet)
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_pool_of_states_with_different_k_keeps_the_common_best_ids():
    from fastvocab.experiments.experiment_paper import States

    rng = np.random.default_rng(0)
    run = States(rng.normal(size=(3, 4)), np.arange(24).reshape(3, 8), 1, "run")  # a [1, 4]-beam dump: K 8
    here = States(rng.normal(size=(2, 4)), 100 + np.arange(10).reshape(2, 5), 1, "pool")  # dumped here: K 5
    pooled = States.concat([run, here], "run+pool")
    assert pooled.topk.shape == (5, 5) and pooled.hidden.shape == (5, 4) and pooled.sentences == 2
    assert pooled.topk[0].tolist() == [0, 1, 2, 3, 4] and pooled.topk[3].tolist() == [100, 101, 102, 103, 104]
