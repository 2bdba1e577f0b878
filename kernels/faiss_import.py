"""Faiss, imported so that the OpenBLAS inside its wheel runs kernels made for this CPU.

The faiss-cpu wheel carries its own OpenBLAS (0.3.15 in faiss-cpu 1.15.1), and Faiss' k-means spends its
time in that library's sgemm. That OpenBLAS picks its kernels by the CPU's model number, and it does not know
CPUs newer than itself. On a Sapphire Rapids Xeon it ran its generic "Prescott" kernels. There, Faiss k-means
of 51,200 states of d 256 into 200 centroids took 7.3 s on one thread, against 1.5 s with the SkylakeX
kernels (docs/decisions/0022-faiss-openblas-kernels.md).

``OPENBLAS_CORETYPE`` names the kernels, and a library reads it once, when it loads. So it is set for the
import of Faiss only, and only where the user has not set it. numpy's own OpenBLAS is loaded before, and
keeps its own choice. The kernels follow the CPU's flags as numpy reads them: SkylakeX with AVX-512
(F, CD, BW, DQ, VL), Haswell with AVX2 and FMA, and OpenBLAS' own choice otherwise.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType

import numpy as np


def openblas_core(features: dict[str, bool]) -> str | None:
    """The OpenBLAS kernels for a CPU with numpy's ``features`` (``__cpu_features__``), or None."""
    if features.get("AVX512_SKX"):
        return "SKYLAKEX"
    if features.get("AVX2") and features.get("FMA3"):
        return "HASWELL"
    return None


def import_faiss() -> ModuleType:
    """``import faiss``, its OpenBLAS told this CPU's kernels (see the module docstring)."""
    if "faiss" in sys.modules or "OPENBLAS_CORETYPE" in os.environ:
        import faiss

        return faiss
    features = getattr(getattr(np, "_core", None), "_multiarray_umath", None)
    core = openblas_core(getattr(features, "__cpu_features__", {}))
    if core is not None:
        os.environ["OPENBLAS_CORETYPE"] = core
    try:
        import faiss
    finally:
        os.environ.pop("OPENBLAS_CORETYPE", None)
    return faiss
