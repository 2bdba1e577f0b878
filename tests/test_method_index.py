import json

import numpy as np
import pytest

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.artifacts_schema.method_index import (
    ANY_DIRECTION,
    MANIFEST_FILE,
    TENSORS_FILE,
    load_method_index,
    new_index,
    save_method_index,
)


def _index(direction="en-it", method="shortlist"):
    return new_index(
        method,
        model_fingerprint="fp1",
        direction=direction,
        n_vocab=10,
        d=4,
        params={"k": 3},
        tensors={"ids": np.arange(6, dtype=np.int32).reshape(2, 3), "codes": np.ones(5, np.uint8)},
        build_seconds=1.5,
    )


def test_round_trip_keeps_arrays_and_manifest(tmp_path):
    save_method_index(_index(), tmp_path / "idx")
    got = load_method_index(tmp_path / "idx", "shortlist", expect_fingerprint="fp1", direction="en-it")
    assert got.manifest.params == {"k": 3} and got.manifest.direction == "en-it"
    assert got.manifest.tensors_digest.startswith("sha256:")
    np.testing.assert_array_equal(got.tensors["ids"], np.arange(6).reshape(2, 3))
    assert got.nbytes == 6 * 4 + 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"expect_fingerprint": "other"}, "built for model fp1"),
        ({"direction": "it-en"}, "built for en-it, not for it-en"),
        ({"required": ("ids", "table")}, "lacks array(s) table"),
    ],
)
def test_refuses_another_model_direction_or_missing_array(tmp_path, kwargs, message):
    save_method_index(_index(), tmp_path / "idx")
    with pytest.raises(ArtifactError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_method_index(tmp_path / "idx", "shortlist", **kwargs)


def test_refuses_another_method(tmp_path):
    save_method_index(_index(), tmp_path / "idx")
    with pytest.raises(ArtifactError, match="is a 'shortlist' index, not a 'lsh' index"):
        load_method_index(tmp_path / "idx", "lsh")


def test_a_model_wide_index_serves_every_direction(tmp_path):
    save_method_index(_index(direction=ANY_DIRECTION, method="lsh"), tmp_path / "idx")
    assert load_method_index(tmp_path / "idx", "lsh", direction="it-en").manifest.direction == "*"


def test_flipped_bytes_and_other_versions_are_refused(tmp_path):
    save_method_index(_index(), tmp_path / "idx")
    path = tmp_path / "idx" / TENSORS_FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="does not match the digest in its manifest"):
        load_method_index(tmp_path / "idx", "shortlist")
    manifest = tmp_path / "idx" / MANIFEST_FILE
    record = json.loads(manifest.read_text())
    record["schema_version"] = 99
    manifest.write_text(json.dumps(record))
    with pytest.raises(ArtifactError, match="schema version 99"):
        load_method_index(tmp_path / "idx", "shortlist")


def test_missing_folder_names_it(tmp_path):
    with pytest.raises(ArtifactError, match=f"no method index at {tmp_path / 'nope'}"):
        load_method_index(tmp_path / "nope", "lsh")
