"""Checks of user input that must pass before any work starts: devices, output paths, a map's direction.

Each raises :class:`~fastvocab.pipeline.errors.UserError` (or ``ArtifactError`` for an artifact) with one
line naming the input and the problem; ``pipeline/cli.py`` turns that into exit code 2.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.errors import UserError

if TYPE_CHECKING:
    from fastvocab.artifacts_schema.cluster_map import MapManifest

DEVICE_TYPES = ("cpu", "cuda", "mps")


def check_device_name(device: str, what: str = "--device") -> str:
    """The device type of ``device`` (cpu, cuda, cuda:N, mps), without importing torch or asking for one.

    For a config read on a Ray driver that may have no GPU itself: the workers' nodes may.
    """
    kind, sep, index = device.partition(":")
    if kind not in DEVICE_TYPES or (sep and not (kind == "cuda" and index.isdigit())):
        raise UserError(f"{what} {device}: not a device this runs on (use cpu, cuda, cuda:N or mps)")
    return kind


def check_device(device: str, what: str = "--device") -> None:
    """``device`` must name a device type we support and that this machine has (one line otherwise)."""
    kind = check_device_name(device, what)
    if kind == "cpu":
        return
    import torch

    if kind == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise UserError(f"{what} {device}: no CUDA GPU is available on this machine (use --device cpu)")
        index = int(device.partition(":")[2] or 0)
        if index >= count:
            raise UserError(
                f"{what} {device}: this machine has {count} CUDA GPU(s), cuda:0..cuda:{count - 1}"
            )
    elif kind == "mps" and not torch.backends.mps.is_available():
        raise UserError(
            f"{what} {device}: no Apple MPS device is available on this machine (use --device cpu)"
        )


def check_int8_device(dtype: str, device: str, what: str = "--dtype", where: str = "--device") -> None:
    """int8 is torch's dynamic quantisation, which runs on CPU only: refused elsewhere before any load."""
    if dtype == "int8" and device.partition(":")[0] != "cpu":
        raise UserError(f"{what} int8 runs on CPU only (dynamic quantisation), not {where} {device}")


def check_output_file(path: Path, what: str = "--output") -> None:
    """``path`` must be a file name we can create: not a folder, inside a folder we may write to.

    Checked before any work, so a long translation never fails at its very end. Nothing is left behind: the
    probe file is removed, and missing parent folders are only checked, not created.
    """
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{what} {path} is a folder; give the output file's name (e.g. {path}/out.txt)")
    parent = path.parent
    existing = parent
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{what} {path}: {existing} is not a folder")
    if existing != parent:
        # the writer creates the missing folders: they must be creatable here
        if not os.access(existing, os.W_OK | os.X_OK):
            raise UserError(f"{what} {path}: cannot create folders in {existing} (permission denied)")
        return
    try:
        with tempfile.TemporaryFile(dir=parent, prefix=f".{path.name}.probe"):
            pass
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot write in {parent} ({exc.strerror or exc})") from exc


def map_direction_matches(map_direction: str, src: str, tgt: str) -> bool:
    """A map of ``en-it`` serves en->it only; a target-scope map ``to-it`` serves any source into ``it``."""
    from fastvocab.artifacts_schema.cluster_map import map_dir_name

    return map_direction in (map_dir_name(src, tgt, "direction"), map_dir_name(src, tgt, "target"))


def check_map_direction(map_dir: str | Path, src: str, tgt: str, fix: str | None = None) -> MapManifest:
    """The map's manifest; a map built for another direction (its manifest's ``direction``) is refused: its
    active sets hold the wrong language's tokens, so decoding with it writes garbage. ``fix`` replaces the
    default advice in the message."""
    from fastvocab.artifacts_schema.cluster_map import load_manifest

    manifest = load_manifest(map_dir)
    if not map_direction_matches(manifest.direction, src, tgt):
        fix = fix or f"use the map of {src}-{tgt} (or a target-scope map to-{tgt})"
        raise ArtifactError(
            f"cluster map {map_dir} was built for {manifest.direction}, not {src}-{tgt}: {fix}"
        )
    return manifest


def untrained_direction(model: Path, src_lang: str, tgt_lang: str) -> str | None:
    """A warning when the model folder's ``training_summary.json`` (written by ``fastvocab train-demo``)
    lists the directions it was trained on and ``src_lang-tgt_lang`` is not one of them: the model takes
    both languages, so the direction decodes, into what it never learnt. None otherwise (no record, a
    trained direction)."""
    import json

    try:
        summary = (Path(model) / "training_summary.json").read_text(encoding="utf-8")
        trained = json.loads(summary)["directions"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    direction = f"{src_lang}-{tgt_lang}"
    if not isinstance(trained, list) or not trained or direction in trained:
        return None
    return (
        f"{model} was not trained on {direction} (its directions: {', '.join(map(str, trained))}); "
        "its translations may be poor or in another language"
    )
