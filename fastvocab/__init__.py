"""fastvocab: clustered vocabulary projection for fast multilingual MT decoding.

The rooms install as subpackages: ``fastvocab.artifacts_schema``, ``fastvocab.kernels``,
``fastvocab.decoding``, ``fastvocab.tasks`` and ``fastvocab.pipeline`` (see DESIGN.md).
"""

__version__ = "0.1.0"
