"""A short input starts fast: one batch is decoded in this process (no forked workers), and the job's summary
keeps its load apart from its translating."""

from __future__ import annotations

import pytest
import torch

import fastvocab.tasks.decode_pool as pool
import fastvocab.tasks.translate as tr
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.settings import SearchSettings
from fastvocab.tasks.projections import make_projection


class _Forked(RuntimeError):
    pass


@pytest.fixture
def no_fork(monkeypatch):
    """ProcessPoolExecutor replaced by one that refuses: a fork raises _Forked."""

    def refuse(*args, **kwargs):
        raise _Forked("forked worker processes")

    monkeypatch.setattr(pool, "ProcessPoolExecutor", refuse)


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    adapter = Seq2SeqAdapter.load(tiny_model_dir, lite=True)
    return adapter, make_projection(adapter, "full")


@pytest.mark.parametrize("threads", [2, 4])
def test_one_batch_is_decoded_here_without_forking(tiny, no_fork, threads):
    adapter, projection = tiny
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        lines = ["the package", "a tool"]
        res = tr.translate(adapter, projection, lines, "en", "it", SearchSettings(max_len=8), progress=False)
    finally:
        torch.set_num_threads(before)
    assert len(res.hypotheses) == 2
    assert pool.decode_workers(adapter, 1, threads) == 1
    assert pool.worker_kind("auto", pool.decode_workers(adapter, 1, threads)) == "one"


@pytest.mark.skipif(not pool.sys.platform.startswith("linux"), reason="forked workers are Linux's")
def test_more_batches_than_one_worker_takes_fork_workers(tiny, no_fork):
    adapter, projection = tiny
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with pytest.raises(_Forked):
            tr.translate(
                adapter,
                projection,
                ["the package", "a tool", "data"],
                "en",
                "it",
                SearchSettings(batch_size=1, max_len=8),
                progress=False,
            )
    finally:
        torch.set_num_threads(before)
