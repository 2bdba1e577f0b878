"""The int8 GEMM of many-row steps is chosen by timing both kernels once per machine and width, and the
answer is kept in the cache folder: a later process reads it, a machine with other ISA caps measures again, a
probe whose rounds disagree is not kept."""

from __future__ import annotations

import json
import logging

import pytest

from fastvocab.kernels import gemm_probe, int8
from fastvocab.kernels.ort_session import onnx_unavailable

pytestmark = pytest.mark.skipif(onnx_unavailable() is not None, reason=str(onnx_unavailable()))


def probe(d: int) -> gemm_probe.GemmProbe:
    return gemm_probe.probe(d, int8.probe_kernels)


@pytest.fixture
def cache(switch, tmp_path):
    switch(CACHE_DIR=str(tmp_path / "cache"))
    return tmp_path / "cache" / "probes" / "int8-gemm.json"


def fake_measure(monkeypatch, fbgemm_us: float, ort_us: float, steady: bool = True) -> list[int]:
    calls: list[int] = []

    def measure(d: int, *_, **__) -> gemm_probe.GemmProbe:
        calls.append(d)
        choice = "onnxruntime" if fbgemm_us > gemm_probe.MARGIN * ort_us else "fbgemm"
        return gemm_probe.GemmProbe(d, fbgemm_us, ort_us, choice, steady, "cpu", "2026-12-02T00:00:00")

    monkeypatch.setattr(gemm_probe, "measure", measure)
    return calls


def test_a_probe_is_measured_once_and_read_back(cache, monkeypatch, caplog):
    calls = fake_measure(monkeypatch, fbgemm_us=300.0, ort_us=200.0)
    with caplog.at_level(logging.INFO, logger="fastvocab.kernels.gemm_probe"):
        first = probe(1024)
    assert calls == [1024] and first.choice == "onnxruntime" and not first.cached
    assert "onnxruntime at d 1024 (measured now" in caplog.text and "fbgemm takes 1.50x" in caplog.text
    kept = json.loads(cache.read_text())
    assert len(kept) == 1 and next(iter(kept.values()))["choice"] == "onnxruntime"
    again = probe(1024)
    assert calls == [1024] and again.cached and again.choice == "onnxruntime"  # read, not measured
    assert "cached" in again.describe()
    probe(256)  # another width is another probe
    assert calls == [1024, 256] and len(json.loads(cache.read_text())) == 2


def test_other_isa_caps_measure_again(cache, monkeypatch):
    calls = fake_measure(monkeypatch, fbgemm_us=100.0, ort_us=99.0)
    assert probe(512).choice == "fbgemm"  # within the margin: fbgemm stays
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    probe(512)
    assert calls == [512, 512]


def test_an_unsteady_probe_is_used_and_not_kept(cache, monkeypatch):
    calls = fake_measure(monkeypatch, fbgemm_us=300.0, ort_us=100.0, steady=False)
    assert probe(1024).choice == "onnxruntime"
    assert not cache.exists()
    probe(1024)
    assert calls == [1024, 1024]


def test_an_unreadable_cache_is_measured_over(cache, monkeypatch):
    cache.parent.mkdir(parents=True)
    cache.write_text("{not json")
    calls = fake_measure(monkeypatch, fbgemm_us=300.0, ort_us=100.0)
    assert probe(64).choice == "onnxruntime" and calls == [64]
    assert json.loads(cache.read_text())  # rewritten whole


def test_the_measurement_times_both_kernels():
    got = gemm_probe.measure(64, int8.probe_kernels, rounds=2, calls=2)
    assert got.d == 64 and got.fbgemm_us > 0 and got.onnxruntime_us > 0
    assert got.choice == (
        "onnxruntime" if got.fbgemm_us > gemm_probe.MARGIN * got.onnxruntime_us else "fbgemm"
    )


def test_auto_takes_the_probes_choice_per_width(switch, monkeypatch):
    switch(INT8_GEMM="auto")
    answers = {256: "fbgemm", 1024: "onnxruntime"}
    probed: list[int] = []

    def probe(d, _):
        probed.append(d)
        return gemm_probe.GemmProbe(d, 1.0, 1.0, answers[d], False, "cpu", "now")  # unsteady: not kept

    monkeypatch.setattr(gemm_probe, "probe", probe)
    for fn in (int8.ort_int8, int8.ort_at, int8._probed):
        fn.cache_clear()
    try:
        assert int8.ort_at(1024) and not int8.ort_at(256)
        assert "onnxruntime at d 1024" in int8.many_rows_gemm(1024)
        assert probed == [1024, 256]  # the record names the probe the choice was made by, not a second one
        switch(INT8_GEMM="fbgemm")
        for fn in (int8.ort_int8, int8.ort_at, int8._probed):
            fn.cache_clear()
        assert not int8.ort_at(1024) and int8.many_rows_gemm(1024) == "fbgemm"
    finally:
        for fn in (int8.ort_int8, int8.ort_at, int8._probed):
            fn.cache_clear()
