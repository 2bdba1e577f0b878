"""Which output-layer method a translation decodes with and which artifacts it reads, as ``fastvocab
translate`` and ``fastvocab.Translator`` both decide it: one rule, so the two decode the same maps alike.

Maps given imply the clustered method. Maps shipped with their shortlist tables were built to decode with
them (their sets of K 1 take the shortlist's candidates for granted), so the tables beside the maps join the
clusters' sets by default. Only manifests are read here: a map of another direction or model, or a table of
another method, is refused before anything loads.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.checks import check_map_direction
from fastvocab.pipeline.errors import UserError

log = logging.getLogger(__name__)


def print_warning(text: str) -> None:
    """A warning as the CLI gives it: one line on standard error (its output may be standard output)."""
    print(f"warning: {text}", file=sys.stderr)


def implied_method(method: str | None, clusters: object | None) -> str:
    """The method asked for, else clustered when maps are given, else full."""
    if method is not None:
        return method
    return "clustered" if clusters is not None else "full"


def clustered_artifacts(
    clusters: str | Path,
    src_lang: str,
    tgt_lang: str,
    *,
    beam: int,
    selection: str = "union",
    with_shortlist: str | Path | None = None,
    no_shortlist: bool = False,
    warn: Callable[[str], None] = print_warning,
) -> tuple[Path, Path | None]:
    """(the map folder, the shortlist table folder or None) that the clustered method decoding
    ``src_lang``-``tgt_lang`` at ``beam`` reads, from ``clusters`` (a map folder or a folder of maps).

    The map must be of this direction (``ArtifactError``); one not built for ``beam`` still decodes, with a
    warning that says how to rebuild it. ``with_shortlist`` names the tables (which need union selection:
    ``ClusteredOptions`` refuses them with another); None takes those beside the maps, which ``no_shortlist``
    (or a selection other than union, which they cannot join) leaves out, with a warning, since outputs then
    change on many more lines. ``warn`` receives each warning's text.
    """
    from fastvocab.artifacts_schema.cluster_map import coverage_problem, resolve_map_dir

    if no_shortlist and with_shortlist is not None:
        raise UserError("--no-shortlist and --with-shortlist: give one of them")
    direction = f"{src_lang}-{tgt_lang}"
    map_dir = resolve_map_dir(clusters, src_lang, tgt_lang)
    manifest = check_map_direction(map_dir, src_lang, tgt_lang)
    problem = coverage_problem(manifest, beam, map_dir)
    if problem is not None:
        warn(problem)
    if with_shortlist is None:
        with_shortlist = _default_shortlist(Path(clusters), map_dir, direction, selection, no_shortlist, warn)
    if with_shortlist is None:
        return map_dir, None
    return map_dir, resolve_index(Path(with_shortlist), "shortlist", direction, "--with-shortlist")


def _default_shortlist(
    given: Path,
    map_dir: Path,
    direction: str,
    selection: str,
    no_shortlist: bool,
    warn: Callable[[str], None],
) -> Path | None:
    """The shortlist table of ``direction`` beside the maps (under a maps root:
    ``models/demo-maps/shortlist/``; a work dir's ``methods/``; the map folder's parent), unless it is left
    out, which is said."""
    from fastvocab.artifacts_schema.method_index import MANIFEST_FILE
    from fastvocab.tasks.methods import METHODS_DIR, index_dir

    roots = dict.fromkeys((given, given / METHODS_DIR, map_dir.parent, map_dir.parent.parent / METHODS_DIR))
    places = [index_dir(root, "shortlist", direction) for root in roots]
    tables = next((p for p in places if (p / MANIFEST_FILE).is_file()), None)
    if tables is None:
        return None
    if no_shortlist:
        warn(
            f"--no-shortlist: decoding without the shortlist tables beside the maps ({tables}); "
            "outputs may differ from full softmax on many more lines"
        )
        return None
    if selection != "union":
        warn(
            f"--selection {selection} decodes without the shortlist tables beside the maps ({tables}), which "
            "join a union batch only; outputs may differ from full softmax on many more lines"
        )
        return None
    log.info("clustered: with the shortlist tables beside the maps, %s (--no-shortlist: without)", tables)
    return tables


def resolve_index(path: Path, method: str, direction: str, flag: str = "--index") -> Path:
    """The artifact folder ``--index`` names for ``method`` and ``direction``: the folder itself when it
    holds a manifest, else the pipeline's layout under it (``tasks.methods.index_dir``) or under its
    ``methods/``. Only the manifest is read: another method or direction is an ArtifactError before the
    model loads."""
    from fastvocab.artifacts_schema.method_index import ANY_DIRECTION, MANIFEST_FILE, load_index_manifest
    from fastvocab.tasks.methods import index_places

    tried = index_places(path, method, direction)
    found = next((p for p in tried if (p / MANIFEST_FILE).is_file()), None)
    if found is None:
        raise UserError(
            f"{flag} {path}: no {method} artifact there "
            f"(looked for {', '.join(str(p / MANIFEST_FILE) for p in tried)}); "
            f"build one with fastvocab run (methods.build: [{method}])"
        )
    m = load_index_manifest(found)
    if m.method != method:
        raise ArtifactError(f"{flag} {found} is a {m.method} artifact, not a {method} one")
    if m.direction not in (ANY_DIRECTION, direction):
        raise ArtifactError(f"{flag} {found} is a {method} artifact for {m.direction}, not for {direction}")
    return found
