"""The compact shipped form of cluster maps and shortlist tables: bytes, and the same decoded outputs.

Compares two maps folders beside the demo model (``--old``: the plain form, ``--new``: the compact form of
the same maps and tables, ``fastvocab.tasks.publish.compact_published``):

- bytes per direction, map and table: each file, and each stored tensor zstd-compressed on its own;
- outputs: the first ``--lines`` test sentences of each direction translated with
  ``fastvocab translate --method clustered --clusters DIR --with-shortlist DIR`` (greedy unless ``--beam``,
  batch 32; source lines up to 1,024 tokens) from each folder, and the count of identical output lines.

Writes ``benchmarks/results/compact-format-cpu-<date>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_meta import cpu_name, git_commit, write_result

from fastvocab.artifacts_schema.compact import stored_sizes
from fastvocab.artifacts_schema.corpus import read_direction
from fastvocab.artifacts_schema.tensor_folder import COMPRESSED_SUFFIX, MANIFEST_FILE, read_tensors

ARTIFACTS = {"map": ("{d}", "map.safetensors"), "table": ("shortlist/{d}", "index.safetensors")}


def artifact_bytes(root: Path, direction: str) -> dict[str, dict]:
    """Per artifact of ``direction`` under ``root``: its files' bytes and each stored tensor's."""
    out = {}
    for kind, (sub, tensors_file) in ARTIFACTS.items():
        folder = root / sub.format(d=direction)
        files = {p.name: p.stat().st_size for p in sorted(folder.iterdir())}
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        stored = read_tensors(folder, tensors_file, str(manifest["tensors_digest"]), kind)
        out[kind] = {
            "files": files,
            "bytes": sum(files.values()),
            "compressed": (folder / (tensors_file + COMPRESSED_SUFFIX)).exists(),
            "schema_version": manifest["schema_version"],
            "tensors": stored_sizes(stored),
        }
        for name, entry in (manifest.get("encoding") or {}).get("tensors", {}).items():
            out[kind]["tensors"][name]["encoding"] = entry
    return out


def translate(root: Path, src: str, tgt: str, inp: Path, out: Path, threads: int, beam: int) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "fastvocab.pipeline.cli", "translate", "--model", "models/demo",
         "--src-lang", src, "--tgt-lang", tgt, "-i", str(inp), "-o", str(out), "--method", "clustered",
         "--clusters", str(root), "--with-shortlist", str(root), "--batch-size", "32", "--beam", str(beam),
         "--threads", str(threads), "--max-input-tokens", "1024", "--no-progress"],
        check=True,
    )  # fmt: skip
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old", type=Path, required=True, help="the maps folder in the plain form")
    ap.add_argument("--old-label", help="how the record names --old (default: its path), e.g. its commit")
    ap.add_argument("--new", type=Path, default=Path("models/demo-maps"), help="the same in the compact form")
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--directions", nargs="+", default=["en-it", "it-en"])
    ap.add_argument("--lines", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--beam", type=int, default=1)
    ap.add_argument(
        "--out", type=Path, default=Path(f"benchmarks/results/compact-format-cpu-{dt.date.today()}.json")
    )
    args = ap.parse_args()

    result: dict = {
        "device": "cpu",
        "cpu": cpu_name(),
        "model": "models/demo",
        "commit": git_commit(),
        "lines": args.lines,
        "decode": {"method": "clustered", "with_shortlist": True, "beam": args.beam, "batch_size": 32},
        "directions": {},
    }
    work = Path(tempfile.mkdtemp(prefix="compact-format."))
    for direction in args.directions:
        src, tgt = direction.split("-")
        _, sources, _ = read_direction(args.corpus, src, tgt, "test", limit=args.lines)
        inp = work / f"{direction}.src"
        inp.write_text("\n".join(sources) + "\n")
        rec: dict = {"sentences": len(sources)}
        outputs = {}
        for form, root in (("old", args.old), ("compact", args.new)):
            out = work / f"{direction}.{form}.txt"
            seconds = translate(root, src, tgt, inp, out, args.threads, args.beam)
            outputs[form] = out.read_text().splitlines()
            rec[form] = {
                "folder": args.old_label if form == "old" and args.old_label else str(root),
                "translate_seconds": round(seconds, 1),
                **artifact_bytes(root, direction),
            }
        same = sum(a == b for a, b in zip(outputs["old"], outputs["compact"], strict=True))
        rec["identical_outputs"] = same
        rec["bytes"] = {
            kind: {"old": rec["old"][kind]["bytes"], "compact": rec["compact"][kind]["bytes"]}
            for kind in ARTIFACTS
        }
        rec["bytes"]["total"] = {f: sum(rec["bytes"][k][f] for k in ARTIFACTS) for f in ("old", "compact")}
        print(f"{direction}: {same}/{len(sources)} identical; bytes {rec['bytes']}")
        result["directions"][direction] = rec
    write_result(args.out, result)


if __name__ == "__main__":
    main()
