"""``fastvocab bench methods`` on the tiny model (every method, a tiny grid: the JSON rows, the PNG,
MLflow) and ``fastvocab translate --method lsh|graph|shortlist`` end to end, with artifacts of another
direction or method refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fastvocab.pipeline.cli import main
from tests.conftest import parent_and_children, slow_down, synthetic_sentences, write_en_it_split

pytest.importorskip("faiss")

ROW_FIELDS = (
    "direction",
    "beam",
    "method",
    "label",
    "sentences",
    "identical",
    "search_errors",
    "bleu",
    "chrf",
    "bleu_full",
    "candidates_per_row",
    "sent_per_s",
    "sent_per_s_full",
    "speed_ratio",
    "projection_seconds",
    "projection_ratio",
    "rss_peak_mib",
    "memory_method",
    "build_seconds",
    "artifact_bytes",
)


@pytest.fixture(scope="module")
def adapter(tiny_model_dir):
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    return Seq2SeqAdapter.load(tiny_model_dir)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    write_en_it_split(root, "train", 60, seed=0)
    write_en_it_split(root, "test", 6, seed=1)
    return root


@pytest.fixture(scope="module")
def work(tmp_path_factory, adapter, corpus) -> Path:
    """A work dir with an en-it cluster map, and an lsh index and an en-it shortlist where the methods stage
    puts them."""
    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.kernels.lsh import LshParams
    from fastvocab.tasks import methods as tm
    from fastvocab.tasks.shortlist import ShortlistParams
    from tests.layers import map_from_sets

    root = tmp_path_factory.mktemp("work")
    rng = np.random.default_rng(0)
    n = adapter.n_vocab
    sets = [rng.choice(n, n // 3, replace=False).tolist() for _ in range(3)]
    cmap = map_from_sets(rng.standard_normal((3, adapter.d_model)), sets, n, adapter.fingerprint)
    save_cluster_map(cmap, root / "maps" / "en-it")
    methods = root / "methods"
    sl = ShortlistParams(k=20, frequent=100, iterations=2)
    inputs = tm.BuildInputs.from_adapter(adapter, "en-it", corpus)
    tm.build_method_index("shortlist", inputs, sl, tm.index_dir(methods, "shortlist", "en-it"))
    lsh = tm.BuildInputs.from_adapter(adapter)
    tm.build_method_index("lsh", lsh, LshParams(bits=64), tm.index_dir(methods, "lsh"))
    return root


def _cli(capsys, *argv: object) -> tuple[int, str, str]:
    rc = main([str(a) for a in argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


# --------------------------------------------------------------------------------------------- bench methods


def test_bench_methods_writes_every_method_the_plot_and_mlflow(
    tiny_model_dir, corpus, work, tmp_path, capsys, monkeypatch
):
    import time

    from fastvocab.experiments import bench_methods as bm

    slow_down(monkeypatch, bm, "decode_passes", 0.2)  # a beam's passes last at least 0.2 s
    out = tmp_path / "results" / "methods.json"
    before = time.time()
    rc, stdout, err = _cli(
        capsys,
        *("bench", "methods", "--quick", "--model", tiny_model_dir, "--corpus", corpus),
        *("--work-dir", work, "--directions", "en-it", "--beams", "1,2", "--sentences", 4),
        *("--max-len", 5, "--threads", 1, "--output", out),
    )
    after = time.time()
    assert rc == 0, err
    record = json.loads(out.read_text())
    # --quick, the earlier spelling of the default grid, still parses; the record names the grid
    assert record["command"].startswith("fastvocab bench methods") and "--grid quick" in record["command"]
    meta = record["meta"]
    assert meta["loadavg_before"] and meta["model_fingerprint"] and meta["grid"] == "quick"
    rows = record["results"]
    want = {"full", "clustered", "per-row", "lsh", "graph", "shortlist"}
    for beam in (1, 2):
        assert {r["method"] for r in rows if r["beam"] == beam} == want
    for row in rows:
        missing = [f for f in ROW_FIELDS if f not in row]
        assert not missing, (row["label"], missing)
        assert 0 <= row["search_errors"] <= 1 - row["identical"] + 1e-9
        assert row["candidates_per_row"] > 0 and row["sent_per_s"] > 0
    full = [r for r in rows if r["method"] == "full"]
    assert all(r["identical"] == 1 and r["search_errors"] == 0 and r["speed_ratio"] == 1 for r in full)
    assert {r["candidates_per_row"] for r in full} == {float(record["meta"]["n_vocab"])}
    # lsh and shortlist came from the work dir's methods root, graph was built here
    by = {r["method"]: r for r in rows}
    assert by["lsh"]["artifact"].endswith("lsh/all") and by["shortlist"]["artifact"].endswith("en-it")
    assert by["graph"]["artifact"] == "built" and by["graph"]["build_seconds"] > 0
    assert by["graph"]["artifact_bytes"] > 0 and by["clustered"]["artifact_bytes"] > 0
    assert set(record["pareto_front"]) == {"en-it beam 1", "en-it beam 2"}
    png = out.with_suffix(".png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "lsh k=500" in stdout
    # MLflow: a parent run with the JSON and the PNG, one child run per point
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'mlflow.db'}")
    exp = client.get_experiment_by_name("fastvocab-bench")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 1 + len(rows)
    names = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"methods.json", "methods.png"} <= names
    # each point's child run spans its decoding (its row's span), inside the parent's span of the command
    info, spans = parent_and_children(client.tracking_uri, "fastvocab-bench")
    assert int(before * 1000) <= info.start_time and info.end_time <= int(after * 1000) + 1
    for row in rows:
        child = spans[f"bench-methods:{row['direction']}:beam{row['beam']}:{row['label']}"]
        assert (child.start_time, child.end_time) == (int(row["started"] * 1000), int(row["ended"] * 1000))
        assert child.end_time - child.start_time >= 200, row["label"]
        assert info.start_time <= child.start_time and child.end_time <= info.end_time
        assert "started" not in client.get_run(child.run_id).data.metrics  # a time, not a measurement
    # the beams run one after the other: beam 1's points end before beam 2's begin
    assert max(r["ended"] for r in rows if r["beam"] == 1) <= min(
        r["started"] for r in rows if r["beam"] == 2
    )


def test_bench_methods_point_replaces_a_methods_grid(tiny_model_dir, corpus, work, tmp_path, capsys):
    out = tmp_path / "points.json"
    rc, _, err = _cli(
        capsys,
        *("bench", "methods", "--model", tiny_model_dir, "--corpus", corpus, "--work-dir", work),
        *("--methods", "full,clustered,shortlist", "--directions", "en-it", "--beams", "1"),
        *("--point", "shortlist:k=5,frequent=10", "--point", "clustered:probes=2"),
        *("--sentences", 3, "--max-len", 4, "--threads", 1, "--output", out),
    )
    assert rc == 0, err
    rows = json.loads(out.read_text())["results"]
    assert sorted(r["label"] for r in rows) == ["clustered probes=2", "full", "shortlist k=5 frequent=10"]
    by = {r["method"]: r for r in rows}
    assert by["clustered"]["options"]["probes"] == 2  # passed on to the projection, not dropped
    assert by["shortlist"]["options"]["k"] == 5 and by["shortlist"]["options"]["frequent"] == 10


@pytest.mark.parametrize(
    ("point", "says"),
    [("lasso:k=1", "unknown method 'lasso'"), ("shortlist:k", "'k' is not KEY=VALUE"), ("lsh:k=9", "lsh")],
)
def test_bench_methods_refuses_a_bad_point_in_one_line(tiny_model_dir, corpus, work, capsys, point, says):
    rc, _, err = _cli(
        capsys,
        *("bench", "methods", "--model", tiny_model_dir, "--corpus", corpus, "--work-dir", work),
        *("--methods", "full,shortlist", "--point", point),
    )
    assert rc != 0 and says in err and len(err.strip().splitlines()) == 1, err


def test_pareto_front_keeps_the_undominated_points():
    from fastvocab.experiments.bench_methods import pareto_front

    pts = [(0.0, 1.0), (0.1, 2.0), (0.2, 1.5), (0.5, 3.0), (0.0, 0.9)]
    assert pareto_front(pts) == [0, 1, 3]


# ------------------------------------------------------------------------------------------- translate CLI


@pytest.fixture
def source_file(tmp_path) -> Path:
    path = tmp_path / "in.txt"
    path.write_text("\n".join(synthetic_sentences("en", 5, seed=4)) + "\n")
    return path


def _translate(capsys, model, src, out, *flags, lang=("en", "it")):
    return _cli(
        capsys,
        *("translate", "--model", model, "--src-lang", lang[0], "--tgt-lang", lang[1], "-i", src, "-o", out),
        *("--max-len", 5, "--no-progress", *flags),
    )


@pytest.mark.parametrize(
    "flags",
    [
        ("--method", "lsh", "--candidates", 40),  # codes hashed in memory
        ("--method", "lsh", "--candidates", 40, "--index", "{work}/methods"),  # a methods root
        ("--method", "shortlist", "--index", "{work}", "--frequent", 50, "--scope", "batch"),  # a work dir
        ("--method", "shortlist", "--index", "{work}/methods/shortlist/en-it", "--candidates", 5),
        ("--method", "clustered", "--clusters", "{work}/maps", "--with-shortlist", "{work}"),
    ],
)
def test_translate_cli_other_methods_end_to_end(tiny_model_dir, work, source_file, tmp_path, capsys, flags):
    out = tmp_path / "out.txt"
    flags = [str(f).format(work=work) for f in flags]
    rc, _, err = _translate(capsys, tiny_model_dir, source_file, out, *flags)
    assert rc == 0, err
    assert len(out.read_text().splitlines()) == 5
    assert f"[{flags[1]}, beam 1" in err


@pytest.mark.parametrize(
    ("flags", "lang", "message"),
    [
        (
            ("--method", "shortlist", "--index", "{work}/methods/shortlist/en-it"),
            ("it", "en"),
            "for en-it, not",
        ),
        (("--method", "lsh", "--index", "{work}/methods/shortlist/en-it"), ("en", "it"), "not a lsh one"),
        (("--method", "graph", "--index", "{work}"), ("en", "it"), "no graph artifact there"),
        (
            (
                "--method",
                "shortlist",
            ),
            ("en", "it"),
            "needs --index",
        ),
        (("--method", "lsh", "--frequent", 5), ("en", "it"), "--frequent applies to --method shortlist"),
        (
            (
                "--method",
                "clustered",
                "--clusters",
                "{work}/maps",
                "--with-shortlist",
                "{work}/methods/lsh/all",
            ),
            ("en", "it"),
            "--with-shortlist",
        ),
        (("--method", "full", "--with-shortlist", "{work}"), ("en", "it"), "applies to --method clustered"),
    ],
)
def test_translate_cli_refuses_foreign_or_missing_artifacts_in_one_line(
    tiny_model_dir, work, source_file, tmp_path, capsys, flags, lang, message
):
    out = tmp_path / "out.txt"
    flags = [str(f).format(work=work) for f in flags]
    rc, _, err = _translate(capsys, tiny_model_dir, source_file, out, *flags, lang=lang)
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err
    assert not out.exists()


def test_translate_help_names_the_methods_options(capsys):
    with pytest.raises(SystemExit):
        main(["translate", "--help"])
    text = capsys.readouterr().out
    for flag in ("--index", "--candidates", "--ef-search", "--frequent", "--scope", "shortlist"):
        assert flag in text
