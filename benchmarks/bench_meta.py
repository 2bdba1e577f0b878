"""Where a benchmark ran (the CPU and its vector extensions, or the GPU), the order in which the interleaved
benchmarks run their systems each round, how a result is written, how memory is read (peak RSS), and what
several scripts parse alike (comma lists, a translate log's phases, BLEU and chrF with their signatures).

Imported by the benchmark scripts, which run as ``python benchmarks/<script>.py`` (this folder is then first
on ``sys.path``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TypeVar

from fastvocab.artifacts_schema.provenance import git_commit as git_commit  # re-exported for the scripts
from fastvocab.kernels.cpu_features import cpu_name as _cpu_features_name

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
T = TypeVar("T")


def cpu_name() -> str:
    """The CPU model and its vector extensions (``kernels.cpu_features.cpu_name``), and the family this
    process emulates if :func:`emulate` was called."""
    family = os.environ.get(EMULATE_ENV)
    return _cpu_features_name() + (f" emulating {family}" if family else "")


def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU model and torch's thread count."""
    import torch

    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return f"{cpu_name()} ({torch.get_num_threads()} threads)"


def cupy_version() -> str | None:
    """CuPy's version, None where it is not installed."""
    try:
        import cupy
    except ImportError:
        return None
    return cupy.__version__


def round_order(systems: Sequence[T], round_index: int) -> list[T]:
    """``systems`` as round ``round_index`` runs them: each round starts one system later than the one before,
    so no system keeps the first place (in fixed order, fastvocab full int8, always first, ran 4-25% slower
    than the int8 clustered projection doing the same computation, at every point of two model-scale runs)."""
    shift = round_index % len(systems) if systems else 0
    return [*systems[shift:], *systems[:shift]]


def comma_list(kind: Callable[[str], T], known: Collection[T] | None = None) -> Callable[[str], list[T]]:
    """An argparse ``type``: ``a,b,c`` as a list of ``kind``, each one of ``known`` when given."""

    def parse(text: str) -> list[T]:
        items = [kind(x) for x in text.split(",") if x]
        if unknown := [x for x in items if known is not None and x not in known]:
            raise argparse.ArgumentTypeError(f"unknown {unknown[0]!r}; known: {', '.join(map(str, known))}")
        return items

    return parse


def result_header(benchmark: str) -> dict[str, object]:
    """What a result file starts with: the benchmark, when, the commit, the command, the CPU, torch's version
    and the load average at the end of the run."""
    import torch

    return {
        "benchmark": benchmark, "date": dt.datetime.now().isoformat(timespec="seconds"),
        "commit": git_commit(), "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "device": cpu_name(), **emulation(), "torch": torch.__version__, "load_avg": os.getloadavg(),
    }  # fmt: skip


def provenance(script: str, argv: list[str] | None, *code: str) -> dict[str, str]:
    """When, from which commit (``+dirty`` when ``code``'s folders or the script hold changes), with which
    command (``argv``, else this process's) and on which CPU a run of ``benchmarks/<script>`` measured."""
    path = f"benchmarks/{script}"
    return {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "commit": git_commit(*code, path, cwd=ROOT),
        "command": " ".join([".venv/bin/python", path, *(argv or sys.argv[1:])]),
        "device": f"{cpu_name()} ({os.cpu_count()} cores visible)",
    }  # fmt: skip


def bulk_phases(log: str) -> dict[str, float]:
    """The seconds of each phase on a ``fastvocab -v translate`` log's ``bulk phases (s): setup 0.41, ...``
    line; empty where the log has none."""
    found = re.search(r"bulk phases \(s\): (.*)", log)
    return {k: float(v) for k, v in (p.rsplit(" ", 1) for p in found[1].split(", "))} if found else {}


def bleu_chrf(scores: dict) -> dict[str, object]:
    """BLEU and chrF of ``tasks.evaluate.score`` (or ``fastvocab eval --json``), rounded for the tables, with
    their sacrebleu signatures."""
    signatures = scores["signatures"]
    return {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
            "bleu_signature": signatures["bleu"], "chrf_signature": signatures["chrf"]}  # fmt: skip


def load_avg() -> list[float]:
    """The 1-, 5- and 15-minute load averages, rounded: a record's note of how busy the machine was."""
    return [round(x, 2) for x in os.getloadavg()]


