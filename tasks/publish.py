"""Maps shipped beside a model: copies of a run's cluster maps, and the record of how they were built.

A map is an artifact of its model, built once from all the text a direction has (far more than a quick run
dumps) and versioned with it. ``maps.publish`` (``configs/demo-maps.yaml``) writes the run's maps to a folder
beside the model, one map folder per direction as ``maps/`` holds them (``fastvocab translate --clusters
DIR`` and ``eval.maps`` read it; the tensors zstd-compressed, as ``map.safetensors.zst``), and
``maps.json`` there: the model's fingerprint, each direction's source
text (inputs, line counts, dev and test lines left out) and dumped states per path, the settings, and the
command, commit and fastvocab version that built them. A map whose tensors did not change is not copied
again, and the record is rewritten only when a map changed, so a rerun leaves the folder as it was.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from fastvocab import __version__
from fastvocab.artifacts_schema.atomic import atomic_path
from fastvocab.artifacts_schema.cluster_map import TENSORS_FILE, MapManifest, load_cluster_map, load_manifest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.jsonfile import read_json, write_json
from fastvocab.artifacts_schema.tensor_folder import compress_tensor_file

BUILD_FILE = "maps.json"
BUILD_FORMAT = "fastvocab-published-maps/2"  # /1 kept one record for all its maps


def _current(path: Path) -> MapManifest | None:
    """The manifest of a published map whose tensors read back whole (None: missing or damaged)."""
    try:
        return load_cluster_map(path).manifest
    except ArtifactError:
        return None


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
    names copied.

    Directions are often built by separate runs (text and budgets differ by direction), so the record is
    kept per map: each entry holds its own ``build`` (command, commit, settings, its directions' sources),
    and the entries of maps published earlier for the same model are kept beside the new ones.
    """
    out = Path(out)
    copied: list[str] = []
    summaries: dict[str, Any] = {}
    for name in names:
        src = load_manifest(maps_root / name)  # ArtifactError: the maps stage did not finish
        there = _current(out / name)
        if there is None or there != src:
            with atomic_path(out / name) as tmp:
                shutil.copytree(maps_root / name, tmp)
                compress_tensor_file(tmp, TENSORS_FILE)  # shipped: carried by every clone
            copied.append(name)
        summaries[name] = map_summary(src) | {"build": _build_of(record, src.extra.get("directions", [name]))}
    old = read_json(out / BUILD_FILE)
    if copied or old is None:
        kept = _earlier_entries(old, record, out, set(names))
        write_json(
            out / BUILD_FILE,
            {
                "format": BUILD_FORMAT,
                "fastvocab_version": __version__,
                **record,
                "maps": dict(sorted((kept | summaries).items())),
            },
        )
    return copied


def _build_of(record: dict[str, Any], directions: list[str]) -> dict[str, Any]:
    """How one map was built: the run's command, commit and settings, and the sources of its directions."""
    build = {k: record[k] for k in ("command", "commit", "settings") if k in record}
    sources = record.get("sources")
    if isinstance(sources, dict):
        build["sources"] = {d: sources[d] for d in directions if d in sources}
    return build


def _earlier_entries(
    old: dict[str, Any] | None, record: dict[str, Any], out: Path, names: set[str]
) -> dict[str, Any]:
    """The entries of ``old`` for maps still published in ``out`` for the same model (an entry of the first
    format, which kept one record for all its maps, gets that record as its ``build``)."""
    if not old or old.get("model_fingerprint") != record.get("model_fingerprint"):
        return {}
    kept = {}
    for name, entry in (old.get("maps") or {}).items():
        if name in names or not (out / name).is_dir():
            continue
        if "build" not in entry:
            entry = entry | {"build": _build_of(old, entry.get("directions", [name]))}
        kept[name] = entry
    return kept


def record_choices(out: Path, choices: dict[str, dict[str, Any]]) -> list[str]:
    """Record in ``out/maps.json`` which published map serves each direction and why (``serves``), and
    withdraw from ``out`` the candidates that lost: a direction's own map where its target's pooled map
    won (decoding then falls back to the pooled one), and a pooled map that no direction chose. Returns
    the folders removed."""
    out = Path(out)
    record = read_json(out / BUILD_FILE)
    if record is None:
        raise ArtifactError(f"no published maps at {out} ({BUILD_FILE} missing): publish them first")
    chosen = {c["map"] for c in choices.values()}
    losers = {name for c in choices.values() for name in c["measured"] if name not in chosen}
    for name in chosen:
        if not (out / name).is_dir():
            raise ArtifactError(
                f"{out / name} is not published: publish the map that won before recording it"
            )
    removed = []
    for name in sorted(losers):
        if (out / name).is_dir():
            shutil.rmtree(out / name)
            removed.append(name)
    serves = dict(record.get("serves") or {})
    serves.update({d: {k: c[k] for k in ("map", "why", "split", "measured")} for d, c in choices.items()})
    record["serves"] = dict(sorted(serves.items()))
    record["maps"] = {n: e for n, e in (record.get("maps") or {}).items() if n not in removed}
    write_json(out / BUILD_FILE, record)
    return removed
