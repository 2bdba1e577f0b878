"""What every benchmark result records about where it ran (the commit and the device), and the order in which
the interleaved benchmarks run their systems each round.

Imported by the benchmark scripts, which run as ``python benchmarks/<script>.py`` (this folder is then first
on ``sys.path``).
"""

from __future__ import annotations

import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def git_commit(*paths: str) -> str:
    """HEAD's hash, and ``+dirty`` when tracked files under ``paths`` (default: all) are changed."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


# /proc/cpuinfo flags that decide which GEMM kernels run (fp32 width, int8 dot products, bf16), by name.
_ISA_FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "BF16",
    "amx_tile": "AMX",
}


def cpu_name() -> str:
    """The CPU model and its vector extensions from /proc/cpuinfo, e.g. ``AMD EPYC (AVX2, AVX-512, VNNI,
    BF16)`` (VMs often report only the vendor's family name, so the extensions tell two machines apart);
    ``platform.processor()`` elsewhere."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine() or "cpu"
    model = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "cpu")
    flags = next((set(line.split(":", 1)[1].split()) for line in info if line.startswith("flags")), set())
    isa = [name for flag, name in _ISA_FLAGS.items() if flag in flags]
    return f"{model} ({', '.join(isa)})" if isa else model


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU model and torch's thread count."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"


def round_order(systems: Sequence[T], round_index: int) -> list[T]:
    """``systems`` as round ``round_index`` runs them: each round starts one system later than the one before,
    so no system keeps the first place (in fixed order, fastvocab full int8, always first, ran 4-25% slower
    than the int8 clustered projection doing the same computation, at every point of two model-scale runs)."""
    shift = round_index % len(systems) if systems else 0
    return [*systems[shift:], *systems[:shift]]
