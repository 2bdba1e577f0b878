"""The clustered projection's options as its four parts (kernels/clustered_parts.py): each part refuses its
own bad values and combinations without a projection, the flat option names the registry passes make the
same parts, and the projection holds them."""

from __future__ import annotations

import pytest

from fastvocab.kernels import create_projection
from fastvocab.kernels.clustered_parts import (
    Certificate,
    ClusteredParts,
    Compute,
    MassEstimate,
    Selection,
)
from tests.layers import random_layer, random_map


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: Selection(selection="rows"), "selection must be one of union, per-row"),
        (lambda: Selection(min_count=True), "min_count must be an integer >= 1"),
        (lambda: Selection(selection="per-row", probes=2), "probes > 1 needs union selection"),
        (lambda: Compute(backend="tpu"), "backend must be one of auto, torch, cupy"),
        (lambda: Compute(int8=True, backend="cupy"), "int8 clustered projection needs the torch backend"),
        (lambda: Compute(cache_mb=-1), "cache_mb must be >= 0"),
        (lambda: MassEstimate(inactive_mass="guess"), "inactive_mass must be one of none, centroid"),
        (lambda: MassEstimate(mass_radius=1.0), "mass_radius needs an inactive_mass estimate"),
        (lambda: MassEstimate("moments", mass_radius=0), "mass_radius must be > 0"),
        (lambda: Certificate(exact_k=-1), "exact_k must be an integer >= 0"),
        (lambda: Certificate(bound_blocks=1.5), "bound_blocks must be an integer >= 0"),
        (lambda: Certificate(exact_tol=-1), "exact_tol must be >= 0"),
        (
            lambda: ClusteredParts(mass=MassEstimate("moments", 1.0), certificate=Certificate(exact_k=1)),
            "mass_radius needs an inactive_mass estimate and no exact_k",
        ),
    ],
)
def test_each_part_refuses_its_bad_values(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_flat_options_make_the_parts_and_leave_the_others():
    options = {"selection": "per-row", "exact_k": 2, "int8": 1, "mass_radius": None, "always_active": [0]}
    parts = ClusteredParts.pop(options)
    assert options == {"always_active": [0]}
    assert parts == ClusteredParts(
        selection=Selection(selection="per-row"),
        compute=Compute(int8=True),
        certificate=Certificate(exact_k=2),
    )
    assert parts.compute.int8 is True and isinstance(parts.certificate.exact_tol, float)
    assert ClusteredParts.pop({}) == ClusteredParts()


def test_projection_holds_its_parts():
    w, b = random_layer()
    proj = create_projection(
        "clustered", w, b, cluster_map=random_map(w, b), inactive_mass="moments", mass_radius=2, probes=3
    )
    assert proj.parts.mass == MassEstimate("moments", 2.0) and proj.parts.selection.probes == 3
    assert (proj.inactive_mass, proj.mass_radius, proj.probes) == ("moments", 2.0, 3)
