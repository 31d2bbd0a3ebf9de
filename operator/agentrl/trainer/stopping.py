"""A clean stop of the trainer: a termination signal becomes "finish this step, checkpoint, exit".

Kubernetes stops a trainer pod with SIGTERM, then SIGKILL once the pod's
``terminationGracePeriodSeconds`` (``spec.trainer.checkpoint.stopGracePeriodSeconds``) has run
out: when the job is suspended (the operator suspends the trainer Job), when its node is drained
and when the pod is deleted. Each of them gets the same treatment here:

* the driver (rank 0) turns the signal into a :class:`StopRequest`; the training loop
  (:class:`agentrl.trainer.loop.TrainingDriver`) finishes the step it is in (an update that has
  started is never cut), or abandons the wait for trajectories when it is between steps, writes a
  checkpoint of the last finished step and returns. The checkpoint's data position lists every
  task still in flight as pending: a resumed run starts those episodes again, so an unscored
  episode is never counted as a reward nor trained on;
* the other ranks and the Ray nodes of the other pods ignore the signal (:func:`ignore_stop`):
  they keep serving the driver's last collective until it releases them, and the grace period
  bounds how long that is;
* the process exits :data:`STOPPED_EXIT_CODE` (128 + SIGTERM), not 0, so that a deleted pod of
  the Indexed Job never counts as a completed index; a drained node's pod carries the
  DisruptionTarget condition, which the Job's podFailurePolicy ignores.

Callers: :mod:`agentrl.trainer.pod` (the driver and the rank processes),
:mod:`agentrl.trainer.loop` and :mod:`agentrl.trainer.assembly` (:class:`StopRequest`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Iterator

log = logging.getLogger(__name__)

#: The signals that ask for a clean stop.
STOP_SIGNALS = (signal.SIGTERM,)
#: What a trainer stopped by a signal exits with (the shell's 128 + 15 for SIGTERM).
STOPPED_EXIT_CODE = 128 + signal.SIGTERM


class StopRequest:
    """Set once a stop was asked for; the training loop waits on it beside its trajectories.

    Belongs to one event loop: :meth:`request` is called on that loop's thread (a signal handler
    installed by :func:`on_stop_signals`), :meth:`request_threadsafe` from any other thread (a
    Ray call)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._early: str | None = None
        self.reason: str | None = None
        """What asked for the stop (``SIGTERM``, ...); None while none has."""

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, reason: str) -> None:
        if not self.requested:
            log.warning("stop requested (%s): finishing the step and writing a checkpoint", reason)
            self.reason = reason
        self._event.set()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop :meth:`request_threadsafe` hands the request to; a request that came
        before (the driver was still starting) takes effect now."""
        self._loop = loop
        if self._early is not None:
            loop.call_soon_threadsafe(self.request, self._early)

    def request_threadsafe(self, reason: str) -> None:
        if self._loop is None:
            self._early = reason
        else:
            self._loop.call_soon_threadsafe(self.request, reason)

    async def wait(self) -> None:
        await self._event.wait()


@contextlib.contextmanager
def on_stop_signals(stop: StopRequest) -> Iterator[bool]:
    """Within the block, a stop signal sets ``stop`` instead of ending the process. Yields
    whether the handlers are installed: they can be only on the main thread (elsewhere, e.g. in
    a Ray actor, the process that receives the signal forwards it with
    :meth:`StopRequest.request_threadsafe`)."""
    loop = asyncio.get_running_loop()
    stop.bind(loop)
    installed = []
    try:
        for sig in STOP_SIGNALS:
            try:
                loop.add_signal_handler(sig, stop.request, sig.name)
            except (RuntimeError, ValueError):  # not the main thread
                break
            installed.append(sig)
        yield bool(installed)
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)


def ignore_stop() -> None:
    """The stop signals do nothing to this process from now on (a rank that only follows the
    driver, a Ray node of another pod): it ends when the driver releases it, or with SIGKILL.
    A handler that does nothing rather than SIG_IGN, which the processes it starts (Ray's)
    would inherit. Only the main thread can set handlers: called on another thread (a process
    that runs a node in a thread beside others, as the tests do) it leaves them as they are."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, _ignored)


def _ignored(signum: int, frame: object) -> None:
    log.info("signal %d ignored: this process serves the driver until it has checkpointed", signum)
