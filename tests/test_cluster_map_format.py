import json

import numpy as np
import pytest

from fastvocab.artifacts_schema.cluster_map import (
    ClusterMap,
    MapManifest,
    Normaliser,
    load_cluster_map,
    save_cluster_map,
)
from fastvocab.artifacts_schema.digest import digest
from fastvocab.artifacts_schema.errors import ArtifactError


def _map(indptr, indices, counts, n_vocab=10) -> ClusterMap:
    r = len(indptr) - 1
    manifest = MapManifest("fp", "en-it", "direction", r, 3, 2, n_vocab, 20, 0, states_used=7)
    centroids = np.arange(2 * r, dtype=np.float32).reshape(r, 2)
    return ClusterMap(
        manifest,
        centroids,
        (centroids**2).sum(1),
        np.array(indptr, np.int64),
        np.array(indices, np.int32),
        np.array(counts, np.int32),
    )


@pytest.mark.parametrize(
    ("indptr", "counts", "want_indptr", "want_ids"),
    [
        ([0, 3, 5, 5], [1, 2, 3, 1, 1], [0, 2, 2, 2], [4, 6]),  # last cluster empty (was an IndexError)
        ([0, 0, 3, 5], [1, 2, 3, 2, 1], [0, 0, 2, 3], [4, 6, 8]),  # first cluster empty
    ],
)
def test_pruned_drops_rare_ids_and_keeps_csr(indptr, counts, want_indptr, want_ids):
    indices = [2, 4, 6, 8, 9]
    pruned = _map(indptr, indices, counts).pruned(min_count=2)
    assert pruned.indptr.tolist() == want_indptr
    assert pruned.indices.tolist() == want_ids
    assert (pruned.counts >= 2).all()


def test_save_load_round_trip_and_fingerprint_refusal(tmp_path):
    cmap = _map([0, 3, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1])
    save_cluster_map(cmap, tmp_path / "m")
    back = load_cluster_map(tmp_path / "m", expect_fingerprint="fp")
    assert back.indices.tolist() == [2, 4, 6, 8, 9] and back.indptr.tolist() == [0, 3, 5, 5]  # set 1: [8, 9]
    with pytest.raises(ArtifactError, match="built for model fp"):
        load_cluster_map(tmp_path / "m", expect_fingerprint="other")
    (tmp_path / "m" / "map.safetensors").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="corrupt cluster map"):
        load_cluster_map(tmp_path / "m")


def test_manifest_names_the_tensors_and_a_changed_tensor_file_is_refused(tmp_path):
    cmap = _map([0, 3, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1])
    save_cluster_map(cmap, tmp_path / "m")
    manifest = json.loads((tmp_path / "m" / "manifest.json").read_text())
    data = (tmp_path / "m" / "map.safetensors").read_bytes()
    assert manifest["tensors_digest"] == digest(data) and manifest["scope"] == "direction"
    other = _map([0, 2, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1])  # valid tensors, but not these
    save_cluster_map(other, tmp_path / "o")
    (tmp_path / "m" / "map.safetensors").write_bytes((tmp_path / "o" / "map.safetensors").read_bytes())
    with pytest.raises(ArtifactError, match="does not match the digest in its manifest"):
        load_cluster_map(tmp_path / "m")


@pytest.mark.parametrize("version", [1, 2])
def test_a_map_of_an_older_format_is_refused_naming_the_rebuild_command(tmp_path, version):
    """Version 1 named the scope ``mode``; version 2 has no normaliser."""
    save_cluster_map(_map([0, 3, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1]), tmp_path / "m")
    path = tmp_path / "m" / "manifest.json"
    old = json.loads(path.read_text())
    old["schema_version"] = version
    del old["normaliser"]
    if version == 1:
        old["mode"] = old.pop("scope")
    path.write_text(json.dumps(old))
    reads = "reads versions 3, 4, 5, 6 and 7"
    match = rf"schema version {version}, this fastvocab {reads}: .*--stages kmeans,maps"
    with pytest.raises(ArtifactError, match=match):
        load_cluster_map(tmp_path / "m")


def _normaliser(r: int, d: int, k: int) -> Normaliser:
    rng = np.random.default_rng(0)
    return Normaliser(
        lse=rng.standard_normal(r).astype(np.float32),
        grad=rng.standard_normal((r, d)).astype(np.float32),
        basis=rng.standard_normal((d, k)).astype(np.float32),
        curv=rng.standard_normal((r, k, k)).astype(np.float32),
        resid=rng.random(r).astype(np.float32),
    )


def test_normaliser_round_trip_and_bad_shapes_refused(tmp_path):
    cmap = _map([0, 3, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1])
    cmap.normaliser = _normaliser(3, 2, 1)
    cmap.manifest.normaliser = {"rank": 1, "always_active": [0]}
    save_cluster_map(cmap, tmp_path / "m")
    back = load_cluster_map(tmp_path / "m")
    for name in ("lse", "grad", "basis", "curv", "resid"):
        np.testing.assert_array_equal(getattr(back.normaliser, name), getattr(cmap.normaliser, name))
    assert back.manifest.normaliser == {"rank": 1, "always_active": [0]}
    assert load_cluster_map(tmp_path / "m").pruned(1).normaliser is not None  # nothing pruned: still valid
    assert back.pruned(2).normaliser is None  # pruned sets: the stored normaliser does not describe them
    cmap.normaliser = _normaliser(4, 2, 1)
    with pytest.raises(ArtifactError, match="normaliser_lse shape"):
        save_cluster_map(cmap, tmp_path / "bad")


def test_non_finite_centroids_are_refused(tmp_path):
    cmap = _map([0, 3, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1])
    cmap.centroids[1, 0] = np.nan
    with pytest.raises(ArtifactError, match="NaN or inf"):
        save_cluster_map(cmap, tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_a_version_4_map_reads_with_probes_1_and_bad_probes_are_refused(tmp_path):
    save_cluster_map(_map([0, 3, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1]), tmp_path / "m")
    path = tmp_path / "m" / "manifest.json"
    old = json.loads(path.read_text())
    del old["probes"]
    old["schema_version"] = 4  # maps before they recorded their probes
    path.write_text(json.dumps(old))
    assert load_cluster_map(tmp_path / "m").manifest.probes == 1
    for bad in (0, 1.5, True):
        cmap = _map([0, 3, 5, 5], [2, 4, 6, 8, 9], [1, 2, 3, 1, 1])
        cmap.manifest.probes = bad
        with pytest.raises(ArtifactError, match=r"probes .* is not an integer >= 1"):
            save_cluster_map(cmap, tmp_path / "bad")
