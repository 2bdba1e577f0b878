"""Fidelity: the exactness certificate of the clustered projection, ``exact_k`` decoding identical
to full softmax (greedy and beam, rows that fall back included), and the forced-decoding scorer.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from fastvocab.kernels import certificate, create_projection
from fastvocab.kernels.clustered_parts import SELECTIONS
from fastvocab.kernels.cpu_features import cpu_name
from tests.conftest import reference_logits, synthetic_sentences, write_en_it_split
from tests.layers import (
    decode,
    fingerprint,
    make,
    map_from_sets,
    map_from_states,
    projection_sets,
    random_layer,
    random_map,
    rows_near,
)

# ------------------------------------------------------------------------------------- the bound (property)


def inactive_truth(proj, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the exact max and logsumexp of the full logits over the columns its cluster leaves out."""
    full = torch.nn.functional.linear(h, proj.weight, proj.bias).double()  # (rows, N)
    clusters = proj.assign(h).tolist()
    mask = torch.ones_like(full, dtype=torch.bool)
    for row, c in enumerate(clusters):
        mask[row, projection_sets(proj)[c]] = False
    z = full.masked_fill(~mask, -math.inf)
    return z.amax(dim=1), torch.logsumexp(z, dim=1)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("blocks", [1, 7, 64])
