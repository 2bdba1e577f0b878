"""Run a benchmark script as on another CPU family (``bench_meta.EMULATE``): AMX refused, ISA caps set,
before any library loads; the script's record then names the family it emulated.

    python benchmarks/emulate_cpu.py no-amx benchmarks/bench_peer.py --out ...
"""

from __future__ import annotations

import runpy
import sys

from bench_meta import EMULATE, emulate

if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in EMULATE:
        sys.exit(f"usage: emulate_cpu.py {{{','.join(EMULATE)}}} SCRIPT [ARGS...]")
    emulate(sys.argv[1])
    sys.argv = sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
