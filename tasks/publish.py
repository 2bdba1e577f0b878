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
import shutil
from pathlib import Path
from typing import Any

from fastvocab import __version__
from fastvocab.artifacts_schema.cluster_map import (
    MAP_SCHEMA_VERSION,
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
BUILD_FORMAT = "fastvocab-published-maps/2"  # /1 kept one record for all its maps


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
        if there is None or not there.encoding or _as_plain(there) != _as_plain(src):
            # shipped: carried by every clone, so compact
            save_cluster_map(load_cluster_map(maps_root / name), out / name, compact=True)
            there = load_manifest(out / name)
            copied.append(name)
        feeding = src.extra.get("directions")
        directions = [str(d) for d in feeding] if isinstance(feeding, list) else [name]
        summaries[name] = map_summary(there) | {"build": _build_of(record, directions)}
    old = read_json(out / BUILD_FILE)
    if copied or old is None:
        kept = _earlier_entries(old, record, out, set(names))
        # which map serves which direction was measured (record_choices): kept, for the same model, while
        # its map is published
        published = set(kept) | set(summaries)
        same_model = old is not None and old.get("model_fingerprint") == record.get("model_fingerprint")
        earlier = (old or {}).get("serves") or {} if same_model else {}
        serves = {d: c for d, c in earlier.items() if c["map"] in published}
        write_json(
            out / BUILD_FILE,
            {
                "format": BUILD_FORMAT,
                "fastvocab_version": __version__,
                **record,
                "maps": dict(sorted((kept | summaries).items())),
                **({"serves": serves} if serves else {}),
            },
        )
    return copied


def _build_of(record: dict[str, Any], directions: list[str]) -> dict[str, Any]:
    """How one map was built: the run's command, commit and settings, and the sources of its directions."""
    build: dict[str, Any] = {k: record[k] for k in ("command", "commit", "settings") if k in record}
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
    """Rewrite in the compact form, each atomically and in place, every map and method index under
    ``folder`` (a maps folder beside a model) that is not compact yet, and every map compact in an older
    version (its sets unchanged, its floats rounded as this version stores them): the manifests keep every
    field but ``encoding``, ``schema_version`` and ``tensors_digest``, and ``maps.json`` (when there) names
    the new digests. Returns the folders rewritten."""
    folder = Path(folder)
    done: list[Path] = []
    for manifest in sorted(folder.rglob(MANIFEST_FILE)):
        where = manifest.parent
        data = read_json(manifest) or {}
        is_map = "method" not in data
        current = not is_map or data.get("schema_version") == MAP_SCHEMA_VERSION
        if data.get("encoding") and current:
            continue
        if not is_map:
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
