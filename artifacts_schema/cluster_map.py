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

Encoding (version 6): ``encoding``, empty for the layout above; a shipped map (:func:`save_cluster_map` with
``compact``) stores its tensors compact (``artifacts_schema/compact.py``): centroids and the normaliser's
``grad`` and ``curv`` (the upper triangles of symmetric matrices) as int8 rows with a float32 scale each
(version 7; float16 in version 6), the squared norms in float32 computed from the centroids as decoded (so
the assignment ranks clusters by the centroids it reads), set
sizes for ``indptr``, each set's ids as its first id and the gaps (uint16 for a vocabulary of at most 65,536
ids), and ``population`` [r], each cluster's member predictions, instead of ``counts``: decoding reads only
those sums (which clusters to cache first), and they cost r numbers where counts cost nnz. Loaded, a compact
map has the arrays of a plain one, float32 and int32/int64; its ``counts`` carry each cluster's population on
the cluster's first id, so ``min_count`` pruning, which needs every id's count, refuses it. ``encoding`` also
records ``plain_digest``, the digest of the plain map it was encoded from, so a publish can tell it is
unchanged.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from fastvocab import __version__
from fastvocab.artifacts_schema.compact import decode_tensors, encode_tensors, int8_decoded
from fastvocab.artifacts_schema.digest import digest
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.tensor_folder import MANIFEST_FILE as MANIFEST_FILE
from fastvocab.artifacts_schema.tensor_folder import read_manifest, read_tensors, write_tensor_folder

# Version 2: the map's scope is named ``scope`` (was ``mode``) and the manifest records ``tensors_digest``.
# Version 3: the per-cluster normaliser of the inactive columns (``normaliser_*`` tensors and the manifest's
# ``normaliser``).
# Version 4: the manifest records what the map covers (``beams``, ``beam_states``); tensors as version 3.
# Version 5: the manifest's ``probes``, the decoding default (a version-4 reader would ignore it).
# Version 6: the manifest's ``encoding``; a compact map stores other tensors (module docstring).
# Version 7: a compact map's centroids and normaliser are int8 rows with their scales (float16 in version 6),
# which a version-6 reader would misread.
MAP_SCHEMA_VERSION = 7
# oldest first: a version-3 map serves, its beams unknown; a version-3 or -4 map probes 1 cluster
READABLE_MAP_VERSIONS = (3, 4, 5, 6, MAP_SCHEMA_VERSION)
MAP_SCOPES = ("direction", "target")  # source+target known / target-only (Amer et al. Sec. 2.2)
TARGET_PREFIX = "to-"  # a target-scope map's folder and manifest direction: "to-it"
LEGACY_TARGET_PREFIX = "*-"  # how earlier maps' manifests spelled it ("*-it"), still read
REBUILD_HINT = "rebuild it with `fastvocab run CONFIG --stages kmeans,maps`"
TENSORS_FILE = "map.safetensors"
COMPACT_FORMAT = "compact/1"  # a compact map's encoding["format"] (module docstring)
POPULATION = "population"  # encoding["counts"]: a compact map stores each cluster's population


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
    # how the tensors are stored: empty for the plain layout; a compact map's {"format", "tensors" (each
    # tensor's entry, compact.py), "counts": "population", "plain_digest"}
    encoding: dict[str, object] = field(default_factory=dict)
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

    @property
    def counts_per_id(self) -> bool:
        """Whether ``counts`` holds every id's count (False for a compact map: each cluster's population on
        its first id)."""
        return self.manifest.encoding.get("counts") != POPULATION

    def population(self) -> np.ndarray:
        """(r,) int64, each cluster's member predictions (the sum of its counts)."""
        cum = np.concatenate([[0], np.cumsum(np.asarray(self.counts, dtype=np.int64))])
        return np.diff(cum[self.indptr])

    def active_fractions(self) -> np.ndarray:
        return np.diff(self.indptr).astype(np.float64) / self.manifest.n_vocab

    def pruned(self, min_count: int) -> ClusterMap:
        """Drop (cluster, id) pairs predicted fewer than ``min_count`` times.

        The normaliser describes the unpruned sets: a pruned map has none (it is computed at load time).
        A compact map keeps no per-id counts: pruning it is an ArtifactError.
        """
        if min_count <= 1:
            return self
        if not self.counts_per_id:
            raise ArtifactError(
                f"cluster map {self.manifest.direction} is stored compact, with each cluster's population "
                f"and no per-id counts: min_count {min_count} pruning needs the map as built ({REBUILD_HINT})"
            )
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


def _plain_tensors(cmap: ClusterMap) -> dict[str, np.ndarray]:
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
    return tensors


