"""The dump on a GPU: the captured greedy recording keeps the eager dump's rows, and counts streamed on the
device equal the counts of the same states stored and assigned on the host, and the reference path keeps its
rows whatever the rows a projection call.

Skipped with a reason without a CUDA GPU. On a GPU machine:

    python -m pytest -q tests/gpu/test_dump_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs a CUDA GPU: the captured dump step and the on-device counts",
)

from fastvocab.tasks.context import RunContext, describe_model  # noqa: E402
from fastvocab.tasks.dump import DumpDecoder, DumpSettings, ShardSpec  # noqa: E402
from fastvocab.tasks.maps import ActiveSetCounter, assign  # noqa: E402
from fastvocab.tasks.stream import stream_counts  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "models" / "demo"
LINES = [
    "The package provides a library for parsing configuration files.",
    "This is a transitional dummy package.",
    "Documentation for the command line tools.",
    "A small utility to convert images between formats, with support for many of them.",
    "Fonts.",
] * 8


@pytest.fixture(scope="module")
def ctx():
    return RunContext(describe_model(DEMO), device="cuda", dtype="float16")


def spec() -> ShardSpec:
    return ShardSpec("en-it", 0, tuple(range(len(LINES))), tuple(LINES))


def test_auto_captures_on_cuda_and_keeps_the_eager_rows(ctx):
    captured = DumpDecoder(ctx, DumpSettings(k=4, max_len=48, batch_size=16))
    eager = DumpDecoder(ctx, DumpSettings(k=4, max_len=48, batch_size=16, graphs="off"))
    assert captured.settings.graphs == "on"
    a, b = eager.decode_shard(spec()), captured.decode_shard(spec())
    assert len(a["step"]) > len(LINES)
    np.testing.assert_array_equal(a["sent_id"], b["sent_id"])
    np.testing.assert_array_equal(a["step"], b["step"])
    assert (a["topk_ids"][:, 0] == b["topk_ids"][:, 0]).mean() > 0.99  # fp16: fixed shapes round otherwise
    assert np.abs(a["hidden"].astype(np.float32) - b["hidden"].astype(np.float32)).max() < 0.05


def test_counts_streamed_on_the_gpu_equal_counts_of_the_stored_states(ctx):
    decoder = DumpDecoder(ctx, DumpSettings(k=4, max_len=48, batch_size=16))
    cols = decoder.decode_shard(spec())
    rng = np.random.default_rng(0)
    centroids = cols["hidden"][rng.choice(len(cols["hidden"]), 20, replace=False)].astype(np.float32)
    stored = ActiveSetCounter(len(centroids), decoder.n_vocab)
    stored.add(assign(cols["hidden"], centroids), cols["topk_ids"][:, :3])
    streamed, _ = stream_counts(decoder, spec(), centroids, 3)
    assert streamed.states == stored.states == len(cols["step"])
    np.testing.assert_array_equal(streamed.keys, stored.keys)
    np.testing.assert_array_equal(streamed.counts, stored.counts)


def test_the_reference_path_in_large_calls_keeps_the_rows_of_small_ones(ctx, switch):
    from fastvocab.tasks import dump as dump_module

    along = DumpDecoder(ctx, DumpSettings(k=4, max_len=48, batch_size=len(LINES), beam=0))
    cut = ShardSpec("en-it", 0, tuple(range(len(LINES))), tuple(LINES), None, tuple(LINES))
    large = along.decode_shard(cut)
    assert dump_module.teacher_rows("cuda", along.n_vocab) > len(large["step"])  # one call
    switch(TEACHER_ROWS_CUDA=7, TEACHER_ROWS=7)
    small = along.decode_shard(cut)
    np.testing.assert_array_equal(large["sent_id"], small["sent_id"])
    np.testing.assert_array_equal(large["step"], small["step"])
    assert (large["topk_ids"][:, 0] == small["topk_ids"][:, 0]).mean() > 0.99  # cuBLAS may round otherwise
