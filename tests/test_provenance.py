"""The commit recorded with MLflow runs and benchmark results (``artifacts_schema/provenance.py``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fastvocab.artifacts_schema.provenance import git_commit

GIT_ENV = {
    **os.environ,
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
}


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, env=GIT_ENV, capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_full_and_short_hash_and_the_dirty_mark_of_the_paths_asked(tmp_path):
    repo = tmp_path / "repo"
    (repo / "a").mkdir(parents=True)
    (repo / "b").mkdir()
    (repo / "a" / "f.txt").write_text("1\n")
    (repo / "b" / "f.txt").write_text("1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "first")
    head = _git(repo, "rev-parse", "HEAD")

    assert git_commit(cwd=repo) == head
    assert git_commit(cwd=repo, digits=12) == head[:12]
    (repo / "a" / "f.txt").write_text("2\n")
    assert git_commit(cwd=repo) == head + "+dirty"
    assert git_commit("a", cwd=repo) == head + "+dirty"
    assert git_commit("b", cwd=repo) == head  # only the paths asked count
    assert git_commit(cwd=repo, digits=12, mark_dirty=False) == head[:12]
    (repo / "c.txt").write_text("untracked\n")
    assert git_commit("b", cwd=repo) == head  # untracked files never count


def test_outside_a_checkout_the_commit_is_unknown(tmp_path):
    assert git_commit(cwd=tmp_path) == "unknown"
