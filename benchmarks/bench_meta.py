"""What every benchmark result records about where it ran (the commit and the device), and the order in which
the interleaved benchmarks run their systems each round.

Imported by the benchmark scripts, which run as ``python benchmarks/<script>.py`` (this folder is then first
on ``sys.path``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from fastvocab.artifacts_schema.provenance import git_commit

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


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


def best_seconds(fn: Callable[[], object], calls: int, blocks: int, warmup: int = 1) -> float:
    """Seconds per call of ``fn``: the best of ``blocks`` blocks of ``calls`` calls, after ``warmup`` calls.
    The best, not the median: on a shared machine noise only adds."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(blocks):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def result_header(benchmark: str) -> dict[str, object]:
    """What a result file starts with: the benchmark, when, the commit, the command, the CPU, torch's version
    and the load average at the end of the run."""
    import torch

    return {
        "benchmark": benchmark,
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(cwd=ROOT),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": cpu_name(),
        "torch": torch.__version__,
        "load_avg": os.getloadavg(),
    }


def write_result(path: Path | None, result: dict) -> None:
    """Write ``result`` as JSON to ``path`` (folders made as needed); nothing when ``path`` is None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")
