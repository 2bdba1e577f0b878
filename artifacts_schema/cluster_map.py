"""Cluster map: centroids and per-cluster active vocabulary sets for one direction (or target language).

Folder layout (docs/DESIGN-NOTES.md, "Formats")::

    <map_dir>/map.safetensors   centroids [r, d] f32, centroid_sq_norms [r] f32,
                                indptr [r+1] i64, indices [nnz] i32, counts [nnz] i32  (CSR, ids sorted),
                                and the normaliser of the columns outside each set (version 3):
                                normaliser_lse [r] f32, normaliser_grad [r, d] f32,
                                normaliser_basis [d, k] f32, normaliser_curv [r, k, k] f32,
                                normaliser_resid [r] f32
    <map_dir>/manifest.json     schema version, model fingerprint, direction, scope, r, K, niter, seed,
                                the digest of map.safetensors, the beams whose states it was built
                                from and the states of each (version 4), the probes decoding
                                reads by default (version 5), ...

A map's *scope* says which decoder states fed it (Amer et al. Sec. 2.2): ``direction`` (source and target
known: one map per direction) or ``target`` (target only: one map per target language). Loading checks the
schema version, the tensors' digest, shapes, finite centroids, CSR invariants and (when given) the model
fingerprint.

The normaliser (``kernels/inactive_mass.NormaliserTables``) is computed for each set plus the model's
always-active ids, which the manifest records (``normaliser``: rank, always_active); a map may lack it (a
hand-made map), and the clustered projection then computes it at load time.

What a map covers (version 4): ``beams``, the beam sizes whose search states fed its clusters (1: the greedy
path), and ``beam_states``, how many states of each (key ``0``: the states along reference translations,
teacher-forced, which serve every beam as extra text and are not a beam of their own). Beam search at beam
``B`` extends every hypothesis with its ``2 x B`` best tokens, so a map serves ``B`` as measured when ``B``
is among its beams and ``K >= 2 x B`` (:func:`coverage_problem`). A version-3 map does not say; it is still
read.

Probes (version 5): ``probes``, how many nearest clusters' sets each row adds to a union batch's columns when
the decoder is not told otherwise (``maps.probes``; the clustered projection's ``probes``): the map's builder
measured its fidelity at that setting, as an inverted-file index keeps its ``nprobe``. A version-3 or -4
map reads as 1, the nearest cluster only (Amer et al.'s method).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastvocab import __version__
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.tensor_folder import MANIFEST_FILE as MANIFEST_FILE
from fastvocab.artifacts_schema.tensor_folder import read_manifest, read_tensors, write_tensor_folder

# Version 2: the map's scope is named ``scope`` (was ``mode``) and the manifest records ``tensors_digest``.
# Version 3: the per-cluster normaliser of the inactive columns (``normaliser_*`` tensors and the manifest's
# ``normaliser``).
# Version 4: the manifest records what the map covers (``beams``, ``beam_states``); tensors as version 3.
# Version 5: the manifest's ``probes``, the decoding default (a version-4 reader would ignore it).
MAP_SCHEMA_VERSION = 5
# oldest first: a version-3 map serves, its beams unknown; a version-3 or -4 map probes 1 cluster
READABLE_MAP_VERSIONS = (3, 4, MAP_SCHEMA_VERSION)
MAP_SCOPES = ("direction", "target")  # source+target known / target-only (Amer et al. Sec. 2.2)
TARGET_PREFIX = "to-"  # a target-scope map's folder and manifest direction: "to-it"
LEGACY_TARGET_PREFIX = "*-"  # how earlier maps' manifests spelled it ("*-it"), still read
REBUILD_HINT = "rebuild it with `fastvocab run CONFIG --stages kmeans,maps`"
TENSORS_FILE = "map.safetensors"


@dataclass
class MapManifest:
    model_fingerprint: str
    direction: str  # "en-it" in direction scope, "to-it" in target scope: its folder name (map_dir_name)
    scope: str  # one of MAP_SCOPES
    r: int
    k: int
    d: int
    n_vocab: int
    niter: int
    seed: int
    states_used: int
    active_fraction: dict[str, float] = field(default_factory=dict)  # mean, max, min, p50 over clusters
    extra: dict[str, object] = field(default_factory=dict)
    tensors_digest: str = ""  # digest of map.safetensors, set when the map is saved
    # {"rank": k, "always_active": [ids]} when the map holds a normaliser (empty when it does not)
    normaliser: dict[str, object] = field(default_factory=dict)
    # the beam sizes whose states fed the clusters, ascending (1: the greedy path); empty: not recorded (a
    # version-3 map)
    beams: list[int] = field(default_factory=list)
    # states per beam ("4": 123456), stored and streamed, over every direction that fed the map
    beam_states: dict[str, int] = field(default_factory=dict)
    # how many nearest clusters' sets each row adds to a union batch's columns unless the decoder is told
    # otherwise (1: the nearest only, and every map before version 5)
    probes: int = 1
    schema_version: int = MAP_SCHEMA_VERSION
    fastvocab_version: str = __version__
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def __post_init__(self) -> None:
        # one spelling in memory: a map whose manifest says "*-it" is the "to-it" map of today's writers
        if self.direction.startswith(LEGACY_TARGET_PREFIX):
            self.direction = TARGET_PREFIX + self.direction.removeprefix(LEGACY_TARGET_PREFIX)


@dataclass
class Normaliser:
    """Per-cluster expansion of the log-mass of the columns outside each set, around the centroid
    (see ``kernels/inactive_mass.NormaliserTables``, which computes it)."""

    lse: np.ndarray  # (r,) float32
    grad: np.ndarray  # (r, d) float32
    basis: np.ndarray  # (d, k) float32
    curv: np.ndarray  # (r, k, k) float32
    resid: np.ndarray  # (r,) float32

    def shape_problems(self, r: int, d: int) -> list[str]:
        k = self.basis.shape[1] if self.basis.ndim == 2 else -1
        want = {"lse": (r,), "grad": (r, d), "basis": (d, k), "curv": (r, k, k), "resid": (r,)}
        problems = [
            f"normaliser_{name} shape {getattr(self, name).shape} != {shape}"
            for name, shape in want.items()
            if getattr(self, name).shape != shape
        ]
        finite = [self.grad, self.basis, self.curv, self.resid]
        if not problems and not all(np.isfinite(a).all() for a in finite):
            problems.append("normaliser contains NaN or inf")
        return problems


NORMALISER_FIELDS = ("lse", "grad", "basis", "curv", "resid")


@dataclass
class ClusterMap:
    manifest: MapManifest
    centroids: np.ndarray  # (r, d) float32
    centroid_sq_norms: np.ndarray  # (r,) float32
    indptr: np.ndarray  # (r+1,) int64
    indices: np.ndarray  # (nnz,) int32, sorted within each cluster
    counts: np.ndarray  # (nnz,) int32, how many member states predicted the id
    normaliser: Normaliser | None = None  # for these sets + manifest.normaliser["always_active"]

    def active_ids(self, cluster: int) -> np.ndarray:
        return self.indices[self.indptr[cluster] : self.indptr[cluster + 1]]

    def active_fractions(self) -> np.ndarray:
        return np.diff(self.indptr).astype(np.float64) / self.manifest.n_vocab

    def pruned(self, min_count: int) -> ClusterMap:
        """Drop (cluster, id) pairs predicted fewer than ``min_count`` times.

        The normaliser describes the unpruned sets: a pruned map has none (it is computed at load time).
        """
        keep = self.counts >= min_count
        if keep.all():
            return self
        r = len(self.indptr) - 1
        cluster_of = np.repeat(np.arange(r), np.diff(self.indptr))  # (nnz,) cluster of each entry
        sizes = np.bincount(cluster_of[keep], minlength=r)
        indptr = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return ClusterMap(
            self.manifest,
            self.centroids,
            self.centroid_sq_norms,
            indptr,
            self.indices[keep],
            self.counts[keep],
        )


def active_fraction_stats(indptr: np.ndarray, n_vocab: int) -> dict[str, float]:
    frac = np.diff(indptr) / float(n_vocab)
    return {
        "mean": float(frac.mean()),
        "max": float(frac.max()),
        "min": float(frac.min()),
        "p50": float(np.median(frac)),
    }


def validate(cmap: ClusterMap, where: str = "cluster map") -> None:
    m = cmap.manifest
    r, d = cmap.centroids.shape if cmap.centroids.ndim == 2 else (-1, -1)
    problems = []
    if (r, d) != (m.r, m.d):
        problems.append(f"centroids shape {cmap.centroids.shape} != manifest ({m.r}, {m.d})")
    if cmap.centroid_sq_norms.shape != (m.r,):
        problems.append(f"centroid_sq_norms shape {cmap.centroid_sq_norms.shape}")
    if cmap.indptr.shape != (m.r + 1,) or cmap.indptr[0] != 0 or np.any(np.diff(cmap.indptr) < 0):
        problems.append("indptr is not a valid CSR row pointer")
    elif cmap.indptr[-1] != len(cmap.indices) or len(cmap.indices) != len(cmap.counts):
        problems.append("indptr[-1], len(indices) and len(counts) disagree")
    elif len(cmap.indices) and (cmap.indices.min() < 0 or cmap.indices.max() >= m.n_vocab):
        problems.append(f"token ids outside [0, {m.n_vocab})")
    if m.scope not in MAP_SCOPES:
        problems.append(f"unknown scope {m.scope!r}")
    if isinstance(m.probes, bool) or not isinstance(m.probes, int) or m.probes < 1:
        problems.append(f"probes {m.probes!r} is not an integer >= 1")
    if cmap.centroids.size and not np.isfinite(cmap.centroids).all():
        problems.append("centroids contain NaN or inf")
    if cmap.normaliser is not None:
        problems += cmap.normaliser.shape_problems(m.r, m.d)
        if m.normaliser.get("rank") != cmap.normaliser.basis.shape[-1]:
            problems.append(f"manifest normaliser {m.normaliser} does not match its tensors")
    if m.schema_version not in READABLE_MAP_VERSIONS:
        problems.append(f"schema version {m.schema_version}, expected {MAP_SCHEMA_VERSION}")
    if problems:
        raise ArtifactError(f"invalid {where}: " + "; ".join(problems))


def save_cluster_map(cmap: ClusterMap, map_dir: str | Path) -> Path:
    """Write the map folder atomically (tensors + manifest appear together or not at all).

    The manifest records the digest of the tensors file, so readers can check it without rehashing anything
    else and provenance records can name the map by it.
    """
    validate(cmap)
    tensors: dict[str, np.ndarray] = {
        "centroids": np.ascontiguousarray(cmap.centroids, dtype=np.float32),
        "centroid_sq_norms": np.ascontiguousarray(cmap.centroid_sq_norms, dtype=np.float32),
        "indptr": np.ascontiguousarray(cmap.indptr, dtype=np.int64),
        "indices": np.ascontiguousarray(cmap.indices, dtype=np.int32),
        "counts": np.ascontiguousarray(cmap.counts, dtype=np.int32),
    }
    if cmap.normaliser is not None:
        for name in NORMALISER_FIELDS:
            tensors[f"normaliser_{name}"] = np.ascontiguousarray(
                getattr(cmap.normaliser, name), dtype=np.float32
            )
    return write_tensor_folder(map_dir, TENSORS_FILE, tensors, cmap.manifest)


def load_manifest(map_dir: str | Path) -> MapManifest:
    """A map's manifest; ArtifactError for a missing, corrupt or other-version manifest (naming the fix)."""
    return read_manifest(map_dir, "cluster map", MapManifest, READABLE_MAP_VERSIONS, REBUILD_HINT)


