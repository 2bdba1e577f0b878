"""What CPU this process runs on, as the choices that depend on it name it: the model and the vector
extensions that decide which GEMM kernels run (fp32 width, int8 dot products, bf16, AMX tiles)."""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

# /proc/cpuinfo flags that decide which GEMM kernels run, by name.
ISA_FLAGS = {
    "avx2": "AVX2",
    "avx512f": "AVX-512",
    "avx512_vnni": "VNNI",
    "avx_vnni": "AVX-VNNI",
    "avx512_bf16": "BF16",
    "amx_tile": "AMX",
}


@functools.lru_cache(maxsize=1)
def cpu_name() -> str:
    """The CPU model, its family and model numbers and its vector extensions from /proc/cpuinfo, e.g. ``AMD
    EPYC family 26 model 2 (AVX2, AVX-512, VNNI, AVX-VNNI, BF16)``: VMs often report only the vendor's name,
    so the numbers (26 is AMD's Zen 5, 25 Zen 3 and 4; 6 every Xeon since 2006) and the extensions tell two
    machines apart. ``platform.processor()`` elsewhere."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine() or "cpu"
    first = info[: info.index("")] if "" in info else info  # the first processor's block
    field = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first)}
    model = field.get("model name", "cpu")
    if "cpu family" in field and "model" in field:
        model += f" family {field['cpu family']} model {field['model']}"
    flags = set(field.get("flags", "").split())
    isa = [name for flag, name in ISA_FLAGS.items() if flag in flags]
    return f"{model} ({', '.join(isa)})" if isa else model


@functools.lru_cache(maxsize=1)
def amx_usable() -> bool:
    """Whether this process can run AMX tile kernels: the CPU has them (CPUID) and the kernel grants the
    tile state (Linux asks each process to request it; a kernel before 5.16, or a sandbox, refuses, and
    then MLAS, oneDNN and MKL run their AVX-512 kernels: the CPU counts as one without AMX)."""
    supported = getattr(torch.cpu, "_is_amx_tile_supported", None)  # private, hence looked up
    grant = getattr(torch._C._cpu, "_init_amx", None)
    if supported is None or not supported():
        return False
    return bool(grant()) if grant is not None else True
