"""The compact shipped form of cluster maps and shortlist tables: it loads to the plain form's arrays,
decodes what the plain form decodes, keeps reading older folders, and refuses what it cannot hold."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fastvocab.artifacts_schema.cluster_map import MAP_SCHEMA_VERSION, load_cluster_map, save_cluster_map
from fastvocab.artifacts_schema.compact import decode_tensor, encode_tensor, int_dtype
from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.method_index import load_method_index, save_method_index
from fastvocab.artifacts_schema.tensor_folder import COMPRESSED_SUFFIX, MANIFEST_FILE
from fastvocab.decoding.hf_adapter import Seq2SeqAdapter
from fastvocab.decoding.search import beam_search, greedy_search
from fastvocab.decoding.settings import SearchSettings
from fastvocab.tasks.maps import attach_normaliser
from fastvocab.tasks.projections import make_projection
from fastvocab.tasks.publish import BUILD_FILE, compact_published
from fastvocab.tasks.shortlist import ShortlistParams, build_shortlist
from tests.conftest import synthetic_sentences
from tests.layers import map_from_sets
from tests.test_shortlist import parallel_text

HALF = 2.0**-11  # float16's relative rounding


@pytest.fixture(scope="module")
def adapter(tiny_model_dir) -> Seq2SeqAdapter:
    return Seq2SeqAdapter.load(tiny_model_dir, device="cpu", dtype=torch.float32)


@pytest.fixture(scope="module")
def index(adapter):
    src, tgt = parallel_text(300)
    return build_shortlist(adapter, "en-it", src, tgt, ShortlistParams(k=3, frequent=4, iterations=3))


@pytest.fixture(scope="module")
def cmap(adapter):
    """Centroids at the decoder states' scale, sets of varied sizes, per-id counts and a normaliser."""
    rng = np.random.default_rng(5)
    n, r = adapter.n_vocab, 10
    sets = [rng.choice(n, int(rng.integers(1, 40)), replace=False).tolist() for _ in range(r)]
    counts = [rng.integers(1, 9, len(s)).tolist() for s in sets]
    states = greedy_states(adapter)
    centroids = states[rng.choice(len(states), r, replace=False)] + 0.1 * rng.standard_normal(
        (r, states.shape[1])
    )
    m = map_from_sets(centroids, sets, n, adapter.fingerprint, counts=counts)
    return attach_normaliser(
        m, adapter.output_weight, adapter.output_bias, adapter.always_active_ids(), rank=4
    )


def compress_map_file(folder) -> None:
    """Replace a plain map's ``map.safetensors`` by its compressed form, as maps were once shipped (the
    manifest unchanged): an 8-byte little-endian length of the safetensors bytes, then their zstd frame."""
    import pyarrow as pa

    plain = folder / "map.safetensors"
    data = plain.read_bytes()
    packed = pa.Codec("zstd", compression_level=19).compress(data, asbytes=True)
    plain.with_name(plain.name + COMPRESSED_SUFFIX).write_bytes(len(data).to_bytes(8, "little") + packed)
    plain.unlink()


def greedy_states(adapter) -> np.ndarray:
    """Decoder states along greedy paths (full softmax) of a few sentences."""
    batch = adapter.encode_texts(synthetic_sentences("en", 6, seed=4), "en", "it")
    rows: list[np.ndarray] = []
    greedy_search(
        adapter,
        make_projection(adapter, "full"),
        batch,
        "en",
        "it",
        max_len=8,
        step_hook=lambda rec: rows.append(rec.hidden.float().numpy()),
    )
    return np.concatenate(rows).astype(np.float64)


def _close(a: np.ndarray, b: np.ndarray) -> None:
    """Equal within float16's rounding (relative, and absolute where float16 is subnormal)."""
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    np.testing.assert_allclose(a, b, rtol=HALF, atol=6e-8)


def _close_int8(a: np.ndarray, b: np.ndarray) -> None:
    """Equal within half an int8 step of each row's largest magnitude (rows along the first axis)."""
    assert a.dtype == b.dtype == np.float32 and a.shape == b.shape
    step = np.abs(b).reshape(len(b), -1).max(axis=1) / 127
    err = np.abs(a - b).reshape(len(b), -1).max(axis=1)
    assert (err <= step / 2 * (1 + 1e-5) + 1e-12).all()


