"""The dump unit of work on hand-made batches, without Ray: rows, schema, and states == projection input."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fastvocab import switches
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.hidden_states import (
    REFERENCE_BEAM,
    fixed_list_to_numpy,
    shard_is_current,
    stale_shards,
    validate_direction,
)
from fastvocab.artifacts_schema.stream_counts import stream_path
from fastvocab.tasks import dump as dump_module
from fastvocab.tasks.context import RunContext, describe_model
from fastvocab.tasks.dump import DumpDecoder, DumpSettings, plan_shards, run_dump_shard
from fastvocab.tasks.maps import ActiveSetCounter, count_shards
from fastvocab.tasks.stream import read_stream_counts, run_stream_shard, stream_counts
from tests.conftest import synthetic_sentences

K, MAX_LEN = 3, 10


@pytest.fixture(scope="module")
def decoder(tiny_model_dir):
    ctx = RunContext(describe_model(tiny_model_dir), torch_threads=1)
    return DumpDecoder(ctx, DumpSettings(k=K, max_len=MAX_LEN, batch_size=4))


def columns(texts, src, tgt, first_id=100):
    n = len(texts)
    return {
        "sent_id": np.arange(first_id, first_id + n),
        "text": np.array(texts, dtype=object),
        "src_lang": np.array([src] * n, dtype=object),
        "tgt_lang": np.array([tgt] * n, dtype=object),
    }


def test_rows_cover_every_sentence_and_step_in_order(decoder):
    en = columns(synthetic_sentences("en", 5), "en", "it")
    fr = columns(synthetic_sentences("fr", 3), "fr", "de", first_id=7)
    batch = {k: np.concatenate([fr[k], en[k]]) for k in en}  # mixed directions in one batch
    out = decoder(batch)
    rows = len(out["sent_id"])
    assert out["hidden"].shape == (rows, decoder.d) and out["hidden"].dtype == np.float16
    assert out["topk_ids"].shape == (rows, K) and out["topk_ids"].dtype == np.int32
    assert out["step"].dtype == np.int32 and out["sent_id"].dtype == np.int64
    # rows in input order, each sentence with steps 0..L-1 (1 <= L <= MAX_LEN)
    seen = list(dict.fromkeys(out["sent_id"].tolist()))
    assert seen == batch["sent_id"].tolist()
    for sid in seen:
        steps = out["step"][out["sent_id"] == sid]
        assert steps.tolist() == list(range(len(steps))) and 1 <= len(steps) <= MAX_LEN
    # top-K ids distinct, best first
    assert all(len(set(r)) == K for r in out["topk_ids"].tolist())
    assert np.all(np.diff(out["topk_logprobs"], axis=1) <= 0)


class Recording:
    """Wraps the full projection and keeps what it was given and what it returned."""

    def __init__(self, inner):
        self.inner, self.h, self.logits = inner, [], []

    def __call__(self, h):
        out = self.inner(h)
        self.h.append(h.detach().clone())
        self.logits.append(out.logits.detach().clone())
        return out


def test_hidden_is_what_the_projection_saw_and_topk_its_logits(decoder, tiny_model_dir):
    text = synthetic_sentences("en", 1, seed=3)[0]
    rec = Recording(decoder.projection)
    decoder.projection = rec
    try:
        out = decoder(columns([text], "en", "it"))
    finally:
        decoder.projection = rec.inner
    h = torch.cat(rec.h).numpy()  # one sentence: call order == step order
    assert h.shape == out["hidden"].shape
    np.testing.assert_array_equal(out["hidden"], h.astype(np.float16))
    logits = torch.cat(rec.logits)
    np.testing.assert_array_equal(out["topk_ids"], torch.topk(logits, K, dim=-1).indices.numpy())
    # and the stored (fp16) state reproduces those logits through W, b: same top-1 as the model's
    w, b = decoder.adapter.output_weight, decoder.adapter.output_bias
    z = torch.nn.functional.linear(torch.from_numpy(out["hidden"]).float(), w, b)
    assert (z.argmax(-1).numpy() == out["topk_ids"][:, 0]).mean() >= 0.9

    # greedy: the top-1 of step t is the token the model generates at t (Hugging Face generate as oracle)
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir).eval()
    batch = decoder.adapter.encode_texts([text], "en", "it")
    prefix = decoder.adapter.start_tokens("it")
    gen = model.generate(
        **batch,
        forced_bos_token_id=prefix[-1],
        max_new_tokens=MAX_LEN + len(prefix) - 1,
        do_sample=False,
        num_beams=1,
    )[0, len(prefix) :].tolist()
    assert out["topk_ids"][:, 0].tolist() == gen[: len(out["step"])]


def test_reference_path_states_equal_a_search_along_the_same_tokens(decoder):
    """Teacher forcing along the greedy output gives the greedy dump's rows: same steps, same top-K, states
    equal to fp32 rounding (one batched pass against a step-by-step cached search)."""
    texts = synthetic_sentences("en", 5, seed=11)
    greedy = decoder(columns(texts, "en", "it"))
    adapter = decoder.adapter
    targets = []
    for sid in range(100, 105):
        rows = greedy["sent_id"] == sid
        top1 = greedy["topk_ids"][rows, 0].tolist()
        # the last step's best token is EOS (or the length limit cut the search): not fed back
        targets.append(top1[:-1] if top1[-1] == adapter.eos_id else top1[: MAX_LEN - 1])
    state = adapter.encode(adapter.encode_texts(texts, "en", "it"))
    h, row, step = adapter.teacher_forced(state, "it", targets, MAX_LEN)
    assert row.tolist() == [i for i, t in enumerate(targets) for _ in range(min(len(t) + 1, MAX_LEN))]
    assert step.tolist() == (greedy["step"]).tolist()
    np.testing.assert_allclose(h.float().numpy(), greedy["hidden"].astype(np.float32), atol=2e-2, rtol=1e-2)
    best = decoder.projection(h).logits.argmax(-1).numpy()
    assert (best == greedy["topk_ids"][:, 0]).mean() >= 0.98


def test_reference_path_records_each_reference_and_skips_lines_without_one(decoder):
    along = decoder.along(0)
    texts = synthetic_sentences("en", 4, seed=12)
    refs = synthetic_sentences("it", 4, seed=13)
    refs[2] = ""  # a monolingual line: no reference path
    batch = columns(texts, "en", "it")
    batch["reference"] = np.array(refs, dtype=object)
    out = along(batch)
    pieces = along.adapter.tokenize_targets(refs, "it")
    for i, sid in enumerate(range(100, 104)):
        steps = out["step"][out["sent_id"] == sid].tolist()
        want = 0 if i == 2 else min(len(pieces[i]) + 1, MAX_LEN)
        assert steps == list(range(want))
    assert out["hidden"].shape == (len(out["sent_id"]), along.d) and len(out["sent_id"]) > 0
    # the states are the projection's inputs for those tokens: the top-K come from their logits
    logits = along.projection(torch.from_numpy(out["hidden"]).float()).logits
    assert (logits.argmax(-1).numpy() == out["topk_ids"][:, 0]).mean() >= 0.9
    with pytest.raises(ValueError, match="reference"):
        along(columns(texts, "en", "it"))


def test_reference_path_records_do_not_depend_on_the_rows_a_projection_call(decoder, switch):
    along = decoder.along(0)
    texts = synthetic_sentences("en", 6, seed=14)
    batch = columns(texts, "en", "it")
    batch["reference"] = np.array(synthetic_sentences("it", 6, seed=15), dtype=object)
    whole = along(batch)
    switch(TEACHER_ROWS=3)  # calls of 3 rows, the last one short
    assert dump_module.teacher_rows("cpu", along.n_vocab) == 3 < len(whole["step"])
    parts = along(batch)
    for name in ("sent_id", "step", "topk_ids"):
        np.testing.assert_array_equal(parts[name], whole[name])
    np.testing.assert_allclose(parts["topk_logprobs"], whole["topk_logprobs"], atol=1e-5)


def test_teacher_rows_bounds_a_gpu_calls_logits_and_keeps_cpu_cache_sized():
    least, most = switches.TEACHER_ROWS.get(), switches.TEACHER_ROWS_CUDA.get()
    assert dump_module.teacher_rows("cpu", 32_108) == least
    assert dump_module.teacher_rows("cuda", 32_108) == most
    big = dump_module.teacher_rows("cuda:1", 256_000)  # a 256K vocabulary: 1 GiB of float32 logits
    assert least < big < most
    assert big * 256_000 * 4 <= dump_module.TEACHER_LOGITS_BYTES
    assert dump_module.teacher_rows("cuda", 10**9) == least


def test_shards_validate_resume_and_detect_corruption(decoder, tmp_path):
    texts = synthetic_sentences("it", 7)
    specs = plan_shards("it-en", list(range(7)), texts, shard_sentences=3)
    assert [len(s.texts) for s in specs] == [3, 3, 1]
    results = [run_dump_shard(decoder, s, tmp_path) for s in specs]
    assert not any(r["skipped"] for r in results) and all(r["states"] > 0 for r in results)
    files = validate_direction(tmp_path, "it-en", fingerprint=decoder.fingerprint)
    assert [f.name for f in files] == ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    table = pq.read_table(files[0])
    assert set(table.column("sent_id").to_pylist()) == {0, 1, 2}
    hidden = fixed_list_to_numpy(table.column("hidden"), decoder.d, np.float32)
    assert hidden.shape[0] == table.num_rows and np.isfinite(hidden).all()

    # same model, same sentences, same plan -> the same bytes (deterministic decoding and writing)
    again = run_dump_shard(decoder, specs[0], tmp_path / "again")
    assert Path(again["path"]).read_bytes() == files[0].read_bytes()

    mtimes = [f.stat().st_mtime_ns for f in files]
    assert all(run_dump_shard(decoder, s, tmp_path)["skipped"] for s in specs)
    assert [f.stat().st_mtime_ns for f in files] == mtimes
    # another plan (other K) is not current; a shard beyond a smaller plan is stale
    meta = decoder.shard_meta("it-en")
    other = specs[0].plan(DumpSettings(K, MAX_LEN + 1, decoder.batch_size))
    assert not shard_is_current(files[0], meta, other)
    assert stale_shards(tmp_path, "it-en", planned=2) == [files[2]]

    files[1].write_bytes(files[1].read_bytes()[:100])  # truncated by a crash outside our atomic write
    with pytest.raises(ArtifactError, match=r"part-00001\.parquet"):
        run_dump_shard(decoder, specs[1], tmp_path)


def test_state_cap_keeps_first_rows(decoder, tmp_path):
    texts = synthetic_sentences("en", 4)
    (full,) = plan_shards("en-it", list(range(4)), texts, shard_sentences=4)
    (capped,) = plan_shards("en-it", list(range(4)), texts, shard_sentences=4, max_states=5)
    a, b = decoder.decode_shard(full), decoder.decode_shard(capped)
    assert len(b["sent_id"]) == 5 < len(a["sent_id"])
    np.testing.assert_array_equal(a["hidden"][:5], b["hidden"])


@pytest.mark.parametrize("beam", [1, REFERENCE_BEAM])
def test_lines_over_the_token_limit_are_left_out_and_the_rest_unchanged(tiny_model_dir, beam):
    """A line translate would refuse is not decoded (a batch padded to it cost 19 GB on a 2-core machine);
    the other lines' states are those of a dump without it."""
    ctx = RunContext(describe_model(tiny_model_dir), torch_threads=1)
    limited = DumpDecoder(ctx, DumpSettings(k=K, max_len=MAX_LEN, batch_size=4, max_input_tokens=40)).along(
        beam
    )
    texts = synthetic_sentences("en", 4, seed=3)
    long_line = " ".join(synthetic_sentences("en", 30, seed=4))
    assert len(limited.adapter.tokenize([long_line], "en", "it")[0]) > 40
    assert all(len(t) <= 40 for t in limited.adapter.tokenize(texts, "en", "it"))
    refs = tuple(synthetic_sentences("it", 5, seed=5))
    (with_long,) = plan_shards("en-it", [0, 1, 2, 3, 4], [*texts[:2], long_line, *texts[2:]], 5)
    (without,) = plan_shards("en-it", [0, 1, 3, 4], texts, 4)
    with_long = replace(with_long, references=refs)
    without = replace(without, references=refs[:2] + refs[3:])
    a, b = limited.decode_shard(with_long), limited.decode_shard(without)
    assert 2 not in set(a["sent_id"].tolist()) and set(a["sent_id"].tolist()) == {0, 1, 3, 4}
    np.testing.assert_array_equal(a["sent_id"], b["sent_id"])
    np.testing.assert_array_equal(a["hidden"], b["hidden"])
    # the default limit is translate's, and leaves the plans of shards written before it as they were
    assert "max_input_tokens" not in with_long.plan(DumpSettings(K, MAX_LEN, 4))
    assert with_long.plan(limited.settings)["max_input_tokens"] == 40