def write_result(path: Path | None, result: dict) -> None:
    """Write ``result`` as JSON to ``path`` (folders made as needed); nothing when ``path`` is None."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")  # a Path or a dtype as its text
    print(f"wrote {path}")


def scratch_dir(prefix: str) -> Path:
    """A temporary folder removed when the benchmark exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, True)
    return path


# ------------------------------------------------------------------------------------------------ memory
# Linux only. A process's own peak is its VmHWM: ru_maxrss of RUSAGE_SELF carries the parent's peak across
# fork and exec. A finished child's own peak is wait4's ru_maxrss.


def meminfo(key: str) -> int:
    """A ``/proc/self/status`` or ``/proc/meminfo`` value in bytes ('VmRSS', 'VmHWM', 'MemAvailable', ...)."""
    for name in ("/proc/self/status", "/proc/meminfo"):
        for line in Path(name).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(key)


def peak_rss_mb() -> float:
    """The process's peak resident set (``VmHWM``) in MB."""
    return round(meminfo("VmHWM") / 2**20, 1)


def reset_peak_rss() -> None:
    """VmHWM := VmRSS (writing 5 to ``/proc/self/clear_refs`` resets the process's peak resident set)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


# ------------------------------------------------------------------------------------------ no AMX here
# Linux hands a process the AMX tile registers only once it asks (arch_prctl ARCH_REQ_XCOMP_PERM), and
# every library that uses them (ONNX Runtime's MLAS, oneDNN, MKL) asks before its first tile kernel and
# falls back to its AVX-512 VNNI kernels when refused. Refusing that one call emulates an AVX-512 CPU without
# AMX (AMD EPYC Zen 4) for all of them at once, which ISA caps cannot: MLAS reads CPUID and has no cap.
_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _AUDIT_ARCH_X86_64 = 158, 0x1023, 0xC000003E


# ISA caps another CPU family's libraries would run under on this one, beside AMX refused
EMULATE = {
    "no-amx": {  # AVX-512 with VNNI and BF16, no AMX (AMD EPYC Zen 4)
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ATEN_CPU_CAPABILITY": "avx512",
        "NUMBA_CPU_NAME": "znver4",
    },
    "avx2": {  # AVX2 only (AMD EPYC Zen 2/3, no AVX-VNNI); MLAS has no cap: its AVX-512 kernels still run
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "NUMBA_CPU_NAME": "znver3",
    },
}
EMULATE_ENV = "BENCH_EMULATE"  # set by emulate(): the family every record of this process says it emulated


def emulation() -> dict[str, str]:
    """A record's ``emulated`` field: how this process emulates another CPU family (:func:`emulate`), or
    nothing when it runs as the host."""
    if not (family := os.environ.get(EMULATE_ENV)):
        return {}
    caps = ", ".join(f"{k}={v}" for k, v in EMULATE[family].items())
    return {"emulated": f"{family}: AMX refused (seccomp); {caps}; MLAS picks its kernels by CPUID"}


def emulate(family: str) -> None:
    """Run the rest of this process (and its children) as on ``family`` of :data:`EMULATE`: AMX refused and
    the family's ISA caps set. Call it before torch, ONNX Runtime, CTranslate2 or numba load."""
    refuse_amx()
    os.environ.update(EMULATE[family])
    os.environ[EMULATE_ENV] = family


def refuse_amx() -> None:
    """Install a seccomp filter that fails this process's (and its children's) requests for the AMX tile
    state with EPERM; every other system call is let through. Call it before any library loads."""
    import ctypes
    import errno
    import struct

    ld, jeq, ret = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    allow, refuse = 0x7FFF0000, 0x00050000 | errno.EPERM
    program = [
        (ld, 0, 0, 4),  # seccomp_data.arch
        (jeq, 0, 4, _AUDIT_ARCH_X86_64),
        (ld, 0, 0, 0),  # seccomp_data.nr
        (jeq, 0, 2, _ARCH_PRCTL),
        (ld, 0, 0, 16),  # the low word of args[0]
        (jeq, 1, 0, _ARCH_REQ_XCOMP_PERM),
        (ret, 0, 0, allow),
        (ret, 0, 0, refuse),
    ]
    code = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(code)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = SockFprog(len(program), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_no_new_privs, pr_set_seccomp, seccomp_mode_filter = 38, 22, 2
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) or libc.prctl(
        pr_set_seccomp, seccomp_mode_filter, ctypes.byref(prog), 0, 0
    ):
        raise OSError(ctypes.get_errno(), "seccomp filter refusing AMX could not be installed")
