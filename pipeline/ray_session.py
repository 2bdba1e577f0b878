"""Ray for the pipeline: start or attach once, host workers in actor pools, run one-off tasks.

Workers that hold a model (``tasks.workers``) run as Ray actors in a ``ray.util.ActorPool``: the model is
loaded once per actor, Ray schedules work items as actors free up (backpressure), restarts a dead actor and
retries its item (:data:`RETRIES`), and the driver shows progress as results come back. k-means and map
building hold no model and run as plain Ray tasks. Ray starts only when a stage has work, so a fully resumed
run never pays for ``ray.init``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fastvocab.artifacts_schema.errors import ArtifactError
from fastvocab.pipeline.errors import Interrupted, UserError
from fastvocab.pipeline.extras import needed


@dataclass(frozen=True)
class RetryPolicy:
    """How often work is tried again after the actor process running it died.

    Only a death is retried (the OOM killer, a lost or preempted node): it says nothing about the item, and
    the item usually succeeds on a fresh process. An error raised by the work itself is not: the same input
    would fail the same way. Retries are few because an item that kills every process it runs on (one that
    always runs out of memory) must fail the run rather than loop, and a failed run loses nothing: what was
    done is on disk and the next run resumes from it.
    """

    # map_actors (the stages' ActorPools): Ray restarts a dead actor this many times over its life
    # (max_restarts) and runs the item it held again each time (max_task_retries). The budget is per actor,
    # so a stage survives as many deaths as it has actors, one each.
    actor_restarts: int
    # pull_actors (bulk translation): the driver replaces a dead actor with a new one itself and puts the
    # item back in the queue, this many times per item. The budget is per item, so a long job survives any
    # number of deaths spread over its ranges, and only a range that kills three processes ends it.
    item_retries: int


RETRIES = RetryPolicy(actor_restarts=1, item_retries=2)

# The address that starts a private local Ray (with ``num_cpus`` CPUs) instead of attaching to one.
LOCAL = "local"

# Below this many input lines a bulk job asked for several workers on a local Ray (no address named) is
# decoded in the driver's process instead. Starting a local Ray and its actors (each loading the model) costs
# 15-20 s before the first line; in 20 s one process decodes ~700 lines (~35 lines/s: the demo model, greedy,
# batch 32, 2 cores), so below that it is done before the actors would start. Measured on a 2-core machine:
# 300 lines took 25.3 s with --workers 2 on a local Ray and 8.0 s in one process, with the same output.
MIN_RAY_LINES = 700
# Errors that are the user's to fix re-raise as themselves on the driver (one line, no remote traceback).
USER_ERRORS = (ArtifactError, UserError, FileNotFoundError)


class RaySession:
    """Starts Ray on first use: locally limited to ``num_cpus``, or attached to a cluster by address.

    An already initialised Ray (a test's session, ``ray job submit``'s driver) is reused and left running.
    """

    def __init__(self, address: str | None, num_cpus: int | None, log_to_driver: bool = True) -> None:
        self.address = address
        self.num_cpus = num_cpus or os.cpu_count() or 1
        self.log_to_driver = log_to_driver
        self._started = False

    def ensure(self):
        with needed():
            import ray

        if not ray.is_initialized():
            try:
                if self.address == LOCAL:  # a private Ray on this machine, even under a cluster's env
                    ray.init(
                        address="local",
                        num_cpus=self.num_cpus,
                        include_dashboard=False,
                        log_to_driver=self.log_to_driver,
                    )
                elif self.address or os.environ.get("RAY_ADDRESS"):
                    # attaching to a cluster: its resources are its own (num_cpus may not be passed)
                    ray.init(address=self.address, log_to_driver=self.log_to_driver)
                else:
                    ray.init(
                        num_cpus=self.num_cpus, include_dashboard=False, log_to_driver=self.log_to_driver
                    )
            except SystemExit as exc:
                # SIGTERM while Ray starts: its own handler (installed first thing in ray.init) exits
                if exc.code == signal.SIGTERM:
                    self._started = ray.is_initialized()
                    raise Interrupted(signal.SIGTERM) from None
                raise
            self._started = True
            # ray.init replaced the SIGTERM handler with sys.exit (a native crash dump mid-call): ours back
            from fastvocab.pipeline.signals import reinstall

            reinstall()
        return ray

    def cpus(self) -> int:
        """CPUs Ray can schedule on (the local limit before Ray is started)."""
        ray = sys.modules.get("ray")  # not imported: not started in this process either (nor installed)
        if ray is not None and ray.is_initialized():
            return int(ray.cluster_resources().get("CPU", 1))
        return self.num_cpus

    def has_gpu(self) -> bool:
        return float(self.ensure().cluster_resources().get("GPU", 0)) > 0

    def require_gpus(self, amount: float, what: str) -> None:
        """A task asking for GPUs that the cluster does not have would wait forever: fail instead."""
        if amount <= 0:
            return
        have = float(self.ensure().cluster_resources().get("GPU", 0))
        if have < amount:
            raise UserError(f"{what} asks for {amount:g} GPU(s) per task, the Ray cluster has {have:g}")

    # ------------------------------------------------------------------------------------------ actors

    def map_actors(
        self,
        cls: type,
        args: tuple,
        method: str,
        items: Sequence[tuple],
        bar,
        *,
        size: int,
        num_cpus: float,
        num_gpus: float = 0,
        ordered: bool = False,
    ) -> list[Any]:
        """Call ``actor.<method>(*item)`` for every item on a pool of ``size`` actors ``cls(*args)``.

        Results come in the order they finish, or in the items' order with ``ordered=True``. The actors are
        released afterwards: an idle actor keeps its CPUs, which the next stage's tasks need.
        """
        ray = self.ensure()
        with needed():
            from ray.util import ActorPool

        restarts = RETRIES.actor_restarts
        remote = ray.remote(
            num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=restarts, max_task_retries=restarts
        )(cls)
        actors = [remote.remote(*args) for _ in range(max(1, min(size, len(items))))]
        pool = ActorPool(actors)
        submit = pool.map if ordered else pool.map_unordered
        results = []
        try:
            with _user_errors():
                for res in submit(lambda actor, item: getattr(actor, method).remote(*item), list(items)):
                    results.append(res)
                    bar.update(1)
        finally:
            for actor in actors:
                ray.kill(actor)
        return results

    def pull_actors(
        self,
        cls: type,
        args: tuple,
        method: str,
        items: Sequence[Any],
        on_result: Callable[[Any], None],
        *,
        size: int,
        num_cpus: float,
        num_gpus: float = 0,
        max_retries: int = RETRIES.item_retries,
    ) -> int:
        """Call ``actor.<method>(item)`` for every item on ``size`` actors ``cls(*args)`` that pull items from
        one queue: an actor gets its next item when it returns the last, so a slow actor (or node) takes
        fewer items and holds no one back. ``on_result`` gets each result as it comes.

        An actor that dies (killed, OOM, its node lost) is replaced by a new one and its item put first in
        the queue, up to ``max_retries`` times per item; an error raised by the work itself is not retried.
        Returns how many items were retried. The actors are released at the end.
        """
        import collections

        ray = self.ensure()
        remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0, max_task_retries=0)(cls)
        queue = collections.deque(range(len(items)))
        attempts: collections.Counter[int] = collections.Counter()
        actors = [remote.remote(*args) for _ in range(max(1, min(size, len(items))))]
        running: dict[Any, tuple[Any, int]] = {}
        retried = 0

        def submit(actor: Any) -> None:
            if queue:
                i = queue.popleft()
                running[getattr(actor, method).remote(items[i])] = (actor, i)

        try:
            with _user_errors():
                for actor in actors:
                    submit(actor)
                while running:
                    done, _ = ray.wait(list(running), num_returns=1)
                    actor, i = running.pop(done[0])
                    try:
                        result = ray.get(done[0])
                    except ray.exceptions.RayActorError:
                        attempts[i] += 1
                        if attempts[i] > max_retries:
                            raise
                        retried += 1
                        queue.appendleft(i)
                        ray.kill(actor)
                        actors.remove(actor)
                        actor = remote.remote(*args)
                        actors.append(actor)
                        submit(actor)
                        continue
                    on_result(result)
                    submit(actor)
        finally:
            for actor in actors:
                ray.kill(actor)
        return retried

    # ------------------------------------------------------------------------------------------ tasks

    def run_tasks(
        self,
        fn: Callable,
        calls: dict[str, tuple[tuple, dict[str, Any]]],
        bar,
        *,
        num_cpus: float = 1,
        num_gpus: float = 0,
    ) -> dict[str, Any]:
        """Run ``fn(*args, **kwargs)`` as one Ray task per named call; returns ``{name: result}``."""
        ray = self.ensure()
        task = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(fn)
        pending = {task.remote(*args, **kwargs): name for name, (args, kwargs) in calls.items()}
        out: dict[str, Any] = {}
        with _user_errors():
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    out[pending.pop(ref)] = ray.get(ref)
                    bar.update(1)
        return out

    def put(self, value: Any):
        return self.ensure().put(value)

    def shutdown(self) -> None:
        if self._started:
            with needed():
                import ray

            ray.shutdown()
            self._started = False


@contextlib.contextmanager
def _user_errors() -> Iterator[None]:
    """Re-raise our own errors from a Ray task or actor as themselves; anything else keeps Ray's report."""
    with needed():
        import ray

    try:
        yield
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        if isinstance(cause, USER_ERRORS):
            raise cause from None
        raise
    except SystemError:
        # our SIGTERM/SIGINT handler raised while Ray's Cython code was waiting: it surfaces as this
        from fastvocab.pipeline.signals import received

        signum = received()
        if signum is not None:
            raise Interrupted(signum) from None
        raise
