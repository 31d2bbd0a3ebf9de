"""One episode, start to reward, ending in exactly one terminal class.

An attempt: create a sandbox (bounded by ``sandbox.startupTimeoutSeconds``) → write the task's
files and run its setup → the agent's turns under the episode's wall clock → the verifier →
close the sandbox (always).

Where the verifier runs depends on the task (:func:`grades_patch`). Tasks graded by their
own eval script (SWE-bench, SWE-smith: :class:`~agentrl.rollout.tasks.model.HarnessVerification`)
are graded as the SWE-bench harness grades a prediction: the agent's patch (what ``submit``
returned, else its changes against the commit the repository was at before the agent started,
captured while its sandbox is still leased) is applied in a *fresh* sandbox of the task, after
the agent's is released (:func:`~agentrl.rollout.verifier.grade_patch`); nothing the agent left
in its own sandbox besides the patch counts. The grade status goes on the trajectory and into
``agentrl_rollout_grades_total``; a patch that applies nowhere is reward 0 (``patch_failed``), a
grading sandbox that cannot start is an infra error like the agent's. Toy tasks (hidden tests
written just before they run) and Harbor tasks (the reward script inspects the environment) are
scored in the agent's own sandbox.

The class it ends in:

``completed``      the agent submitted; reward from the verifier.
``truncated``      a turn or token cap ended it; the tests still run (on the patch so far) and
                   give the reward.
``agent_timeout``  the wall clock ran out; the tests still run (reward kept for statistics),
                   the failure policy decides what training does with it (``mask`` by default).
``infra_error``    the sandbox, the engine (connection error, 5xx, timeout, abort) or the verifier
                   failed. Retried after an exponential backoff, up to
                   ``rollout.failurePolicy.infraRetries`` times; then dropped from training with
                   its reason logged. Never a reward, never 0.

Callers: :mod:`agentrl.rollout.scheduler` (one :meth:`EpisodeRunner.run` per admitted episode) and
tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Protocol

from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.engine_client.client import EngineError, EngineRequestError
from agentrl.rollout import grading_metrics, metrics
from agentrl.rollout.agent import TrajectoryBuilder
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.sandbox_setup import SetupError, prepare_sandbox
from agentrl.rollout.swe_tools import SWEToolRunner
from agentrl.rollout.tasks.model import HarnessVerification, Task
from agentrl.rollout.trajectory import Timings, Trajectory, training_action
from agentrl.rollout.verifier import VerifierError, VerifierResult, grade_patch, verify
from agentrl.sandbox.errors import SandboxCreateError, SandboxError
from agentrl.sandbox.provider import SandboxProvider, SandboxRequest

logger = logging.getLogger(__name__)

#: Longest wait between two infra retries, whatever the backoff base says.
MAX_RETRY_BACKOFF_SECONDS = 300.0


class Agent(Protocol):
    """The scaffold (:class:`~agentrl.rollout.agent.TokenAgent`; tests script others)."""

    async def run(
        self, episode_id: str, task: Task, tools: SWEToolRunner, out: TrajectoryBuilder
    ) -> None: ...


def infra_reason(exc: BaseException) -> str | None:
    """The infra-error category of an exception, or None when it is not one.

    Sandbox, engine and verifier failures are infrastructure; so is anything unexpected (a bug
    in the runtime must not be blamed on the policy either)."""
    if isinstance(exc, SandboxCreateError):
        return "sandbox_create"
    if isinstance(exc, SandboxError):
        return "sandbox"
    if isinstance(exc, EngineRequestError):
        return "engine_rejected"
    if isinstance(exc, EngineError):
        return "engine_unavailable"
    if isinstance(exc, VerifierError):
        return "verifier"
    if isinstance(exc, SetupError):
        return "setup"
    if isinstance(exc, Exception):
        return "internal"
    return None


def grades_patch(task: Task) -> bool:
    """Whether ``task`` is graded on the agent's patch in a fresh sandbox (tasks with an eval
    script: SWE-bench, SWE-smith) rather than in the agent's own sandbox."""
    return isinstance(task.verification, HarnessVerification)