def test_a_compact_map_loads_to_the_plain_maps_arrays(tmp_path, cmap):
    save_cluster_map(cmap, tmp_path / "plain")
    save_cluster_map(cmap, tmp_path / "compact", compact=True)
    plain, compact = load_cluster_map(tmp_path / "plain"), load_cluster_map(tmp_path / "compact")
    assert (tmp_path / "compact" / "map.safetensors.zst").exists()
    assert not (tmp_path / "compact" / "map.safetensors").exists()
    for name in ("indptr", "indices"):
        a, b = getattr(plain, name), getattr(compact, name)
        assert a.dtype == b.dtype and np.array_equal(a, b), name
    assert np.array_equal(compact.population(), plain.population())
    assert not np.array_equal(compact.centroids, plain.centroids)  # int8 rows are what it stores
    _close_int8(compact.centroids, plain.centroids)
    # the norms the assignment reads are those of the centroids it reads
    assert np.array_equal(
        compact.centroid_sq_norms, np.einsum("rd,rd->r", compact.centroids, compact.centroids)
    )
    assert plain.normaliser is not None and compact.normaliser is not None
    for name in ("lse", "basis", "resid"):  # kept float32
        assert np.array_equal(getattr(compact.normaliser, name), getattr(plain.normaliser, name)), name
    for name in ("grad", "curv"):
        _close_int8(getattr(compact.normaliser, name), getattr(plain.normaliser, name))
    assert np.array_equal(compact.normaliser.curv, compact.normaliser.curv.transpose(0, 2, 1))
    m = json.loads((tmp_path / "compact" / MANIFEST_FILE).read_text())
    assert m["schema_version"] == 7 and m["encoding"]["plain_digest"] == plain.manifest.tensors_digest
    assert m["encoding"]["tensors"]["indices"]["stored"] == "uint16"


def test_a_compact_shortlist_loads_to_the_plain_tables_arrays(tmp_path, index):
    save_method_index(index, tmp_path / "plain")
    save_method_index(index, tmp_path / "compact", compact=True)
    plain = load_method_index(tmp_path / "plain", "shortlist").tensors
    compact = load_method_index(tmp_path / "compact", "shortlist").tensors
    assert set(compact) == set(plain)
    for name, a in plain.items():
        if name == "probs":
            _close(compact[name], a)
        else:  # ids exactly, each row in its order (most probable first)
            assert compact[name].dtype == a.dtype and np.array_equal(compact[name], a), name
    assert (tmp_path / "compact" / "index.safetensors.zst").exists()


def test_compact_map_and_table_decode_what_the_plain_ones_decode(tmp_path, adapter, cmap, index):
    save_cluster_map(cmap, tmp_path / "maps" / "en-it")
    save_method_index(index, tmp_path / "shortlist" / "en-it")
    save_cluster_map(cmap, tmp_path / "cmaps" / "en-it", compact=True)
    save_method_index(index, tmp_path / "cshortlist" / "en-it", compact=True)
    batch = adapter.encode_texts(synthetic_sentences("en", 8, seed=21), "en", "it")
    got = {}
    for form, maps, table in (("plain", "maps", "shortlist"), ("compact", "cmaps", "cshortlist")):
        proj = make_projection(
            adapter,
            "clustered",
            cluster_map=load_cluster_map(tmp_path / maps / "en-it"),
            shortlist=str(tmp_path / table / "en-it"),
            inactive_mass="normaliser",
        )
        assert proj.normaliser_source == "map"
        settings = SearchSettings(beam=3, max_len=10, early_stopping=False)
        got[form] = (
            greedy_search(adapter, proj, batch, "en", "it", max_len=10),
            beam_search(adapter, proj, batch, "en", "it", settings),
        )
    assert got["compact"] == got["plain"] and any(got["plain"][0])


def test_old_folders_still_load(tmp_path, cmap, index):
    """A version-5 map (plain, or compressed as maps were shipped) and a version-1 table."""
    save_cluster_map(cmap, tmp_path / "m")
    save_method_index(index, tmp_path / "t")
    for folder, version in ((tmp_path / "m", 5), (tmp_path / "t", 1)):
        path = folder / MANIFEST_FILE
        data = json.loads(path.read_text())
        del data["encoding"]
        path.write_text(json.dumps({**data, "schema_version": version}))
    old = load_cluster_map(tmp_path / "m")
    assert old.manifest.schema_version == 5 and np.array_equal(old.indices, cmap.indices)
    assert np.array_equal(old.counts, cmap.counts) and old.pruned(2).indices.size < old.indices.size
    compress_map_file(tmp_path / "m")
    assert np.array_equal(load_cluster_map(tmp_path / "m").centroids, cmap.centroids)
    t = load_method_index(tmp_path / "t", "shortlist")
    assert t.manifest.schema_version == 1 and np.array_equal(t.tensors["indices"], index.tensors["indices"])


def test_a_corrupt_compact_file_is_a_one_line_error_naming_it(tmp_path, cmap, index):
    save_cluster_map(cmap, tmp_path / "m", compact=True)
    save_method_index(index, tmp_path / "t", compact=True)
    for folder, name, load in (
        (tmp_path / "m", "map.safetensors.zst", load_cluster_map),
        (tmp_path / "t", "index.safetensors.zst", lambda f: load_method_index(f, "shortlist")),
    ):
        path = folder / name
        good = path.read_bytes()
        path.write_bytes(good[:-40] + bytes(40))
        with pytest.raises(ArtifactError) as exc:
            load(folder)
        assert str(folder) in str(exc.value) and "\n" not in str(exc.value)
        path.write_bytes(good)
        load(folder)
    # an encoding that does not fit its tensors (a hand-edited manifest) is refused as well
    path = tmp_path / "m" / MANIFEST_FILE
    data = json.loads(path.read_text())
    data["encoding"]["tensors"]["indices"]["shape"] = [3]
    path.write_text(json.dumps(data))
    with pytest.raises(ArtifactError, match="do not decode") as exc:
        load_cluster_map(tmp_path / "m")
    assert "\n" not in str(exc.value)


