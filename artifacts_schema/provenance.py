"""The code a run or a result came from: the git commit recorded in MLflow tags and benchmark results."""

from __future__ import annotations

import subprocess
from pathlib import Path


def git_commit(
    *paths: str, cwd: Path | None = None, digits: int | None = None, mark_dirty: bool = True
) -> str:
    """HEAD's hash in the checkout at ``cwd`` (default: the current directory), or ``unknown`` outside one.

    ``digits``: that many hex digits (git adds more where they would be ambiguous); default the full hash.
    ``mark_dirty``: ``+dirty`` appended when tracked files under ``paths`` (default: all) are changed.
    """
    head = ["git", "rev-parse", *([f"--short={digits}"] if digits else []), "HEAD"]
    status = ["git", "status", "--porcelain", "--untracked-files=no", "--", *paths]
    try:
        commit = _git(head, cwd)
        dirty = mark_dirty and bool(_git(status, cwd))
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def _git(command: list[str], cwd: Path | None) -> str:
    # the timeout: a git stuck on a lock or a slow network file system must not hold up a run's start
    out = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=True, timeout=5)
    return out.stdout.strip()
