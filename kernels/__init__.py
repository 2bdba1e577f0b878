"""Output-layer methods ("projections"): full, clustered, and the other vocabulary-selection methods.

Never imports Ray or MLflow. GPU-only code (CuPy) is imported lazily inside the methods that use it. The
package itself imports nothing: its names below load their modules (and torch) when first read, so that a
method's options (``kernels/options.py``, ``kernels/clustered_parts.py``) are read without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastvocab.kernels.base import Projection, ProjectionOutput, register
    from fastvocab.kernels.full import FullProjection
    from fastvocab.kernels.registry import available_projections, create_projection

__all__ = [
    "FullProjection",
    "Projection",
    "ProjectionOutput",
    "available_projections",
    "create_projection",
    "register",
]


def __getattr__(name: str) -> Any:
    if name in ("Projection", "ProjectionOutput", "register"):
        from fastvocab.kernels import base

        return getattr(base, name)
    if name == "FullProjection":
        from fastvocab.kernels import full

        return full.FullProjection
    if name in ("available_projections", "create_projection"):
        from fastvocab.kernels import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
