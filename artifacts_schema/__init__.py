"""On-disk formats shared by every stage: schemas, manifests, fingerprints and validation.

Imports only pyarrow, numpy and the standard library, so it loads anywhere (Ray workers, GPU boxes).
"""

from fastvocab.artifacts_schema.errors import ArtifactError

__all__ = ["ArtifactError"]