def check_map_model(map_dir: str | Path, fingerprint: str) -> MapManifest:
    """The manifest of a map built for the model whose fingerprint is ``fingerprint``; ArtifactError naming
    both models when it was built for another (its sets would name another vocabulary's columns)."""
    manifest = load_manifest(map_dir)
    if manifest.model_fingerprint != fingerprint:
        raise ArtifactError(
            f"cluster map {map_dir} was built for model {manifest.model_fingerprint}, "
            f"but the loaded model is {fingerprint}"
        )
    return manifest


def load_cluster_map(map_dir: str | Path, expect_fingerprint: str | None = None) -> ClusterMap:
    """Load and validate a map; with ``expect_fingerprint``, refuse a map built for another model."""
    map_dir = Path(map_dir)
    if expect_fingerprint is not None:
        manifest = check_map_model(map_dir, expect_fingerprint)
    else:
        manifest = load_manifest(map_dir)
    t = read_tensors(map_dir, TENSORS_FILE, manifest.tensors_digest, "cluster map")
    try:
        normaliser = None
        if manifest.normaliser:
            normaliser = Normaliser(**{name: t[f"normaliser_{name}"] for name in NORMALISER_FIELDS})
        cmap = ClusterMap(
            manifest,
            t["centroids"],
            t["centroid_sq_norms"],
            t["indptr"],
            t["indices"],
            t["counts"],
            normaliser,
        )
    except KeyError as exc:
        raise ArtifactError(f"cluster map {map_dir} lacks tensor {exc}") from exc
    validate(cmap, f"cluster map {map_dir}")
    return cmap