@pytest.mark.parametrize("beam", [1, REFERENCE_BEAM])
def test_streamed_counts_equal_counts_of_stored_states(decoder, tmp_path, beam):
    decoder = decoder.along(beam)
    texts = synthetic_sentences("en", 6, seed=9)
    (spec,) = plan_shards("en-it", list(range(6)), texts, shard_sentences=6)
    spec = replace(spec, references=tuple(synthetic_sentences("it", 6, seed=10)))
    run_dump_shard(decoder, spec, tmp_path / "states")
    files = validate_direction(tmp_path / "states", "en-it")
    centroids = np.random.default_rng(0).standard_normal((5, decoder.d)).astype(np.float32)
    stored = count_shards(files, centroids, k=2, n_vocab=decoder.n_vocab)
    streamed, metrics = stream_counts(decoder, spec, centroids, k=2)
    assert streamed.states == stored.states == metrics["states"] > 0
    for a, b in zip(streamed.to_csr(), stored.to_csr(), strict=True):
        np.testing.assert_array_equal(a, b)
    # the partial-counts file: written once, then recognised; other centroids -> not current
    path = stream_path(tmp_path / "stream", "en-it", "en-it", 0)
    assert not run_stream_shard(decoder, spec, centroids, 2, path)["skipped"]
    assert run_stream_shard(decoder, spec, centroids, 2, path)["skipped"]
    back = read_stream_counts(path)
    assert isinstance(back, ActiveSetCounter) and back.states == stored.states
    assert not run_stream_shard(decoder, spec, centroids + 1, 2, path)["skipped"]


