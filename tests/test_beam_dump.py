"""Dumping along beam search's hypotheses (``DumpSettings.beam`` > 1): rows, their top-K, plans and resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.hidden_states import validate_direction
from fastvocab.decoding.search import beam_search
from fastvocab.decoding.settings import SearchSettings
from fastvocab.pipeline.config import load_config
from fastvocab.pipeline.errors import UserError
from fastvocab.tasks.context import RunContext, describe_model
from fastvocab.tasks.dump import DumpDecoder, DumpSettings, plan_shards, run_dump_shard
from fastvocab.tasks.kmeans import sample_states
from fastvocab.tasks.maps import count_shards
from fastvocab.tasks.stream import stream_counts
from tests.conftest import synthetic_sentences

BEAM, K, MAX_LEN = 3, 6, 8


def make_decoder(model_dir, beam: int) -> DumpDecoder:
    ctx = RunContext(describe_model(model_dir), torch_threads=1)
    return DumpDecoder(ctx, DumpSettings(k=K, max_len=MAX_LEN, batch_size=4, beam=beam))


@pytest.fixture(scope="module")
def greedy(tiny_model_dir):
    return make_decoder(tiny_model_dir, beam=1)


@pytest.fixture(scope="module")
def beamed(tiny_model_dir):
    return make_decoder(tiny_model_dir, beam=BEAM)


def columns(texts, src="en", tgt="it"):
    n = len(texts)
    return {
        "sent_id": np.arange(n),
        "text": np.array(texts, dtype=object),
        "src_lang": np.array([src] * n, dtype=object),
        "tgt_lang": np.array([tgt] * n, dtype=object),
    }


def hook_oracle(decoder: DumpDecoder, texts: list[str]) -> tuple[dict[str, np.ndarray], list[list[int]]]:
    """What full-softmax beam search handed its step hook, one row per live hypothesis; and its outputs.

    Step 0 holds ``BEAM`` copies of each sentence's prefix (only the first expands): the first is kept.
    """
    rec: dict[str, list] = {"row": [], "step": [], "hidden": [], "topk_ids": []}

    def hook(r) -> None:
        rows = slice(None, None, BEAM) if r.step == 0 else slice(None)
        rec["row"].append(r.row_ids[rows].numpy())
        rec["step"].append(np.full(len(r.row_ids[rows]), r.step))
        rec["hidden"].append(r.hidden[rows].numpy().astype(np.float16))
        rec["topk_ids"].append(r.output.topk(K)[1][rows].numpy())

    batch = decoder.adapter.encode_texts(texts, "en", "it")
    settings = SearchSettings(beam=BEAM, max_len=MAX_LEN, early_stopping=False)
    out = beam_search(decoder.adapter, decoder.projection, batch, "en", "it", settings, step_hook=hook)
    cols = {k: np.concatenate(v) for k, v in rec.items()}
    order = np.lexsort((cols["step"], cols["row"]))  # stable: beam order within a step
    return {k: v[order] for k, v in cols.items()}, out


def test_beam_dump_records_every_live_hypothesis_with_the_topk_search_saw(beamed):
    texts = synthetic_sentences("en", 4, seed=5)  # one search call (batch_size 4)
    out = beamed(columns(texts))
    want, best = hook_oracle(beamed, texts)
    np.testing.assert_array_equal(out["sent_id"], want["row"])
    np.testing.assert_array_equal(out["step"], want["step"])
    np.testing.assert_array_equal(out["hidden"], want["hidden"])
    np.testing.assert_array_equal(out["topk_ids"], want["topk_ids"])
    assert out["topk_ids"].shape[1] == K and np.all(np.diff(out["topk_logprobs"], axis=1) <= 0)

    for sid in range(len(texts)):
        mine = out["sent_id"] == sid
        steps = out["step"][mine]
        per_step = np.bincount(steps)
        # one state at step 0 (the shared prefix), then one per hypothesis: several per (sent_id, step)
        assert per_step[0] == 1 and per_step[1] == BEAM and per_step.max() <= BEAM
        hidden = out["hidden"][mine]
        for t in range(1, len(per_step)):
            at = hidden[steps == t]
            assert len({row.tobytes() for row in at}) == len(at)  # distinct hypotheses
        # every token of the beam's best output is among the recorded top-K of a state of its step
        for t, tok in enumerate(best[sid]):
            assert tok in out["topk_ids"][mine][steps == t]


def test_beam_shards_feed_counts_streams_kmeans_and_cap(beamed, tmp_path):
    texts = synthetic_sentences("it", 5, seed=2)
    (spec,) = plan_shards("it-en", list(range(5)), texts, shard_sentences=5)
    res = run_dump_shard(beamed, spec, tmp_path / "states")
    files = validate_direction(tmp_path / "states", "it-en", fingerprint=beamed.fingerprint)
    centroids = np.random.default_rng(1).standard_normal((4, beamed.d)).astype(np.float32)
    stored = count_shards(files, centroids, k=K, n_vocab=beamed.n_vocab)
    streamed, _ = stream_counts(beamed, spec, centroids, k=K)
    assert stored.states == streamed.states == res["states"] > len(texts) * 2
    for a, b in zip(stored.to_csr(), streamed.to_csr(), strict=True):
        np.testing.assert_array_equal(a, b)
    x, total = sample_states(files, None, seed=0)  # k-means trains on every row, repeats of a step too
    assert total == stored.states and x.shape == (total, beamed.d)

    (capped,) = plan_shards("it-en", list(range(5)), texts, shard_sentences=5, max_states=7)
    cols = beamed.decode_shard(capped)
    assert len(cols["sent_id"]) == 7
    np.testing.assert_array_equal(cols["hidden"], beamed.decode_shard(spec)["hidden"][:7])


def test_beam_one_keeps_the_greedy_plan(greedy):
    (spec,) = plan_shards("en-it", [0, 1], synthetic_sentences("en", 2), shard_sentences=2)
    plan = spec.plan(greedy.settings)
    # the keys every greedy shard written before the beam setting carries: those shards stay current
    assert set(plan) == {
        "direction",
        "index",
        "sentences",
        "sentences_digest",
        "max_states",
        "k",
        "max_len",
        "batch_size",
    }
    assert spec.plan(DumpSettings(K, MAX_LEN, 4, beam=1)) == plan
    assert spec.plan(DumpSettings(K, MAX_LEN, 4, beam=BEAM)) == {**plan, "beam": BEAM}


def test_beam_one_rows_are_the_greedy_path(greedy, beamed):
    texts = synthetic_sentences("en", 3, seed=7)
    out = greedy(columns(texts))
    assert np.all(np.bincount(out["step"] + out["sent_id"] * (MAX_LEN + 1)) <= 1)  # one row per step
    beam_rows = beamed(columns(texts))
    first = (beam_rows["step"] == 0) & np.isin(beam_rows["sent_id"], out["sent_id"])
    # both start from the same prefix state
    np.testing.assert_array_equal(beam_rows["hidden"][first], out["hidden"][out["step"] == 0])


def test_change_of_beam_redoes_the_shard(greedy, beamed, tmp_path):
    (spec,) = plan_shards("en-it", [0, 1, 2], synthetic_sentences("en", 3, seed=4), shard_sentences=3)
    first = run_dump_shard(greedy, spec, tmp_path)
    assert not first["skipped"]
    assert run_dump_shard(greedy, spec, tmp_path)["skipped"]
    redo = run_dump_shard(beamed, spec, tmp_path)  # same model, K and sentences; another beam
    assert not redo["skipped"] and redo["states"] > first["states"]
    assert run_dump_shard(beamed, spec, tmp_path)["skipped"]
    assert not run_dump_shard(greedy, spec, tmp_path)["skipped"]


@pytest.mark.parametrize(("k", "beam", "ok"), [(5, 1, True), (1, 1, True), (8, 4, True), (7, 4, False)])
def test_k_below_two_beams_is_refused_by_the_dump_settings(k, beam, ok):
    if ok:
        assert DumpSettings(k=k, beam=beam).beam == beam
        return
    with pytest.raises(ValueError, match=r"2 x beam"):
        DumpSettings(k=k, beam=beam)


@pytest.mark.parametrize(
    ("overrides", "dump_k", "maps_k"),
    [
        ({}, 5, None),  # greedy only: dump.k as configured
        ({"dump.k": 3, "maps.beams": [1]}, 3, None),
        ({"maps.beams": [1, 4]}, 8, None),  # raised to 2 x the largest beam
        ({"maps.beams": [4, 1], "dump.k": 10, "maps.k": 5}, 10, 8),  # a larger dump.k stays
        ({"maps.beams": [2], "maps.k": 3}, 5, 4),
    ],
)
def test_k_follows_the_beams(overrides, dump_k, maps_k):
    cfg = load_config(None, overrides)
    assert (cfg.dump.k, cfg.maps.k) == (dump_k, maps_k)
    assert cfg.maps.beams == sorted(overrides.get("maps.beams", [1]))
    for beam in cfg.maps.beams:  # every beam's settings are valid (k >= 2 x beam)
        graphs = "auto" if beam == 1 else "off"  # the captured recording is the greedy path's
        want = DumpSettings(k=dump_k, max_len=128, batch_size=32, beam=beam, graphs=graphs)
        assert cfg.dump.settings(beam) == want


def test_dump_beam_is_an_unknown_key(tmp_path):
    # the beam sizes are maps.beams; dump.beam is refused like any other key the config does not have
    with pytest.raises(UserError, match=r"dump\.beam: Extra inputs are not permitted"):
        load_config(None, {"dump.beam": 4})
    path = tmp_path / "run.yaml"
    path.write_text("dump:\n  beam: 4\n")
    with pytest.raises(UserError, match=r"dump\.beam: Extra inputs are not permitted"):
        load_config(path)


@pytest.mark.parametrize(
    ("beams", "message"),
    [([], "at least one beam size"), ([1, 0], "must be >= 1"), ([1, 4, 4], "4 listed more than once")],
)
def test_bad_beams_are_refused_naming_the_key(beams, message):
    with pytest.raises(UserError, match=rf"maps\.beams: .*{message}"):
        load_config(None, {"maps.beams": beams})


def test_distinct_hypotheses_drops_adjacent_copies_of_a_sentence_only():
    from fastvocab.tasks.dump import distinct_hypotheses

    h = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [3.0, 4.0], [1.0, 2.0]])
    rows = torch.tensor([0, 0, 1, 1, 1])
    assert distinct_hypotheses(rows, h).tolist() == [True, False, True, True, True]


def test_maps_extra_states_feed_greedy_and_beam_shards_into_one_map(greedy, beamed, tmp_path):
    """``maps.extra_states``: a beam dump's shards are validated and counted with the run's own."""
    from types import SimpleNamespace

    from fastvocab.pipeline.stages.dump import extra_state_files as extra_files

    texts = synthetic_sentences("en", 4, seed=3)
    (spec,) = plan_shards("en-it", list(range(4)), texts, shard_sentences=4)
    run_dump_shard(greedy, spec, tmp_path / "greedy")
    run_dump_shard(beamed, spec, tmp_path / "beam")
    model = SimpleNamespace(fingerprint=beamed.fingerprint)

    def ctx(roots):
        cfg = SimpleNamespace(maps=SimpleNamespace(extra_states=roots))
        return SimpleNamespace(cfg=cfg, model=lambda: model)

    own = validate_direction(tmp_path / "greedy", "en-it", fingerprint=greedy.fingerprint)
    extra = extra_files(ctx([str(tmp_path / "beam")]), ["en-it"], K)
    assert extra == validate_direction(tmp_path / "beam", "en-it")
    centroids = np.random.default_rng(2).standard_normal((3, beamed.d)).astype(np.float32)
    both = count_shards(own + extra, centroids, k=K, n_vocab=beamed.n_vocab)
    alone = [count_shards(f, centroids, k=K, n_vocab=beamed.n_vocab) for f in (own, extra)]
    assert both.states == alone[0].states + alone[1].states
    merged = alone[0]
    merged.merge(alone[1])
    for a, b in zip(both.to_csr(), merged.to_csr(), strict=True):
        np.testing.assert_array_equal(a, b)
    # every greedy and every beam (cluster, id) pair is in the joint map
    indptr, indices, _ = both.to_csr()
    joint = {(c, int(i)) for c in range(3) for i in indices[indptr[c] : indptr[c + 1]]}
    for part in alone[1:]:
        p_indptr, p_indices, _ = part.to_csr()
        assert {(c, int(i)) for c in range(3) for i in p_indices[p_indptr[c] : p_indptr[c + 1]]} <= joint

    with pytest.raises(UserError, match=r"below maps\.k=9"):
        extra_files(ctx([str(tmp_path / "beam")]), ["en-it"], K + 3)
    with pytest.raises(UserError, match=r"maps\.extra_states: no hidden-state shards for it-en"):
        extra_files(ctx([str(tmp_path / "beam")]), ["it-en"], K)
    model.fingerprint = "sha256:other"
    with pytest.raises(UserError, match=r"dumped from model"):
        extra_files(ctx([str(tmp_path / "beam")]), ["en-it"], K)


@pytest.mark.parametrize(
    ("overrides", "batch"),
    [
        ({}, 32),  # auto on CPU workers
        ({"dump.num_gpus_per_worker": 1}, 512),  # auto on GPU workers
        ({"dump.num_gpus_per_worker": 1, "dump.batch_size": 64}, 64),  # a number is kept
    ],
)
def test_dump_batch_size_auto_follows_where_the_workers_decode(overrides, batch):
    cfg = load_config(None, overrides)
    assert cfg.dump.batch() == batch == cfg.dump.settings(1).batch_size


def test_dump_batch_size_zero_is_refused():
    with pytest.raises(UserError, match="batch_size"):
        load_config(None, {"dump.batch_size": 0})