def _sq_norms(centroids: np.ndarray) -> np.ndarray:
    # the maps builder's formula (tasks/maps.centroid_sq_norms), on the centroids as stored
    c = np.asarray(centroids, dtype=np.float32)
    return np.einsum("rd,rd->r", c, c, dtype=np.float32)


def _compact_tensors(cmap: ClusterMap) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """A map's compact tensors and its manifest's ``encoding`` (module docstring)."""
    from safetensors.numpy import save

    n = cmap.manifest.n_vocab
    if cmap.counts_per_id:
        plain_digest = digest(save(_plain_tensors(cmap)))
    else:  # re-encoding a compact map: it came from the plain map its encoding names
        plain_digest = str(cmap.manifest.encoding.get("plain_digest", ""))
    # the centroids as a reader decodes them, so that the squared norms are theirs
    centroids = int8_decoded(cmap.centroids)
    tensors: dict[str, np.ndarray] = {
        "centroids": centroids,
        "centroid_sq_norms": _sq_norms(centroids),
        "indptr": np.asarray(cmap.indptr, dtype=np.int64),
        "indices": np.asarray(cmap.indices, dtype=np.int32),
        "population": cmap.population(),
    }
    options: dict[str, dict[str, object]] = {
        "centroids": {"int8": True},
        "centroid_sq_norms": {},
        "indptr": {"int_bound": n + 1, "delta": "all"},
        "indices": {"int_bound": n, "delta": "indptr"},
        "population": {"int_bound": 1 << 62},
    }
    if cmap.normaliser is not None:
        for name in NORMALISER_FIELDS:
            tensors[f"normaliser_{name}"] = np.asarray(getattr(cmap.normaliser, name), dtype=np.float32)
        # lse, resid and the basis are small and shift every row's estimate: kept float32
        options["normaliser_grad"] = {"int8": True}
        options["normaliser_curv"] = {"int8": True, "symmetric": True}
    stored, entries = encode_tensors(tensors, options)
    encoding: dict[str, object] = {
        "format": COMPACT_FORMAT,
        "tensors": entries,
        "counts": POPULATION,
        "plain_digest": plain_digest,
    }
    return stored, encoding


def save_cluster_map(cmap: ClusterMap, map_dir: str | Path, *, compact: bool = False) -> Path:
    """Write the map folder atomically (tensors + manifest appear together or not at all).

    The manifest records the digest of the tensors file, so readers can check it without rehashing anything
    else and provenance records can name the map by it. ``compact``: the shipped form (module docstring),
    zstd-compressed; loaded, it gives a plain map's arrays, floats within their int8 rows' rounding.
    """
    validate(cmap)
    if not compact:
        if not cmap.counts_per_id:
            raise ArtifactError(
                f"cluster map {cmap.manifest.direction} holds no per-id counts (a compact map): "
                "save it compact"
            )
        return write_tensor_folder(map_dir, TENSORS_FILE, _plain_tensors(cmap), cmap.manifest)
    manifest = dataclasses.replace(cmap.manifest, schema_version=MAP_SCHEMA_VERSION)
    tensors, manifest.encoding = _compact_tensors(cmap)
    return write_tensor_folder(map_dir, TENSORS_FILE, tensors, manifest, compress=True)


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
        if manifest.encoding:
            t = _decode_compact(t, manifest)
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
    except (ValueError, TypeError) as exc:
        raise ArtifactError(f"corrupt cluster map {map_dir}: its tensors do not decode ({exc})") from exc
    validate(cmap, f"cluster map {map_dir}")
    return cmap


def _decode_compact(stored: dict[str, np.ndarray], manifest: MapManifest) -> dict[str, np.ndarray]:
    """A compact map's stored tensors decoded to the plain layout's arrays."""
    enc = manifest.encoding
    if enc.get("format") != COMPACT_FORMAT or enc.get("counts") != POPULATION:
        raise ValueError(f"unknown encoding {enc.get('format')!r}")
    entries = enc["tensors"]
    if not isinstance(entries, dict):
        raise ValueError("encoding.tensors is not a mapping")
    t = decode_tensors(stored, entries)
    t["indices"] = t["indices"].astype(np.int32)
    population = t.pop("population")
    sizes = np.diff(t["indptr"])
    if population.shape != sizes.shape:
        raise ValueError(f"population shape {population.shape} for {len(sizes)} clusters")
    # each cluster's population on its first id: sums per cluster are what decoding reads
    counts = np.zeros(len(t["indices"]), dtype=np.int32 if population.max(initial=0) < 2**31 else np.int64)
    counts[t["indptr"][:-1][sizes > 0]] = population[sizes > 0]
    t["counts"] = counts
    return t


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
