"""``kernels.faiss_import``: Faiss' own OpenBLAS runs kernels made for this CPU, not its generic ones."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from fastvocab.kernels.faiss_import import openblas_core

pytest.importorskip("faiss")

FEATURES = getattr(np._core._multiarray_umath, "__cpu_features__", {})


def test_the_kernels_follow_the_cpu_flags():
    assert openblas_core({"AVX512_SKX": True, "AVX2": True, "FMA3": True}) == "SKYLAKEX"
    assert openblas_core({"AVX512_SKX": False, "AVX2": True, "FMA3": True}) == "HASWELL"
    assert openblas_core({"AVX2": True, "FMA3": False}) is None
    assert openblas_core({}) is None


def _cores(coretype: str | None) -> tuple[list[str], str]:
    """The kernels each OpenBLAS reports as it loads (numpy's, then Faiss'), importing Faiss the project's
    way in a fresh process with ``OPENBLAS_CORETYPE`` = ``coretype`` (None: unset); and what that variable
    holds after the import."""
    code = (
        "import os\nfrom fastvocab.kernels.faiss_import import import_faiss\nimport_faiss()\n"
        "print(os.environ.get('OPENBLAS_CORETYPE', '-'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env["OPENBLAS_VERBOSE"] = "2"
    if coretype is not None:
        env["OPENBLAS_CORETYPE"] = coretype
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    out = done.stdout + done.stderr
    cores = [line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Core:")]
    return cores, done.stdout.strip().splitlines()[-1]


HAS_AVX2 = bool(FEATURES.get("AVX2") and FEATURES.get("FMA3"))


@pytest.mark.skipif(not HAS_AVX2, reason="needs a CPU with AVX2 and FMA")
def test_faiss_openblas_runs_this_cpus_kernels_and_the_setting_is_not_left_behind():
    cores, after = _cores(None)
    assert cores, "OpenBLAS reported no kernels: the check checks nothing"
    assert "Prescott" not in cores and after == "-"
    if FEATURES.get("AVX512_SKX"):
        assert cores[-1] == "SkylakeX"


def test_a_users_coretype_is_kept():
    cores, after = _cores("Haswell")
    assert cores and all(c == "Haswell" for c in cores) and after == "Haswell"
