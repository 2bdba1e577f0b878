"""Output-layer methods ("projections"): full, clustered, and the other vocabulary-selection methods.

Never imports Ray or MLflow. GPU-only code (CuPy) is imported lazily inside the methods that use it.
"""

from fastvocab.kernels.base import (
    Projection,
    ProjectionOutput,
    available_projections,
    create_projection,
    register,
)
from fastvocab.kernels.full import FullProjection

__all__ = [
    "FullProjection",
    "Projection",
    "ProjectionOutput",
    "available_projections",
    "create_projection",
    "register",
]