def test_a_killed_stream_resumes_without_counting_a_sentence_twice(decoder, tmp_path):
    """Each shard's counts live in one file, renamed into place when whole: after a kill (one shard done,
    one half-written, one not started) the rerun does the other two, and the merged counts are exactly those
    of one pass over every sentence."""
    texts = synthetic_sentences("en", 9, seed=21)
    specs = plan_shards("en-it", list(range(9)), texts, shard_sentences=3)
    centroids = np.random.default_rng(1).standard_normal((4, decoder.d)).astype(np.float32)
    paths = [stream_path(tmp_path / "stream", "en-it", "en-it", s.index) for s in specs]
    assert not run_stream_shard(decoder, specs[0], centroids, 2, paths[0])["skipped"]
    # the kill: shard 1 was being written (its temporary folder is left behind), shard 2 never started
    leftover = paths[1].parent / f".{paths[1].name}.killed.tmp"
    leftover.mkdir(parents=True)
    (leftover / paths[1].name).write_bytes(b"half a file")
    resumed = [run_stream_shard(decoder, s, centroids, 2, p) for s, p in zip(specs, paths, strict=True)]
    assert [r["skipped"] for r in resumed] == [True, False, False]
    merged = ActiveSetCounter(len(centroids), decoder.n_vocab)
    for p in paths:
        part = read_stream_counts(p)
        assert part is not None
        merged.merge(part)
    (whole,) = plan_shards("en-it", list(range(9)), texts, shard_sentences=9)
    once, _ = stream_counts(decoder, whole, centroids, k=2)
    assert merged.states == once.states > 0
    for a, b in zip(merged.to_csr(), once.to_csr(), strict=True):
        np.testing.assert_array_equal(a, b)