def beams_rebuild_hint(beams: list[int] | tuple[int, ...]) -> str:
    """The command that rebuilds a pipeline's maps for ``beams``."""
    return f"fastvocab run CONFIG --set 'maps.beams=[{', '.join(str(b) for b in sorted(set(beams)))}]'"


def coverage_problem(manifest: MapManifest, beam: int, where: str | Path = "cluster map") -> str | None:
    """One line saying that ``manifest``'s map was not built for beam search at ``beam`` (its beams, the
    expected effect, the command that rebuilds it), or None when it was.

    A map covers ``beam`` when ``beam`` is among its recorded beams and its K is at least ``2 x beam`` (the
    candidates beam search keeps per hypothesis; greedy search needs K >= 1). A map that records no beams (a
    version-3 map) is taken as covering greedy search, the only dump there was by default, and nothing else.
    """
    need_k = 1 if beam == 1 else 2 * beam
    beams = sorted(manifest.beams)
    if beam in beams and manifest.k >= need_k:
        return None
    if not beams and beam == 1:
        return None
    if not beams:
        built = "does not record which beams it was built for (an older map)"
    elif beam in beams:
        built = f"was built for beams {beams} with K={manifest.k}, below the {need_k} ids beam {beam} needs"
    else:
        built = f"was built for beams {beams} (K={manifest.k})"
    effect = ("more " if beam > 1 else "") + "outputs may differ from full softmax"
    return (
        f"cluster map {where} {built}: at beam {beam} {effect}; rebuild it with "
        f"{beams_rebuild_hint([*beams, beam] if beams else [1, beam])}"
    )


