"""Maps shipped beside a model: copies of a run's cluster maps, and the record of how they were built.

A map is an artifact of its model, built once from all the text a direction has (far more than a quick run
dumps) and versioned with it. ``maps.publish`` (``configs/demo-maps.yaml``) writes the run's maps to a folder
beside the model, one map folder per direction as ``maps/`` holds them (``fastvocab translate --clusters
DIR`` and ``eval.maps`` read it; in the compact form, ``map.safetensors.zst``:
artifacts_schema/cluster_map.py), and ``maps.json`` there: the model's fingerprint, each direction's source
text (inputs, line counts, dev and test lines left out) and dumped states per path, the settings, and the
command, commit and fastvocab version that built them. A map whose tensors did not change is not written
again (a published map records the digest of the plain map it was encoded from), and the record is
rewritten only when a map changed, so a rerun leaves the folder as it was. ``methods.publish`` writes the
shortlist tables the same way (:func:`publish_index`), and :func:`compact_published` rewrites a folder
published in the plain form.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from fastvocab import __version__
from fastvocab.artifacts_schema.cluster_map import (
    MapManifest,
    load_cluster_map,
    load_manifest,
    save_cluster_map,
)
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.jsonfile import read_json, write_json
from fastvocab.artifacts_schema.method_index import (
    IndexManifest,
    load_index_manifest,
    load_method_index,
    save_method_index,
)
from fastvocab.artifacts_schema.tensor_folder import MANIFEST_FILE

BUILD_FILE = "maps.json"
BUILD_FORMAT = "fastvocab-published-maps/1"


def _current(path: Path) -> MapManifest | None:
    """The manifest of a published map whose tensors read back whole (None: missing or damaged)."""
    try:
        return load_cluster_map(path).manifest
    except ArtifactError:
        return None


def _as_plain(mf: MapManifest | IndexManifest) -> dict[str, Any]:
    """What a manifest says of its artifact, whichever form stores it: a compact one names the digest of
    the plain tensors it was encoded from."""
    out = dataclasses.asdict(mf)
    plain = mf.encoding.get("plain_digest")
    if plain:
        out["tensors_digest"] = plain
    for stored_as in ("encoding", "schema_version"):
        out.pop(stored_as)
    return out


def map_summary(mf: MapManifest) -> dict[str, Any]:
    """What the build record says of one map (its manifest has the rest)."""
    return {
        "r": mf.r,
        "k": mf.k,
        "probes": mf.probes,
        "states_used": mf.states_used,
        "beam_states": mf.beam_states,
        "active_fraction_mean": mf.active_fraction["mean"],
        "tensors_digest": mf.tensors_digest,
        "normaliser_rank": (mf.normaliser or {}).get("rank"),
    }


def publish_maps(maps_root: Path, names: list[str], out: Path, record: dict[str, Any]) -> list[str]:
    """Copy the maps ``names`` of ``maps_root`` into ``out`` (each atomically, unless its tensors and
    manifest are there already) and write ``out/maps.json`` from ``record`` when a map changed; returns the
    names copied."""
    out = Path(out)
    copied: list[str] = []
    summaries: dict[str, Any] = {}
    for name in names:
        src = load_manifest(maps_root / name)  # ArtifactError: the maps stage did not finish
        there = _current(out / name)
        if there is None or not there.encoding or _as_plain(there) != _as_plain(src):
            # shipped: carried by every clone, so compact
            save_cluster_map(load_cluster_map(maps_root / name), out / name, compact=True)
            there = load_manifest(out / name)
            copied.append(name)
        summaries[name] = map_summary(there)
    if copied or read_json(out / BUILD_FILE) is None:
        write_json(
            out / BUILD_FILE,
            {"format": BUILD_FORMAT, "fastvocab_version": __version__, **record, "maps": summaries},
        )
    return copied


def publish_index(src: Path, target: Path) -> bool:
    """Write the method index folder ``src`` to ``target`` in the compact form (atomically), unless the
    same artifact is there already; returns whether it wrote."""
    src_mf = load_index_manifest(src)
    try:
        there: IndexManifest | None = load_method_index(target, load_index_manifest(target).method).manifest
    except ArtifactError:
        there = None
    if there is not None and there.encoding and _as_plain(there) == _as_plain(src_mf):
        return False
    Path(target).parent.mkdir(parents=True, exist_ok=True)
    save_method_index(load_method_index(src, src_mf.method), target, compact=True)
    return True


def compact_published(folder: Path) -> list[Path]:
    """Rewrite every map and method index under ``folder`` (a maps folder beside a model) that is not
    compact yet in the compact form, each atomically and in place: the manifests keep every field but
    ``encoding``, ``schema_version`` and ``tensors_digest``, and ``maps.json`` (when there) names the new
    digests. Returns the folders rewritten."""
    folder = Path(folder)
    done: list[Path] = []
    for manifest in sorted(folder.rglob(MANIFEST_FILE)):
        where = manifest.parent
        data = read_json(manifest) or {}
        if data.get("encoding"):
            continue
        if "method" in data:
            save_method_index(load_method_index(where, str(data["method"])), where, compact=True)
        else:
            save_cluster_map(load_cluster_map(where), where, compact=True)
        done.append(where)
    record = read_json(folder / BUILD_FILE)
    if done and record is not None:
        for name, summary in record.get("maps", {}).items():
            if (folder / name / MANIFEST_FILE).exists():
                summary["tensors_digest"] = load_manifest(folder / name).tensors_digest
        write_json(folder / BUILD_FILE, record)
    return done