def test_stream_counts_file_is_byte_identical_across_processes(tmp_path):
    """safetensors orders multi-key metadata differently in every process; the file must not depend on it."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np\n"
        "from pathlib import Path\n"
        "from fastvocab.artifacts_schema.stream_counts import stream_meta, write_stream_arrays\n"
        "arrays = {'keys': np.arange(4), 'counts': np.ones(4, np.int64), 'shape': np.array([2, 5, 3])}\n"
        "meta = stream_meta('sha256:m', np.eye(2, dtype=np.float32), 2, {'index': 0, 'direction': 'en-it'})\n"
        "write_stream_arrays(arrays, meta, Path(sys.argv[1]))\n"
    )
    outs = [tmp_path / f"{i}.safetensors" for i in range(4)]
    for out in outs:
        subprocess.run([sys.executable, "-c", code, str(out)], check=True)
    assert len({p.read_bytes() for p in outs}) == 1


# --------------------------------------------------------------------------- shards as row ranges


def _corpus_file(path: Path, ids, text1, text2, row_group_size: int):
    import pyarrow as pa

    from fastvocab.artifacts_schema.corpus import CORPUS_SCHEMA

    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {"id": ids, "doc_id": [f"d{i}" for i in ids], "text1": text1, "text2": text2}, schema=CORPUS_SCHEMA
    )
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@pytest.fixture
def row_corpus(tmp_path, switch):
    """An en-it train split of 23 rows in row groups of 5, read in batches of 4 (shards straddle both)."""

    switch(READ_BATCH_ROWS=4)
    en = synthetic_sentences("en", 23, seed=5)
    en[3], en[7], en[11] = "", "caffè ünïcode\ttab", "  spaces  "  # edge cases of the "id\ttext\n" lines
    it = synthetic_sentences("it", 23, seed=5)
    ids = [1000 + 3 * i for i in range(23)]  # ids are not row numbers
    _corpus_file(tmp_path / "corpus" / "en-it" / "train.parquet", ids, en, it, row_group_size=5)
    return tmp_path / "corpus", ids, en, it


@pytest.mark.parametrize(("direction", "start", "stop", "cap"), [("en-it", 0, 17, None), ("it-en", 6, 40, 9)])
def test_row_range_plans_equal_in_memory_plans(row_corpus, direction, start, stop, cap):
    """A row-range shard's plan is the in-memory ShardSpec's plan of the same rows: shards written before
    row-range planning stay current, and the plan still names the sentences' content."""
    from fastvocab.tasks.row_shards import plan_row_shards, sample_file

    corpus, ids, en, it = row_corpus
    texts = en if direction == "en-it" else it  # it-en reads the en-it file's text2 column
    source = sample_file(corpus, direction, "train")
    assert source.rows == 23 and source.text_column == ("text1" if direction == "en-it" else "text2")
    specs = plan_row_shards(source, direction, start, stop, shard_sentences=3, max_states=cap)
    stop = min(stop, 23)
    old = plan_shards(direction, ids[start:stop], texts[start:stop], 3, cap)
    assert [(s.start, s.stop) for s in specs] == [(lo, min(lo + 3, stop)) for lo in range(start, stop, 3)]
    settings = DumpSettings(k=K, max_len=MAX_LEN, batch_size=4)
    assert [s.plan(settings) for s in specs] == [o.plan(settings) for o in old]
    # the worker's view: the rows read back are the in-memory spec
    assert [s.load() for s in specs] == old