def test_a_compact_map_refuses_min_count_pruning(tmp_path, cmap):
    save_cluster_map(cmap, tmp_path / "m", compact=True)
    compact = load_cluster_map(tmp_path / "m")
    assert compact.pruned(1) is compact
    with pytest.raises(ArtifactError, match="min_count 2 pruning") as exc:
        compact.pruned(2)
    assert "\n" not in str(exc.value)
    with pytest.raises(ArtifactError, match="save it compact"):
        save_cluster_map(compact, tmp_path / "plain")
    # re-encoding keeps what it was encoded from
    save_cluster_map(compact, tmp_path / "again", compact=True)
    again = load_cluster_map(tmp_path / "again")
    assert again.manifest.encoding["plain_digest"] == compact.manifest.encoding["plain_digest"]
    assert np.array_equal(again.centroids, compact.centroids) and np.array_equal(again.counts, compact.counts)
    assert compact.normaliser is not None and again.normaliser is not None
    for name in ("grad", "curv"):  # int8 rows decoded and encoded again are the same int8 rows
        assert np.array_equal(getattr(again.normaliser, name), getattr(compact.normaliser, name)), name


def test_int8_rows_keep_each_rows_scale_and_leave_what_int8_cannot_hold():
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((5, 7)) * np.array([1e-3, 1, 10, 0, 5])[:, None]).astype(np.float32)
    stored, entry = encode_tensor(a, int8=True)
    assert entry["stored"] == "int8" and stored.nbytes == 5 * 4 + a.size  # a scale a row, a byte a value
    got = decode_tensor(stored, entry)
    assert got.dtype == np.float32 and got.shape == a.shape
    step = np.abs(a).max(axis=1) / 127
    assert (np.abs(got - a).max(axis=1) <= step / 2 * (1 + 1e-5)).all()  # each row at its own scale
    assert not got[3].any()  # a row of zeros stays zeros
    again, _ = encode_tensor(got, int8=True)
    assert np.array_equal(decode_tensor(again, entry), got)
    # a tensor with a non-finite value is kept as it is
    bad = a.copy()
    bad[1, 2] = np.inf
    stored, entry = encode_tensor(bad, int8=True)
    assert entry["stored"] == "float32" and np.array_equal(decode_tensor(stored, entry), bad)


def test_uint16_only_when_the_ids_fit(tmp_path):
    assert int_dtype(65_536) == np.uint16 and int_dtype(65_537) == np.int32
    n = 70_000
    ids = [[3, 65_535, 65_536, 69_999], [0, 1]]
    cmap = map_from_sets(np.eye(2, 4), ids, n, "fp")
    save_cluster_map(cmap, tmp_path / "m", compact=True)
    entry = json.loads((tmp_path / "m" / MANIFEST_FILE).read_text())["encoding"]["tensors"]["indices"]
    assert entry["stored"] == "int32"
    assert load_cluster_map(tmp_path / "m").indices.tolist() == [3, 65_535, 65_536, 69_999, 0, 1]
    # ids of a vocabulary that does not fit uint16 are refused, never wrapped
    with pytest.raises(ValueError, match="do not fit"):
        encode_tensor(np.array([1, 70_000], np.int32), int_bound=65_536)
    stored, entry = encode_tensor(
        np.array([5, 9, 2, 4], np.int32), int_bound=10, delta="r", rows=np.array([0, 2, 4])
    )
    assert decode_tensor(stored, entry, np.array([0, 2, 4])).tolist() == [5, 9, 2, 4]


def test_compact_published_rewrites_a_plain_folder_in_place(tmp_path, cmap, index):
    root = tmp_path / "shipped"
    save_cluster_map(cmap, root / "en-it")
    compress_map_file(root / "en-it")
    save_method_index(index, root / "shortlist" / "en-it")
    (root / BUILD_FILE).write_text(json.dumps({"maps": {"en-it": {"tensors_digest": "old"}}}))
    before = json.loads((root / "en-it" / MANIFEST_FILE).read_text())
    assert sorted(p.relative_to(root).as_posix() for p in compact_published(root)) == [
        "en-it",
        "shortlist/en-it",
    ]
    after = json.loads((root / "en-it" / MANIFEST_FILE).read_text())
    changed = {k for k in after if after[k] != before.get(k)}
    assert (
        changed - {"schema_version"} == {"encoding", "tensors_digest"}
        and after["schema_version"] == MAP_SCHEMA_VERSION
    )
    assert (
        json.loads((root / BUILD_FILE).read_text())["maps"]["en-it"]["tensors_digest"]
        == after["tensors_digest"]
    )
    assert load_method_index(root / "shortlist" / "en-it", "shortlist").manifest.encoding
    assert compact_published(root) == []