class EpisodeRunner:
    """Runs episodes against one sandbox provider and one agent scaffold."""

    def __init__(
        self,
        *,
        provider: SandboxProvider,
        agent: Agent,
        caps: EpisodeCaps,
        failure_policy: FailurePolicy,
        on_release: Callable[[str], None] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.provider = provider
        self.agent = agent
        self.caps = caps
        self.failure_policy = failure_policy
        self.on_release = on_release
        """Called with the episode id when an attempt ends (the engine pool's stickiness)."""
        self._sleep = sleep  # injectable so retry tests do not wait out real backoffs

    def _request(self, task: Task, episode_id: str) -> SandboxRequest:
        return SandboxRequest(
            episode_id=episode_id,
            # None lets the provider use spec.sandbox.image / spec.sandbox.e2b.template.
            image=task.image,
            template=task.template,
            workdir=task.workdir,
        )

    async def run_attempt(
        self, task: Task, *, group_id: str, policy_version: int, attempt: int = 0
    ) -> Trajectory:
        """One attempt; exceptions become ``infra_error`` trajectories, never escape."""
        episode_id = f"{task.id}-{uuid.uuid4().hex[:12]}"
        caps = self.caps
        timings = Timings(started_at=time.time())
        out = TrajectoryBuilder()
        terminal = TerminalClass.COMPLETED
        reward: float | None = None
        reason: str | None = None
        grade_status: str | None = None
        clean = grades_patch(task)
        metrics.EPISODES_IN_FLIGHT.inc()
        try:
            created = time.monotonic()
            try:
                # asyncio.timeout, not wait_for: no extra task per episode.
                async with asyncio.timeout(caps.sandbox_startup_timeout_seconds):
                    sandbox = await self.provider.create(self._request(task, episode_id))
            except TimeoutError as exc:
                raise SandboxCreateError(
                    f"sandbox not ready within {caps.sandbox_startup_timeout_seconds:g}s"
                ) from exc
            timings.sandbox_startup_seconds = time.monotonic() - created
            async with sandbox:
                await prepare_sandbox(sandbox, task, timeout=caps.tool_timeout_seconds)
                tools = SWEToolRunner(
                    sandbox,
                    task,
                    timeout_seconds=caps.tool_timeout_seconds,
                    output_max_bytes=caps.tool_output_max_bytes,
                )
                if clean:  # the patch is taken against the repository as the agent found it
                    await tools.read_base()
                limit = min(caps.episode_timeout_seconds, task.timeout_seconds or float("inf"))
                clock = asyncio.timeout(limit)
                try:
                    async with clock:
                        await self.agent.run(episode_id, task, tools, out)
                except TimeoutError:
                    if not clock.expired():  # a timeout of our own clock, not a tool's
                        raise
                if clock.expired():
                    terminal = TerminalClass.AGENT_TIMEOUT
                elif out.truncation is not None:
                    terminal = TerminalClass.TRUNCATED
                if clean:
                    patch = tools.patch if tools.patch is not None else await tools.capture_patch()
                else:
                    result = await verify(sandbox, task, timeout=caps.verifier_timeout_seconds)
            if clean:  # the agent's sandbox is released: the patch is graded in a fresh one
                result = await self._grade(task, patch, episode_id)
                grade_status = result.grade_status
            timings.verifier_seconds = result.seconds
            reward = result.reward
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure here is classified, none is a reward
            terminal = TerminalClass.INFRA_ERROR
            reason = f"{infra_reason(exc)}: {type(exc).__name__}: {exc}"
            reward = None
            grade_status = None
            if infra_reason(exc) == "internal":
                logger.exception("episode %s: unexpected error (counted as infra)", episode_id)
        finally:
            metrics.EPISODES_IN_FLIGHT.dec()
            if self.on_release is not None:
                self.on_release(episode_id)
        timings.finished_at = time.time()
        timings.llm_seconds = out.llm_seconds
        timings.tool_seconds = out.tool_seconds
        trajectory = Trajectory(
            episode_id=episode_id,
            task_id=task.id,
            group_id=group_id,
            attempt=attempt,
            policy_version=policy_version,
            terminal_class=terminal,
            truncation=out.truncation if terminal == TerminalClass.TRUNCATED else None,
            reward=reward,
            training_action=training_action(terminal, self.failure_policy),
            infra_reason=reason,
            grade_status=grade_status,
            token_ids=out.token_ids,
            logprobs=out.logprobs,
            loss_mask=out.loss_mask,
            prompt_length=out.prompt_length,
            token_level=out.token_level,
            weight_versions=out.weight_versions,
            turns=out.turns,
            tool_use=out.tool_use,
            timings=timings,
        )
        _record(trajectory)
        return trajectory

    async def _grade(self, task: Task, patch: str, episode_id: str) -> VerifierResult:
        """Grade ``patch`` in a fresh sandbox of ``task`` (its creation bounded like the
        agent's) and count its grade status."""
        result = await grade_patch(
            self.provider,
            task,
            patch,
            timeout=self.caps.verifier_timeout_seconds,
            episode_id=episode_id,
            startup_timeout=self.caps.sandbox_startup_timeout_seconds,
        )
        if result.grade_status is not None:
            grading_metrics.GRADES.labels(result.grade_status.value).inc()
        return result

    async def run(
        self, task: Task, *, group_id: str, policy_version: int, attempt: int = 0
    ) -> Trajectory:
        """An episode with its infra-error retries; the last attempt's trajectory.
        ``attempt``: attempts already spent elsewhere (a rollout worker that died with the
        episode), which count against the same ``infraRetries`` budget."""
        policy = self.failure_policy
        while True:
            trajectory = await self.run_attempt(
                task, group_id=group_id, policy_version=policy_version, attempt=attempt
            )
            if trajectory.terminal_class != TerminalClass.INFRA_ERROR:
                return trajectory
            category = (trajectory.infra_reason or "unknown").split(":", 1)[0]
            if attempt >= policy.infra_retries:
                metrics.INFRA_DROPPED.labels(category).inc()
                logger.warning(
                    "episode of task %s dropped from training after %d attempts: %s",
                    task.id,
                    attempt + 1,
                    trajectory.infra_reason,
                )
                return trajectory
            metrics.INFRA_RETRIES.labels(category).inc()
            delay = min(MAX_RETRY_BACKOFF_SECONDS, policy.infra_retry_backoff_seconds * 2**attempt)
            logger.info(
                "episode of task %s: infra error (%s); retry %d/%d in %.1fs",
                task.id,
                trajectory.infra_reason,
                attempt + 1,
                policy.infra_retries,
                delay,
            )
            await self._sleep(delay)
            attempt += 1


def _record(trajectory: Trajectory) -> None:
    metrics.EPISODES.labels(trajectory.terminal_class.value).inc()
    metrics.EPISODE_SECONDS.observe(trajectory.timings.total_seconds)
    if trajectory.truncation is not None:
        metrics.TRUNCATIONS.labels(trajectory.truncation.value).inc()
    if trajectory.terminal_class != TerminalClass.INFRA_ERROR:
        metrics.EPISODE_TURNS.observe(trajectory.num_turns)
        metrics.EPISODE_TOKENS.observe(len(trajectory.token_ids))
        metrics.EPISODE_GENERATED_TOKENS.observe(trajectory.generated_tokens)
    if trajectory.reward is not None:
        metrics.EPISODE_REWARD.observe(trajectory.reward)