def test_row_range_spec_holds_no_text(row_corpus):
    """What the driver sends a worker does not grow with the shard's text: a path, a range and a digest."""
    import pickle

    from fastvocab.tasks.row_shards import RowRangeSpec, plan_row_shards, sample_file

    corpus, ids, en, _ = row_corpus
    path = corpus / "en-it" / "train.parquet"
    long = [t * 200 for t in en]  # sentences 200x longer: the specs keep their size
    small = plan_row_shards(sample_file(corpus, "en-it", "train"), "en-it", 0, 20, 10)
    _corpus_file(path, ids, long, long, row_group_size=5)
    big = plan_row_shards(sample_file(corpus, "en-it", "train"), "en-it", 0, 20, 10)
    assert all(isinstance(s, RowRangeSpec) and not hasattr(s, "texts") for s in big)
    assert [len(pickle.dumps(s)) for s in big] == [len(pickle.dumps(s)) for s in small]
    assert [s.sentences_digest for s in big] != [s.sentences_digest for s in small]
    assert big[1].load().texts == tuple(long[10:20])


def test_worker_reads_its_rows_and_writes_the_in_memory_shard(row_corpus, tiny_model_dir, tmp_path):
    """DecoderWorker given a row range writes byte for byte the shard of the in-memory spec; a shard of the
    old (in-memory) planning is current under the row-range plan, so a run resumes over it."""
    from fastvocab.artifacts_schema.hidden_states import shard_status
    from fastvocab.tasks.row_shards import plan_row_shards, sample_file
    from fastvocab.tasks.workers import DecoderWorker

    corpus, ids, en, _ = row_corpus
    settings = DumpSettings(k=K, max_len=MAX_LEN, batch_size=4)
    worker = DecoderWorker(RunContext(describe_model(tiny_model_dir), torch_threads=1), settings)
    rows = plan_row_shards(sample_file(corpus, "en-it", "train"), "en-it", 0, 8, 4)
    old = plan_shards("en-it", ids[:8], en[:8], 4)
    got = worker.dump(rows[1], str(tmp_path / "new"), 1000)
    want = run_dump_shard(worker.decoder, old[1], tmp_path / "old")
    assert not got["skipped"] and got["states"] == want["states"] > 0
    assert Path(got["path"]).read_bytes() == Path(want["path"]).read_bytes()
    meta = worker.decoder.shard_meta("en-it")
    assert shard_status(Path(want["path"]), meta, rows[1].plan(settings)) == "current"
    assert worker.dump(rows[1], str(tmp_path / "old"), 1000)["skipped"]


