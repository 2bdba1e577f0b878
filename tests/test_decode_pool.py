"""A kept :class:`DecodePool`: its workers start once and decode call after call, with the outputs and counts
of a pool made for each call."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from conftest import synthetic_sentences

import fastvocab.tasks.decode_pool as dp
from fastvocab.decoding import Seq2SeqAdapter
from fastvocab.tasks.decode_pool import DecodePool
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.translate import SearchSettings, translate

MAX_LEN = 6
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked workers are Linux's")


@pytest.fixture(scope="module")
def adapter(spread_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(spread_model_dir)


def _lines(seed: int) -> list[str]:
    return synthetic_sentences("en", 7, seed=seed)


def _logging_decode(monkeypatch, path):
    """``decode`` that notes the process that ran it (forked workers inherit the patch)."""
    real = dp.decode

    def logged(*args, **kwargs):
        with path.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return real(*args, **kwargs)

    monkeypatch.setattr(dp, "decode", logged)


@linux_only
@pytest.mark.parametrize("batch_size", [1, 2])
def test_kept_workers_decode_call_after_call(adapter, monkeypatch, tmp_path, batch_size):
    """The same forked workers serve every call (none is forked after the first), and each call's lines equal
    one worker's."""
    proj = make_projection(adapter, "full")
    search = SearchSettings(batch_size=batch_size, max_len=MAX_LEN)
    calls = [_lines(seed) for seed in (1, 2, 3)]
    alone = [translate(adapter, proj, x, "en", "it", search, workers=1, progress=False) for x in calls]
    log = tmp_path / "pids"
    _logging_decode(monkeypatch, log)
    forks = []
    real_executor = dp.ProcessPoolExecutor

    def counted(*args, **kwargs):
        forks.append(args[0])
        return real_executor(*args, **kwargs)

    monkeypatch.setattr(dp, "ProcessPoolExecutor", counted)
    with DecodePool(adapter, proj, workers=2, parallel="processes") as pool:
        for x, one in zip(calls, alone, strict=True):
            got = translate(adapter, proj, x, "en", "it", search, progress=False, pool=pool)
            assert got.hypotheses == one.hypotheses and got.target_tokens == one.target_tokens
        pids = set(log.read_text().split())
    assert len(forks) == 1 and any(h for r in alone for h in r.hypotheses)
    assert 1 <= len(pids - {str(os.getpid())}) <= forks[0]  # the kept forks, no others
    assert dp._FORKED == {}  # this process is the caller, not a worker


@linux_only
def test_kept_workers_time_steps_as_the_caller_asks_now(adapter):
    """A worker forked while ``time_steps`` was off times the steps once the caller turns it on, and stops
    when it is turned off: what it counts reaches the caller's projection."""
    proj = make_projection(adapter, "full")
    search = SearchSettings(batch_size=2, max_len=MAX_LEN)
    lines = _lines(4)
    with DecodePool(adapter, proj, workers=2, parallel="processes") as pool:
        translate(adapter, proj, lines, "en", "it", search, progress=False, pool=pool)  # forks, untimed
        proj.time_steps(True)
        translate(adapter, proj, lines, "en", "it", search, progress=False, pool=pool)
        assert proj.step_seconds > 0
        proj.time_steps(False)
        translate(adapter, proj, lines, "en", "it", search, progress=False, pool=pool)
        assert proj.step_seconds == 0


@linux_only
def test_workers_forked_by_an_ended_thread_are_started_again(adapter):
    """A worker dies with the thread that forked it (PR_SET_PDEATHSIG): a kept pool whose forking thread has
    ended starts new workers rather than fail."""
    proj = make_projection(adapter, "full")
    search = SearchSettings(batch_size=1, max_len=MAX_LEN)
    lines = _lines(5)
    expect = translate(adapter, proj, lines, "en", "it", search, workers=1, progress=False).hypotheses
    with DecodePool(adapter, proj, workers=3, parallel="processes") as pool:
        done = []
        t = threading.Thread(
            target=lambda: done.append(
                translate(adapter, proj, lines, "en", "it", search, progress=False, pool=pool)
            )
        )
        t.start()
        t.join()
        assert done and done[0].hypotheses == expect
        assert (
            translate(adapter, proj, lines, "en", "it", search, progress=False, pool=pool).hypotheses
            == expect
        )


def test_a_pool_serves_its_own_model_and_projection(adapter):
    proj, other = make_projection(adapter, "full"), make_projection(adapter, "full")
    lines = _lines(6)
    with DecodePool(adapter, proj) as pool:
        with pytest.raises(ValueError, match="pool was made for another adapter or projection"):
            translate(adapter, other, lines, "en", "it", progress=False, pool=pool)
        with pytest.raises(ValueError, match="pass workers to the pool"):
            translate(adapter, proj, lines, "en", "it", progress=False, pool=pool, workers=2)
    with pytest.raises(ValueError, match="parallel must be one of auto, processes, threads"):
        DecodePool(adapter, proj, parallel="fork")


@linux_only
@pytest.mark.parametrize(("batch_size", "beam"), [(2, 1), (4, 4)])
def test_the_projection_opens_what_the_jobs_steps_will_run_before_the_fork(
    adapter, monkeypatch, batch_size, beam
):
    """The pool tells the projection the most rows a step of the job has before it forks the workers, which
    then inherit the sessions opened for them."""
    proj = make_projection(adapter, "full")
    asked: list[int] = []
    monkeypatch.setattr(proj, "open_sessions", asked.append)
    search = SearchSettings(batch_size=batch_size, beam=beam, max_len=MAX_LEN)
    with DecodePool(adapter, proj, workers=2, parallel="processes") as pool:
        translate(adapter, proj, _lines(5), "en", "it", search, progress=False, pool=pool)
    assert asked == [batch_size * beam]