def test_bound_is_never_violated_on_random_states(bias, blocks):
    """Many random layers, maps and states, near their centroid and far from it: the max and the mass of the
    columns a row does not compute stay below the certificate's bounds."""
    violations, rows = 0, 0
    for seed in range(25):
        rng = np.random.default_rng(seed)
        n_vocab, d = int(rng.integers(40, 400)), int(rng.integers(2, 40))
        w, b = random_layer(n_vocab, d, seed=seed, bias=bias)
        w = w * float(rng.uniform(0.1, 3.0))  # varied norms, so the blocks by norm matter
        r, size = int(rng.integers(1, 12)), int(rng.integers(1, n_vocab // 2))
        proj = create_projection(
            "clustered",
            w,
            b,
            cluster_map=random_map(w, b, r=r, size=size, seed=seed),
            exact_k=1,
            bound_blocks=blocks,
            always_active=[0],
        )
        for noise in (0.0, 0.1, 1.0, 10.0):
            cmap_rows = rng.integers(0, r, 16).tolist()
            h = rows_near_proj(proj, cmap_rows, noise, seed)
            top, mass = certificate.inactive_bounds(h, proj.assign(h), proj._bounds)
            true_top, true_mass = inactive_truth(proj, h)
            violations += int((true_top > top.double()).sum()) + int((true_mass > mass.double()).sum())
            rows += h.shape[0]
    assert rows == 25 * 4 * 16 and violations == 0


def rows_near_proj(proj, clusters: list[int], noise: float, seed: int) -> torch.Tensor:
    cent = proj._bounds.centroids[clusters]
    g = torch.Generator().manual_seed(seed)
    return cent + noise * torch.randn(cent.shape, generator=g)


def test_bound_is_tight_at_the_centroid():
    """At ``h = C_c`` (delta 0) the bound is the largest inactive logit itself (up to the rounding margin)."""
    w, b = random_layer(300, 16, seed=3)
    cmap = random_map(w, b, r=6, size=40, seed=3)
    proj = create_projection("clustered", w, b, cluster_map=cmap, exact_k=1)
    h = torch.from_numpy(cmap.centroids.astype(np.float32))
    top, _ = certificate.inactive_bounds(h, proj.assign(h), proj._bounds)
    true_top, _ = inactive_truth(proj, h)
    torch.testing.assert_close(top.double(), true_top, rtol=0, atol=1e-3)


@pytest.mark.parametrize("mode", SELECTIONS)
@pytest.mark.parametrize("k", [1, 3])
def test_certified_rows_have_the_exact_top_k(mode, k):
    w, b = random_layer(300, 16, seed=5)
    # Each set holds its centroid's own top 60: rows near the centroid can certify their top-k.
    centroids = 3.0 * np.random.default_rng(5).standard_normal((10, 16))
    z = torch.nn.functional.linear(torch.from_numpy(centroids).float(), w, b)
    sets = torch.topk(z, 60, dim=1).indices.tolist()
    cmap = map_from_sets(centroids, sets, 300, fingerprint(w, b))
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, exact_k=k, exact_tol=10.0)
    h = rows_near(cmap, list(range(10)) * 6, noise=0.02, seed=5)
    clusters = proj.assign(h)
    out = proj._project_torch(h)[0]
    top, mass = certificate.inactive_bounds(h, clusters, proj._bounds)
    ok = certificate.certify(out, top, mass, k, None)
    assert int(ok.sum()) > 0  # the test means something only if rows certify
    full = torch.nn.functional.linear(h, w, b)
    got = proj(h).dense()
    for row in ok.nonzero()[:, 0].tolist():
        assert torch.topk(got[row], k).indices.tolist() == torch.topk(full[row], k).indices.tolist()


@pytest.mark.parametrize("mode", SELECTIONS)
def test_uncertified_rows_get_full_logits_in_the_same_call(mode):
    w, b = random_layer(300, 16, seed=6)
    cmap = random_map(w, b, r=10, size=3, seed=6)  # sets far too small: most rows fall back
    proj = create_projection("clustered", w, b, cluster_map=cmap, selection=mode, exact_k=2)
    h = rows_near(cmap, list(range(10)) * 3, noise=0.5, seed=6)
    out = proj(h)
    full = torch.nn.functional.linear(h, w, b)
    assert out.ids is None and out.logits.shape == full.shape
    torch.testing.assert_close(out.logits, full)
    assert proj.certified_fraction == 0.0 and proj.counters["rows"] == 30


def test_exact_options_are_checked_and_named_in_the_signature():
    w, b = random_layer()
    cmap = random_map(w, b)
    for bad in ({"exact_k": -1}, {"exact_k": 1.5}, {"exact_tol": -1.0}, {"bound_blocks": -2}):
        with pytest.raises(ValueError):
            create_projection("clustered", w, b, cluster_map=cmap, **bad)
    proj = create_projection("clustered", w, b, cluster_map=cmap, exact_k=8)
    assert "exact_k:8" in proj.signature() and "exact_tol:1e-05" in proj.signature()
    plain = create_projection("clustered", w, b, cluster_map=cmap)
    assert "exact" not in plain.signature() and plain.certified_fraction is None


# ------------------------------------------------------------------------------- decoding on the tiny model


@pytest.fixture(scope="module")
def adapter(tiny_model_dir):
    from fastvocab.decoding.hf_adapter import Seq2SeqAdapter

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Seq2SeqAdapter.load(tiny_model_dir)
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def states(adapter):
    """The tiny model's own decoder states and top-1 ids (greedy, full projection)."""
    from fastvocab.decoding.search import greedy_search

    hs, top = [], []

    def hook(rec):
        hs.append(rec.hidden.float().numpy())
        top.append(torch.topk(rec.output.logits, 1, dim=-1).indices.numpy())

    batch = adapter.encode_texts(synthetic_sentences("en", 16, seed=21), "en", "it")
    greedy_search(adapter, make(adapter, "full"), batch, "en", "it", max_len=12, step_hook=hook)
    return np.concatenate(hs), np.concatenate(top)


@pytest.fixture(scope="module")
def small_map(adapter, states):
    """Sets from each member's top-1 only: too small for many rows, so the fallback is exercised."""
    return map_from_states(*states, r=6, n_vocab=adapter.n_vocab, fp=adapter.fingerprint, seed=1)


@pytest.fixture(scope="module")
def mixed_map(adapter, states, small_map):
    """Even clusters cover the whole vocabulary (their rows always certify, also for beam search's log-probs);
    odd clusters hold only ids the model never ranked first (their rows must fall back, and decoding without
    the certificate goes wrong)."""
    n = adapter.n_vocab
    seen = set(np.unique(states[1]).tolist()) | set(adapter.always_active_ids())
    never = [i for i in range(n) if i not in seen][:4]
    sets = [list(range(n)) if c % 2 == 0 else never for c in range(small_map.manifest.r)]
    return map_from_sets(small_map.centroids, sets, n, adapter.fingerprint)


def exact_decode(adapter, cmap, texts, beam, mode):
    proj = make(adapter, "clustered", cluster_map=cmap, selection=mode, exact_k=1 if beam == 1 else 2 * beam)
    return decode(adapter, proj, texts, beam=beam), proj


@pytest.mark.parametrize("mode", SELECTIONS)
@pytest.mark.parametrize("beam", [1, 4])
def test_exact_decoding_is_identical_to_full_softmax(adapter, small_map, mixed_map, beam, mode):
    texts = synthetic_sentences("en", 10, seed=5)
    full = decode(adapter, make(adapter, "full"), texts, beam=beam)
    fractions = []
    for cmap in (small_map, mixed_map):
        got, proj = exact_decode(adapter, cmap, texts, beam, mode)
        assert got == full
        fractions.append(proj.certified_fraction)
    # Both kinds of rows occurred: certified ones and ones that needed the fallback.
    assert any(0.0 < f < 1.0 for f in fractions), fractions
    plain = decode(
        adapter, make(adapter, "clustered", cluster_map=mixed_map, selection=mode), texts, beam=beam
    )
    assert plain != full  # without the certificate the deprived clusters do change outputs


def test_full_coverage_map_certifies_every_row(adapter, states):
    n = adapter.n_vocab
    cmap = map_from_sets(states[0][:3], [list(range(n))] * 3, n, adapter.fingerprint)
    texts = synthetic_sentences("en", 4, seed=9)
    got, proj = exact_decode(adapter, cmap, texts, 4, "union")
    assert got == decode(adapter, make(adapter, "full"), texts, beam=4)
    assert proj.certified_fraction == 1.0
    assert proj.counters["columns"] == proj.counters["rows"] * n


# ----------------------------------------------------------------------------------------------- the scorer


def test_scorer_agrees_with_the_models_own_log_probs(adapter):
    from fastvocab.decoding.scoring import normalised_score, sequence_log_probs, sequence_scores

    texts = synthetic_sentences("en", 5, seed=13)
    batch = adapter.encode_texts(texts, "en", "it")
    full = make(adapter, "full")
    outputs = decode(adapter, full, texts, beam=2, max_len=12)
    outputs[1] = outputs[1][:2]  # also sequences no search produced, and an empty one
    outputs[2] = []
    ended = [True, True, True, False, True]
    got = sequence_log_probs(adapter, full, batch, "it", outputs, ended=ended)

    prefix = adapter.start_tokens("it")
    for i, out in enumerate(outputs):
        seq = list(out) + ([adapter.eos_id] if ended[i] else [])
        dec_in = torch.tensor([prefix + seq[:-1]] if seq else [prefix])
        one = {k: v[i : i + 1] for k, v in batch.items()}
        logits = reference_logits(adapter, one, dec_in)[0].float()  # (T, N)
        logp = torch.log_softmax(logits, dim=-1)
        want = sum(float(logp[len(prefix) - 1 + t, tok]) for t, tok in enumerate(seq))
        assert got[i] == pytest.approx(want, abs=1e-3), i
    scores = sequence_scores(adapter, full, batch, "it", outputs, length_penalty=0.7, ended=ended)
    for i, out in enumerate(outputs):
        assert scores[i] == pytest.approx(normalised_score(got[i], len(out), ended[i], len(prefix), 0.7))
    assert normalised_score(-6.0, 3, True, 2, 1.0) == pytest.approx(-6.0 / 5)


# ---------------------------------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("beam", ["1", "4"])
def test_cli_exact_output_equals_full_and_prints_the_certified_share(
    tiny_model_dir, mixed_map, tmp_path, capsys, beam
):
    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.pipeline.cli import main

    save_cluster_map(mixed_map, tmp_path / "maps" / "en-it")
    inp = tmp_path / "in.txt"
    inp.write_text("\n".join(synthetic_sentences("en", 6, seed=5)) + "\n", encoding="utf-8")
    common = [
        "translate",
        "--model",
        str(tiny_model_dir),
        "--src-lang",
        "en",
        "--tgt-lang",
        "it",
        "-i",
        str(inp),
    ]
    common += ["--beam", beam, "--max-len", "12", "--no-progress"]
    assert main([*common, "-o", str(tmp_path / "full.txt")]) == 0
    clustered = ["--method", "clustered", "--clusters", str(tmp_path / "maps")]
    capsys.readouterr()
    assert main([*common, "-o", str(tmp_path / "exact.txt"), *clustered, "--exact"]) == 0
    err = capsys.readouterr().err
    assert "certificate examined certified exact" in err and "active columns per decoder row" in err
    assert (tmp_path / "exact.txt").read_text() == (tmp_path / "full.txt").read_text()
    assert main([*common, "-o", str(tmp_path / "x.txt"), "--exact"]) == 2  # --exact needs --method clustered


# -------------------------------------------------------------------------------------------- the yardstick


def test_bench_fidelity_runs_the_default_methods_and_names_its_run(tmp_path, tiny_model_dir, mixed_map):
    """The grid's default methods at two beams (``exact`` certifies only what full softmax would give) and a
    record that names its commit, its load and its command."""
    import json

    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.pipeline.cli import main

    write_en_it_split(tmp_path / "corpus", "test", 5, seed=5)
    save_cluster_map(mixed_map, tmp_path / "maps" / "en-it")
    out = tmp_path / "fidelity.json"
    argv = ["bench", "fidelity", "--model", str(tiny_model_dir), "--maps", str(tmp_path / "maps")]
    argv += ["--corpus", str(tmp_path / "corpus"), "--directions", "en-it", "--beams", "1,2"]
    argv += ["--batches", "2", "--max-len", "8", "--threads", "1", "-o", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    got = {(r["beam"], r["method"]) for r in data["results"]}
    assert got == {(1, "clustered"), (1, "exact"), (2, "clustered"), (2, "normaliser"), (2, "exact")}
    assert data["meta"]["commit"] and data["meta"]["loadavg_before"]
    assert data["meta"]["device"] == f"{cpu_name()} (1 threads)"  # a record names the CPU it ran on
    assert data["command"].startswith("fastvocab bench fidelity")
    for r in data["results"]:
        assert r["sentences"] == 5 and 0.0 <= r["search_errors"] <= 1.0 - r["identical"] + 1e-9
        if r["method"] == "exact":
            assert r["identical"] == 1.0 and 0.0 < r["certified"] < 1.0
            assert r["bleu"] == r["bleu_full"] and r["chrf"] == r["chrf_full"]


def test_fastvocab_bench_fidelity_writes_the_record_and_prints_the_table(
    tmp_path, tiny_model_dir, mixed_map, capsys
):
    import json

    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.pipeline.cli import main

    write_en_it_split(tmp_path / "corpus", "test", 3, seed=5)
    save_cluster_map(mixed_map, tmp_path / "maps" / "en-it")
    out = tmp_path / "fidelity.json"
    argv = ["bench", "fidelity", "--model", str(tiny_model_dir), "--clusters", str(tmp_path / "maps")]
    argv += ["--corpus", str(tmp_path / "corpus"), "--directions", "en-it", "--beams", "2", "--batches", "3"]
    argv += ["--methods", "clustered,normaliser", "--max-len", "6", "--threads", "1", "--output", str(out)]
    assert main(argv) == 0
    table = capsys.readouterr().out
    assert "search" not in table.split("\n")[0] and "s.err" in table and "normaliser" in table
    data = json.loads(out.read_text())
    assert data["benchmark"] == "fidelity" and data["command"].startswith("fastvocab bench fidelity")
    assert [(r["beam"], r["method"]) for r in data["results"]] == [(2, "clustered"), (2, "normaliser")]
    for r in data["results"]:
        assert r["sentences"] == 3 and 0.0 <= r["search_errors"] <= 1.0 - r["identical"] + 1e-9
        assert r["active_columns_per_row"] > 0
    assert main([*argv[:-2], "--methods", "guess", "-o", str(out)]) == 2  # unknown method: a usage error


def test_bench_fidelity_with_a_shortlist_joins_its_candidates_to_the_sets(
    tmp_path, tiny_model_dir, adapter, mixed_map, capsys
):
    """``--with-shortlist``: a table whose candidates are every id makes every step dense, so every
    clustered method, greedy and beam, gives full softmax's outputs; per-row selection is refused."""
    import json

    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.artifacts_schema.method_index import save_method_index
    from fastvocab.pipeline.cli import main
    from tests.test_shortlist import _covering_index

    write_en_it_split(tmp_path / "corpus", "test", 4, seed=6)
    save_cluster_map(mixed_map, tmp_path / "maps" / "en-it")
    save_method_index(_covering_index(adapter), tmp_path / "maps" / "shortlist" / "en-it")
    out = tmp_path / "fidelity.json"
    argv = ["bench", "fidelity", "--model", str(tiny_model_dir), "--maps", str(tmp_path / "maps")]
    argv += ["--corpus", str(tmp_path / "corpus"), "--directions", "en-it", "--beams", "1,2"]
    argv += ["--batches", "2", "--max-len", "6", "--threads", "1", "--output", str(out)]
    assert main([*argv, "--with-shortlist", str(tmp_path / "maps"), "--methods", "clustered,default"]) == 0
    data = json.loads(out.read_text())
    assert data["meta"]["shortlists"] == {"en-it": str(tmp_path / "maps" / "shortlist" / "en-it")}
    rows = data["results"]
    want = {(b, m) for b in (1, 2) for m in ("clustered", "default")}
    assert {(r["beam"], r["method"]) for r in rows} == want
    beam_default = next(r for r in rows if (r["beam"], r["method"]) == (2, "default"))
    assert beam_default["options"]["inactive_mass"] == "moments"  # what translate picks beside a shortlist
    for r in rows:
        assert r["identical"] == 1.0 and "shortlist" in r["options"]
        assert r["active_columns_per_row"] == adapter.n_vocab
    capsys.readouterr()
    argv_pr = [*argv, "--with-shortlist", str(tmp_path / "maps"), "--methods", "per-row"]
    assert main(argv_pr) == 2
    assert "--with-shortlist needs union selection" in capsys.readouterr().err


def test_radius_and_oracle_methods_of_the_yardstick(tmp_path, adapter, mixed_map):
    """``normaliser@R`` (far rows get the exact mass) and the ``oracle`` diagnostic, in process."""
    from fastvocab.artifacts_schema.cluster_map import save_cluster_map
    from fastvocab.experiments.fidelity import FidelitySettings, method_options, run_fidelity

    for bad in ("clustered@8", "normaliser@x", "normaliser@0", "exact@2"):
        with pytest.raises(ValueError, match="unknown methods"):
            FidelitySettings(methods=(bad,))
    assert method_options("normaliser@8.5", 2, "union", mixed_map)["mass_radius"] == 8.5
    assert "mass_radius" not in method_options("normaliser", 2, "union", mixed_map)

    write_en_it_split(tmp_path / "corpus", "test", 5, seed=5)
    save_cluster_map(mixed_map, tmp_path / "maps" / "en-it")
    settings = FidelitySettings(
        beams=(1, 2), batches=(2,), methods=("normaliser@1e-6", "oracle"), sentences=5, max_len=8
    )
    rows = run_fidelity(adapter, tmp_path / "corpus", tmp_path / "maps", ["en-it"], settings)
    got = {(r["beam"], r["method"]): r for r in rows}
    assert set(got) == {(2, "normaliser@1e-6"), (2, "oracle")}  # mass methods: beam > 1 only
    far = got[(2, "normaliser@1e-6")]
    assert far["full_rows_far"] == 1.0  # every row got the exact mass: the oracle's decoding
    assert got[(2, "oracle")]["full_rows_far"] is None
    assert far["identical"] == got[(2, "oracle")]["identical"]
    assert far["search_errors"] == got[(2, "oracle")]["search_errors"]
    mf = mixed_map.manifest
    covers = {"r": mf.r, "k": mf.k, "beams": mf.beams, "states": mf.states_used}
    assert all(r["map"] == covers for r in rows)  # each row says what its map covers


def test_the_default_method_is_what_translate_decodes_with_at_each_beam(adapter, mixed_map):
    """``default``: no inactive-mass estimate greedy, the normaliser in beam search (as ``fastvocab
    translate --method clustered``), and it runs at every beam, unlike the mass methods."""
    from fastvocab.experiments.fidelity import FidelitySettings, method_options

    FidelitySettings(methods=("default",))  # a known method
    greedy, beam = (
        method_options("default", 1, "union", mixed_map),
        method_options("default", 4, "per-row", mixed_map),
    )
    assert greedy["inactive_mass"] == "none" and greedy["selection"] == "union"
    assert beam["inactive_mass"] == "normaliser" and beam["selection"] == "per-row"
    assert "exact_k" not in beam and "inactive_mass" not in method_options("clustered", 4, "union", mixed_map)
    # --probes reaches every union-selection method, and not per-row, which reads one cluster a row
    assert method_options("default", 4, "union", mixed_map, 3)["probes"] == 3
    assert method_options("normaliser", 4, "union", mixed_map, 3)["probes"] == 3
    assert "probes" not in method_options("per-row", 4, "union", mixed_map, 3)
    assert "probes" not in method_options("default", 4, "union", mixed_map)
    with pytest.raises(ValueError, match="probes must be >= 1"):
        FidelitySettings(probes=0)


def test_agreement_counts_search_errors_and_lists_each_differing_output():
    from fastvocab.experiments.fidelity import SCORE_TOL, agreement

    full = [[1, 2], [1, 4], [4, 5], [5], [6]]
    out = [[1, 2], [1, 3], [4], [5], [7]]
    scores = [-1.0, -2.0, -0.5, -1.0, -1.0 - SCORE_TOL / 10]
    full_scores = [-1.0, -1.5, -1.0, -1.0, -1.0]
    got = agreement(out, full, scores, full_scores)
    assert got["identical"] == 0.4
    assert got["search_errors"] == 0.2  # sentence 1; sentence 4 is worse by less than rounding
    assert got["better"] == 0.2  # sentence 2
    assert got["differing"] == [[1, -0.5], [2, 0.5], [4, 0.0]]
