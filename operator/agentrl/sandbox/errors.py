"""Sandbox exceptions, grouped by what the caller does next.

Callers: the providers raise them; :mod:`agentrl.rollout.episode` maps every one of them to the
``infra_error`` terminal class (retried within the failure policy's budget, never a reward).

::

    SandboxError                    the sandbox infrastructure failed: retry the episode
     ├─ SandboxCreateError          could not create or start a sandbox (quota, image, API)
     │   └─ SandboxRateLimited      the provider refused for rate or quota (HTTP 429): back off
     ├─ SandboxExecError            a command could not be run at all (not: it exited non-zero)
     ├─ SandboxFileError            a file could not be written or read
     └─ SandboxGone                 the sandbox disappeared under a running episode

A command that runs and exits non-zero, or runs past its own timeout, is a *result*
(:class:`agentrl.sandbox.provider.ExecResult`), not an exception: the agent sees it.
"""

from __future__ import annotations


class SandboxError(Exception):
    """The sandbox infrastructure failed; the episode is an infra error and may be retried."""

    def __init__(self, message: str, *, provider: str = "") -> None:
        super().__init__(message)
        self.provider = provider
        """Provider name, for metrics and logs."""


class SandboxCreateError(SandboxError):
    """A sandbox could not be created or did not become ready in time."""


class SandboxRateLimited(SandboxCreateError):
    """The provider refused a creation for rate or quota reasons; retry after ``retry_after``."""

    def __init__(self, message: str, *, provider: str = "", retry_after: float | None = None):
        super().__init__(message, provider=provider)
        self.retry_after = retry_after
        """Seconds the provider asked us to wait, when it said."""


class SandboxExecError(SandboxError):
    """A command could not be started or its result could not be read back."""


class SandboxFileError(SandboxError):
    """A file could not be written into or read out of the sandbox."""


class SandboxGone(SandboxError):
    """The sandbox was deleted or lost while an episode still used it."""