def map_dir_name(src_lang: str, tgt_lang: str, scope: str) -> str:
    """Folder name of a map under a maps root: ``en-it`` (direction scope) or ``to-it`` (target scope)."""
    if scope == "direction":
        return f"{src_lang}-{tgt_lang}"
    if scope == "target":
        return f"{TARGET_PREFIX}{tgt_lang}"
    raise ValueError(f"unknown map scope {scope!r}; valid: {', '.join(MAP_SCOPES)}")


WORK_DIR_MAPS = "maps"  # where a pipeline work dir keeps its maps


def resolve_map_dir(path: str | Path, src_lang: str, tgt_lang: str) -> Path:
    """``path`` is a map folder, or a maps root holding ``<src>-<tgt>/`` or ``to-<tgt>/`` (tried in order:
    a direction's own map first, else its target language's pooled map), or a pipeline work dir whose
    ``maps/`` is such a root. A direction with neither is an ArtifactError naming the maps found there and
    the command that builds one."""
    path = Path(path)
    if (path / MANIFEST_FILE).exists():
        return path
    roots = [path, path / WORK_DIR_MAPS]
    for root in roots:
        for scope in MAP_SCOPES:
            candidate = root / map_dir_name(src_lang, tgt_lang, scope)
            if (candidate / MANIFEST_FILE).exists():
                return candidate
    found = available_maps(path)
    have = f"it has maps for {', '.join(found)}" if found else "it holds no cluster map"
    direction = f"{src_lang}-{tgt_lang}"
    raise ArtifactError(
        f"no cluster map for {direction} at {path} (looked for {direction}/ and to-{tgt_lang}/ there and in "
        f"{WORK_DIR_MAPS}/); {have}; build one with `fastvocab run CONFIG --set 'directions=[{direction}]'` "
        "(configs/demo-maps.yaml: the demo model's shipped maps)"
    )


def available_maps(path: str | Path) -> list[str]:
    """The map folders (``en-it``, ``to-en``) directly under ``path`` or its ``maps/``, sorted."""
    path = Path(path)
    names = {
        d.name
        for root in (path, path / WORK_DIR_MAPS)
        if root.is_dir()
        for d in root.iterdir()
        if (d / MANIFEST_FILE).is_file()
    }
    return sorted(names)