def test_worker_refuses_rows_changed_since_planning(row_corpus):
    from fastvocab.tasks.row_shards import plan_row_shards, sample_file

    corpus, ids, en, it = row_corpus
    specs = plan_row_shards(sample_file(corpus, "en-it", "train"), "en-it", 0, 23, 10)
    en = list(en)
    en[12] = en[12] + " changed"
    _corpus_file(corpus / "en-it" / "train.parquet", ids, en, it, row_group_size=5)
    assert specs[0].load().texts == tuple(en[:10])  # rows 0-10 are as planned
    with pytest.raises(ArtifactError, match=r"train\.parquet: rows 10-20 .* changed since"):
        specs[1].load()
    _corpus_file(corpus / "en-it" / "train.parquet", ids[:21], en[:21], it[:21], row_group_size=5)
    with pytest.raises(ArtifactError, match=r"rows 20-23 .*\(1 rows read"):
        specs[2].load()


def test_sample_file_names_what_is_missing(row_corpus):
    from fastvocab.tasks.row_shards import sample_file

    corpus, *_ = row_corpus
    with pytest.raises(ArtifactError, match=r"no test split for en-it .*present: en-it"):
        sample_file(corpus, "en-it", "test")
    with pytest.raises(ArtifactError, match=r"no monolingual en file"):
        sample_file(corpus, "en-it", "mono")


