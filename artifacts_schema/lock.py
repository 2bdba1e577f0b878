"""The work-directory lock: one ``fastvocab run`` per work dir at a time.

``<work_dir>/.fastvocab.lock`` is a small JSON file with the owner's pid, host, start time and command (and,
once known, its MLflow run). It is created atomically with its content (written under a temporary name, then
hard-linked onto the lock's name, which fails if the lock exists), so a reader never sees a half-written lock.
A second run on the same work dir fails at once with a one-line error naming the owner. A lock left by a
process that no longer exists on this host (SIGKILL, a crash, a reboot) is stale: it is taken over, and the
caller is told whose it was (so it can, e.g., close that run's MLflow run). A lock from another host cannot be
checked from here and is never taken over: the message says how to remove it.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fastvocab.artifacts_schema.errors import ArtifactError

LOCK_FILE = ".fastvocab.lock"


class WorkDirBusy(ArtifactError):
    """The work dir is locked by a live process (or one on another host)."""


@dataclass
class LockInfo:
    pid: int
    host: str
    started: str
    command: str
    proc_start: str = ""  # the process's start time (Linux /proc): tells a reused pid from the owner
    extra: dict[str, str] = field(default_factory=dict)  # e.g. the MLflow run id, set after the lock

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} since {self.started} ({self.command})"


def _proc_start(pid: int) -> str:
    """Start time of a process in clock ticks since boot ("" where /proc is not available)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rpartition(")")[2].split()[19]  # field 22; the command name before ")" may hold spaces


def _owner_alive(owner: LockInfo) -> bool:
    if owner.pid == os.getpid():
        return False  # our own pid, but we do not hold the lock: a previous life of this pid (a container)
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    # a pid reused by another process after the owner died is not the owner
    return not (owner.proc_start and _proc_start(owner.pid) not in ("", owner.proc_start))


class WorkDirLock:
    """``with WorkDirLock(work_dir):`` holds the lock; ``.stale`` is the owner it took over, if any."""

    def __init__(self, work_dir: str | Path, command: str | None = None) -> None:
        self.path = Path(work_dir) / LOCK_FILE
        self.info = LockInfo(
            pid=os.getpid(),
            host=socket.gethostname(),
            started=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            command=command or " ".join(["fastvocab", *sys.argv[1:]])[:300],
            proc_start=_proc_start(os.getpid()),
        )
        self.stale: LockInfo | None = None
        self.held = False

    def acquire(self) -> LockInfo | None:
        """Take the lock; returns the stale owner that was replaced (None if the lock was free)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(3):  # a lost race with another process taking over the same stale lock: look again
            if self._create():
                self.held = True
                return self.stale
            owner = read_lock(self.path)
            if owner is None:  # removed between our attempt and our read
                continue
            if owner.host != self.info.host or _owner_alive(owner):
                raise WorkDirBusy(
                    f"work dir {self.path.parent} is in use by fastvocab {owner.describe()}; wait for it, or "
                    f"remove {self.path} if that run is gone"
                )
            self.stale = owner
            # unlink only the stale file we read: another process may have replaced it meanwhile
            if read_lock(self.path) == owner:
                self.path.unlink(missing_ok=True)
        raise WorkDirBusy(f"work dir {self.path.parent}: could not take the lock {self.path}")

    def update(self, **extra: str) -> None:
        """Record more about the owner (the MLflow run) in the held lock."""
        if not self.held:
            return
        self.info.extra.update(extra)
        fd, tmp = tempfile.mkstemp(prefix=f"{LOCK_FILE}.", dir=self.path.parent)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(self.info), fh)
        os.replace(tmp, self.path)

    def release(self) -> None:
        """Remove the lock if it is still ours."""
        if self.held:
            owner = read_lock(self.path)
            if owner is not None and (owner.pid, owner.host) == (self.info.pid, self.info.host):
                self.path.unlink(missing_ok=True)
            self.held = False

    def _create(self) -> bool:
        fd, tmp = tempfile.mkstemp(prefix=f"{LOCK_FILE}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w") as fh:
                json.dump(asdict(self.info), fh)
            os.link(tmp, self.path)  # atomic, and fails when the lock exists
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)

    def __enter__(self) -> WorkDirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def read_lock(path: str | Path) -> LockInfo | None:
    """The lock's owner; None when there is no lock. An unreadable lock file is an ArtifactError naming it."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
        return LockInfo(**data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as exc:
        raise ArtifactError(
            f"unreadable work-dir lock {path} ({exc}); remove it if no run is using the work dir"
        ) from exc
