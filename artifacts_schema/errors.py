"""The one exception type for bad or mismatched artifacts (the CLI turns it into a one-line error)."""


class ArtifactError(ValueError):
    """An artifact is missing, corrupt, of another schema version, or built for another model."""