def test_the_dump_stage_plans_row_ranges_without_loading_the_sample(row_corpus, monkeypatch):
    """The stage's planning on the driver goes through the row-range planner only: the in-memory corpus
    readers (what held the sample's texts before) are never called; dumped and streamed rows follow on."""
    from fastvocab.artifacts_schema import corpus as corpus_schema
    from fastvocab.pipeline.config import load_config
    from fastvocab.pipeline.context import StageContext
    from fastvocab.pipeline.stages.dump import dump_specs, stream_specs

    corpus, ids, _, it = row_corpus

    def refuse(*args, **kwargs):
        raise AssertionError("the driver read the sample into memory")

    for name in ("read_direction", "read_mono", "read_corpus_file"):
        monkeypatch.setattr(corpus_schema, name, refuse)
    cfg = load_config(
        None,
        {
            "corpus.out_dir": str(corpus),
            "directions": ["it-en"],
            "dump.sentences": 10,
            "dump.stream_sentences": 20,  # more than the 13 rows left: the stream part is cut there
            "dump.shard_sentences": 4,
        },
    )
    ctx = StageContext(cfg, ray=None, progress=False)
    dump, stream = dump_specs(ctx, "it-en"), stream_specs(ctx, "it-en")
    assert [(s.start, s.stop, s.index) for s in dump] == [(0, 4, 0), (4, 8, 1), (8, 10, 2)]
    assert [(s.start, s.stop, s.index) for s in stream] == [
        (10, 14, 0),
        (14, 18, 1),
        (18, 22, 2),
        (22, 23, 3),
    ]
    settings = cfg.dump.settings()
    # the sample is the direction's sources file: the train split's lines, numbered by row
    assert [s.plan(settings) for s in stream] == [
        o.plan(settings) for o in plan_shards("it-en", list(range(10, len(ids))), it[10:], 4)
    ]


def test_the_captured_recording_keeps_the_eager_dumps_rows(decoder, tiny_model_dir):
    """graphs="on" (fixed shapes, every row recorded into device buffers each step, the live steps cut out at
    the end) gives the eager step hook's rows: the same (sentence, step) rows, ids and states."""
    ctx = RunContext(describe_model(tiny_model_dir), torch_threads=1)
    captured = DumpDecoder(ctx, replace(decoder.settings, graphs="on"))
    assert decoder.settings.graphs == "off" and captured.settings.graphs == "on"  # auto on CPU: eager
    batch = columns(synthetic_sentences("en", 9), "en", "it")
    eager, fixed = decoder(batch), captured(batch)
    assert len(eager["sent_id"]) > 9  # sentences of several steps
    for key in ("sent_id", "step", "topk_ids"):
        np.testing.assert_array_equal(fixed[key], eager[key], err_msg=key)
    np.testing.assert_allclose(
        fixed["hidden"].astype(np.float32), eager["hidden"].astype(np.float32), atol=1e-3
    )
    np.testing.assert_allclose(fixed["topk_logprobs"], eager["topk_logprobs"], atol=1e-4)
    # a captured run says so in its shards' plan; the eager plan is the one shards always had
    spec = plan_shards("en-it", list(range(9)), list(batch["text"]), 9)[0]
    assert spec.plan(captured.settings) == {**spec.plan(decoder.settings), "graphs": "on"}


def test_captured_recording_is_greedy_only(tiny_model_dir):
    ctx = RunContext(describe_model(tiny_model_dir), torch_threads=1)
    with pytest.raises(ValueError, match="greedy path only"):
        DumpDecoder(ctx, DumpSettings(k=4, max_len=MAX_LEN, beam=2, graphs="on"))
    with pytest.raises(ValueError, match="auto, on or off"):
        DumpSettings(graphs="yes")
