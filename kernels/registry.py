"""The output-layer methods by name: importing this module imports every built-in method's module, whose
``@register(name, options)`` puts its projection and the dataclass of its options in the one registry
(``kernels.base``). What the command line, the pipeline and the Translator ask of a method by its name
goes through here: which methods there are, their options' dataclasses, and the projection built from an
options object (:func:`build_projection`, the one place the object becomes the projection's keywords).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastvocab.kernels import clustered, full, graph, lsh, shortlist  # noqa: F401  (their @register)
from fastvocab.kernels.base import _REGISTRY, Projection
from fastvocab.kernels.options import MethodOptions


def available_projections() -> list[str]:
    return sorted(_REGISTRY)


def _projection_class(name: str) -> type[Projection]:
    if name not in _REGISTRY:
        raise ValueError(f"unknown output-layer method {name!r}; valid: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]


def options_types() -> dict[str, type[MethodOptions]]:
    """Every method's options dataclass, by method name, in name order."""
    return {name: _REGISTRY[name].options_type for name in sorted(_REGISTRY)}


def create_projection(
    name: str,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    always_active: Sequence[int] = (),
    fingerprint: str | None = None,
    **options: object,
) -> Projection:
    """Build the projection registered as ``name`` from its keyword options; unknown names and options raise
    ``ValueError``.

    ``fingerprint``: the model's fingerprint when the caller knows it (an adapter does), so the projection
    does not hash ``W`` and ``b`` again.
    """
    cls = _projection_class(name)
    try:
        return cls(weight, bias, always_active=always_active, fingerprint=fingerprint, **options)
    except TypeError as exc:  # unexpected keyword: say which method rejected it
        raise ValueError(f"bad options for method {name!r}: {exc}") from exc


def build_projection(
    options: MethodOptions,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    *,
    beam: int = 1,
    int8: bool = False,
    always_active: Sequence[int] = (),
    fingerprint: str | None = None,
) -> Projection:
    """The projection a user chose (``options``) for a search at ``beam``; ``int8``: the model decodes in
    int8 (the full and clustered projections then compute their logits in int8 too)."""
    if not isinstance(options, _projection_class(options.method).options_type):
        raise ValueError(f"{type(options).__name__} are not the options of method {options.method!r}")
    return create_projection(
        options.method,
        weight,
        bias,
        always_active=always_active,
        fingerprint=fingerprint,
        **options.projection_kwargs(beam, int8),
    )
