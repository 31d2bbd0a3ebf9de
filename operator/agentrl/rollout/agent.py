"""The SWE agent scaffold: one agent, :class:`TokenAgent`, for every model.

It keeps the conversation as token ids (TITO: tokens in, tokens out): the prompt is rendered
once, each reply's ``output_ids`` and the engine's logprobs are appended as they came (loss
mask 1), and each observation is appended as the chat template renders it (loss mask 0).
Nothing is ever re-tokenised, so the ids the trainer scores are exactly those the engine
sampled.

An episode: the system prompt and the task's first user message
(:meth:`TurnTokenizer.task_message`) are rendered; then, each turn, the reply is parsed from
the engine's output ids (:meth:`TurnTokenizer.parse_reply`), every call of it runs in order
through :meth:`~agentrl.rollout.swe_tools.SWEToolRunner.call` until a ``submit`` (which ends the
episode with the patch on :attr:`TrajectoryBuilder.patch`), and the results go back as the
template's tool messages, grouped (:meth:`TurnTokenizer.tool_results_ids`), the last one ending
with the turns left when ``rollout.showRemainingTurns``. A malformed reply or one without a call
gets an error observation as a user message and the episode goes on (counted by
:func:`~agentrl.rollout.toolcalls.record_reply` and in the trajectory's
:class:`~agentrl.rollout.trajectory.ToolUse`).

What differs between models is only the turn tokenizer, and with it the call syntax:

- a Hugging Face tokenizer with ``spec.model.toolCallParser``
  (:class:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer`): native tool calls in the template's
  syntax, the tool schemas of :func:`~agentrl.rollout.swe_tools.tool_schemas` given to the
  template. Before each generation the episode's
  :class:`~agentrl.rollout.hf_tokenizer.PrefixChecker` checks that the trajectory's ids equal
  the template's rendering of the conversation so far (and once more when the episode ends); at
  the first break the loss is turned off from the break to the end of the trajectory
  (:func:`~agentrl.rollout.hf_tokenizer.mask_after_break`), the break is counted
  (:func:`~agentrl.rollout.hf_tokenizer.record_prefix_check`) and the episode is not checked
  again.
- the tiny policy's :class:`WordTurnTokenizer`, or a Hugging Face tokenizer without a parser:
  one-line text actions (:mod:`agentrl.rollout.text_actions`), read into the same calls of the
  same tools, the actions listed in the first user message. There is no template to check a
  prefix against (:meth:`TurnTokenizer.prefix_checker` is None).

The agent writes into a :class:`TrajectoryBuilder` owned by the episode, so an episode cut by
its wall clock keeps what it had. Caps (:class:`~agentrl.rollout.caps.EpisodeCaps`): turns,
trajectory tokens (never beyond the engine's context length), tokens per turn, tool output
size.

Callers: :mod:`agentrl.rollout.episode`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agentrl.engine_client.client import EngineUnavailable, GenerateResponse, SamplingParams
from agentrl.rollout import metrics, text_actions
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.hf_tokenizer import (
    HFTurnTokenizer,
    Message,
    PrefixChecker,
    mask_after_break,
    record_prefix_check,
)
from agentrl.rollout.swe_tools import SWEToolRunner, with_remaining_turns
from agentrl.rollout.tasks.model import Task
from agentrl.rollout.toolcalls import ParsedReply, record_reply
from agentrl.rollout.tools import ToolResult
from agentrl.rollout.trajectory import ToolUse, TruncationCap, TurnRecord

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a repository. "
    "Work one tool call at a time; submit when the tests pass."
)
#: What a native tool-call agent is told after a reply that called no tool.
NO_TOOL_CALL_OBSERVATION = (
    "Your reply called no tool. Call one of the tools (submit when the task is done)."
)


class TurnTokenizer(Protocol):
    """How a conversation becomes token ids, turn by turn, and how a reply's calls are read
    (per model family): :class:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer` or
    :class:`WordTurnTokenizer`."""

    def task_message(self, task: Task) -> str:
        """The first user message of an episode of ``task``."""
        ...

    def initial_ids(self, system: str, user: str) -> list[int]:
        """System and user messages plus the generation prompt."""
        ...

    def parse_reply(self, generated: Sequence[int]) -> ParsedReply:
        """The calls (or the error) of the engine's output ids."""
        ...

    def close_turn_ids(self, generated: Sequence[int]) -> list[int]:
        """Tokens that end an assistant turn the engine stopped without its end token."""
        ...

    def tool_results_ids(self, results: Sequence[str]) -> list[int]:
        """One turn's tool results plus the next generation prompt."""
        ...

    def append_ids(self, messages: Sequence[Message]) -> list[int]:
        """Messages (an error observation as a user message) plus the next generation prompt."""
        ...

    def prefix_checker(self) -> PrefixChecker | None:
        """A whole-conversation check for one episode, or None where there is no template to
        check against."""
        ...

    @property
    def observation_role(self) -> str:
        """The role tool results are rendered with."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...


class WordTurnTokenizer:
    """:class:`TurnTokenizer` over the tiny policy's word tokenizer (its chat template), acting
    in text actions."""

    observation_role = "tool"

    def __init__(self) -> None:
        from agentrl.tiny.tokenizer import ChatMessage, get_tokenizer

        self._tok = get_tokenizer()
        self._message = ChatMessage

    def task_message(self, task: Task) -> str:
        return text_actions.task_message(task)

    def initial_ids(self, system: str, user: str) -> list[int]:
        return self._tok.apply_chat_template(
            [self._message(role="system", content=system), self._message(role="user", content=user)]
        )

    def parse_reply(self, generated: Sequence[int]) -> ParsedReply:
        return text_actions.parse_text_action(self.decode(generated))

    def close_turn_ids(self, generated: Sequence[int]) -> list[int]:
        return [] if generated and generated[-1] == self._tok.eos_id else [self._tok.eos_id]

    def tool_results_ids(self, results: Sequence[str]) -> list[int]:
        return self.append_ids([{"role": "tool", "content": "\n\n".join(results)}])

    def append_ids(self, messages: Sequence[Message]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            ids += self._tok.encode_message(str(message["role"]), str(message.get("content", "")))
        return [*ids, self._tok.role_ids["assistant"]]

    def prefix_checker(self) -> None:
        return None

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(ids)


@dataclass
class TrajectoryBuilder:
    """What an episode has produced so far; survives the episode being cut by its clock."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    prompt_length: int = 0
    turns: list[TurnRecord] = field(default_factory=list)
    weight_versions: list[str] = field(default_factory=list)
    llm_seconds: float = 0.0
    tool_seconds: float = 0.0
    submitted: bool = False
    patch: str | None = None
    """The diff ``submit`` captured (native tool calls), for grading in a clean sandbox; None
    when the agent did not submit that way."""
    truncation: TruncationCap | None = None
    token_level: bool = True
    """False when the scaffold has no token ids to record (chat API)."""
    tool_use: ToolUse = field(default_factory=ToolUse)
    """Calls, unreadable replies, replies without a call and the prefix break
    (:class:`~agentrl.rollout.trajectory.ToolUse`)."""

    def add_context(self, ids: Sequence[int]) -> None:
        self.token_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.loss_mask.extend([0] * len(ids))

    def add_generated(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.loss_mask.extend([1] * len(ids))


class TokenAgent:
    """The training scaffold over ``/generate``, token ids and logprobs kept (see the module
    docstring)."""

    def __init__(self, pool: EnginePool, tokenizer: TurnTokenizer, caps: EpisodeCaps) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.caps = caps
        if native_tool_calls(tokenizer) and not getattr(tokenizer, "tools", None):
            raise ValueError(
                "native tool calls need the tool schemas in the turn tokenizer "
                "(HFTurnTokenizer(tools=swe_tools.tool_schemas()))"
            )

    async def run(
        self, episode_id: str, task: Task, tools: SWEToolRunner, out: TrajectoryBuilder
    ) -> None:
        """One episode of ``task`` with ``tools`` into ``out`` (see the module docstring)."""
        turns, caps = self.tokenizer, self.caps
        user = turns.task_message(task)
        messages: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": user},
        ]
        checker = turns.prefix_checker()
        out.tool_use.prefix_checked = checker is not None
        out.add_context(turns.initial_ids(SYSTEM_PROMPT, user))
        out.prompt_length = len(out.token_ids)
        while True:
            room = (
                len(out.turns) < caps.max_turns and len(out.token_ids) < caps.max_trajectory_tokens
            )
            if checker is not None and room:
                _check_prefix(checker, out, messages, final=False)
            mark = len(out.token_ids)
            generated = await self._generate(episode_id, out)
            if generated is None:
                break
            response, engine = generated
            if out.tool_use.prefix_break is not None:  # past a break: nothing more is trained
                out.loss_mask = mask_after_break(out.loss_mask, mark)
            reply = turns.parse_reply(response.output_ids)
            record_reply(reply)
            count_reply(out.tool_use, reply)
            messages.append(reply.assistant_message())
            observations, submit = await self._run_calls(reply, tools, out)
            turns_left = caps.max_turns - len(out.turns) - 1
            if caps.show_remaining_turns and observations and submit is None:
                observations[-1] = with_remaining_turns(observations[-1], turns_left)
            out.turns.append(
                TurnRecord(
                    action=_action_text(reply)[:500],
                    observation="\n\n".join(
                        observations if submit is None else [*observations, submit.observation]
                    ),
                    generated_tokens=len(response.output_ids),
                    finish_reason=response.finish_type,
                    engine=engine,
                    weight_version=response.meta_info.weight_version,
                )
            )
            if submit is not None:
                out.submitted = True
                out.patch = submit.patch
                break
            closing = turns.close_turn_ids(response.output_ids)
            if reply.calls and reply.error is None:
                results = [{"role": turns.observation_role, "content": o} for o in observations]
                new = turns.tool_results_ids(observations)
            else:
                results = [{"role": "user", "content": observations[0]}]
                new = turns.append_ids(results)
            messages.extend(results)
            self._add_context(out, [*closing, *new])
        if checker is not None:
            _check_prefix(checker, out, messages, final=True)

    async def _generate(
        self, episode_id: str, out: TrajectoryBuilder
    ) -> tuple[GenerateResponse, str] | None:
        """One turn's generation appended to ``out`` (loss mask 1), or None (and
        ``out.truncation`` set) when a turn or token cap ends the episode first."""
        caps = self.caps
        if len(out.turns) >= caps.max_turns:
            out.truncation = TruncationCap.TURNS
            return None
        budget = caps.max_trajectory_tokens - len(out.token_ids)
        if budget <= 0:
            out.truncation = TruncationCap.TRAJECTORY_TOKENS
            return None
        max_new = min(caps.max_tokens_per_turn, budget)
        sampling = SamplingParams(
            max_new_tokens=max_new, temperature=caps.temperature, top_p=caps.top_p
        )
        start = time.monotonic()
        response, engine = await self.pool.generate(
            episode_id, out.token_ids, sampling, timeout=caps.llm_timeout_seconds
        )
        out.llm_seconds += time.monotonic() - start
        if response.finish_type == "abort":
            raise EngineUnavailable(f"engine aborted the request: {response.meta_info}", url=engine)
        logprobs = response.logprobs
        if len(logprobs) != len(response.output_ids):
            raise EngineUnavailable(
                f"engine returned {len(response.output_ids)} tokens but {len(logprobs)} logprobs",
                url=engine,
            )
        out.add_generated(response.output_ids, logprobs)
        if response.meta_info.weight_version is not None:
            out.weight_versions.append(response.meta_info.weight_version)
        if response.finish_type == "length" and len(response.output_ids) >= (
            caps.max_tokens_per_turn
        ):
            metrics.TURN_CUTS.inc()
        return response, engine

    def _add_context(self, out: TrajectoryBuilder, ids: Sequence[int]) -> None:
        room = self.caps.max_trajectory_tokens - len(out.token_ids)
        # What does not fit is cut; the budget check of the next turn then truncates it.
        out.add_context(list(ids)[: max(0, room)])

    async def _run_calls(
        self, reply: ParsedReply, tools: SWEToolRunner, out: TrajectoryBuilder
    ) -> tuple[list[str], ToolResult | None]:
        """The observations of a reply's calls, run in order, and the result of ``submit`` when
        one ran (the calls after it are not run). A reply whose calls cannot be read, or that
        has none, gets one error observation."""
        if reply.error is not None:
            return [reply.error.observation()], None
        if not reply.calls:
            return [NO_TOOL_CALL_OBSERVATION], None
        observations: list[str] = []
        for call in reply.calls:
            result = await tools.call(call.name, call.arguments)
            out.tool_seconds += result.seconds
            if result.submitted:
                return observations, result
            observations.append(result.observation)
        return observations, None


def count_reply(use: ToolUse, reply: ParsedReply) -> None:
    """Add a parsed reply to the episode's tool use (what :func:`record_reply` counts in the
    process's metrics)."""
    if reply.error is not None:
        use.call_errors += 1
    elif not reply.calls:
        use.turns_without_call += 1
    use.calls += len(reply.calls)


def native_tool_calls(tokenizer: object) -> bool:
    """Whether a :class:`TokenAgent` with this turn tokenizer acts through native tool calls:
    a Hugging Face turn tokenizer given a ``tool_call_parser``."""
    return isinstance(tokenizer, HFTurnTokenizer) and tokenizer.parser is not None


def _at_a_cap(out: TrajectoryBuilder, caps: EpisodeCaps) -> bool:
    """Whether the next generation would be refused by the turn or token cap."""
    return len(out.turns) >= caps.max_turns or len(out.token_ids) >= caps.max_trajectory_tokens


def _action_text(reply: ParsedReply) -> str:
    """A turn's action for logs: its calls as ``name {json arguments}``, one per line, or what
    the model wrote when it called nothing readable."""
    if reply.text_action:
        return next((line.strip() for line in reply.text.splitlines() if line.strip()), "")
    if reply.error is None and reply.calls:
        return "\n".join(
            f"{c.name} {json.dumps(c.arguments, ensure_ascii=False)}" for c in reply.calls
        )
    return reply.text


def _check_prefix(
    checker: PrefixChecker, out: TrajectoryBuilder, messages: Sequence[Message], *, final: bool
) -> None:
    """Check the trajectory against the template's rendering of ``messages`` (until its first
    break), counting the check; on a break, the loss goes off from it to the end. ``final``:
    the episode has ended, and a trajectory that stops inside the rendering (the newline after
    the last ``<|im_end|>``, an observation cut by the token cap) is no break."""
    if out.tool_use.prefix_break is not None:
        return
    at = checker.mismatch(out.token_ids, messages)
    if final and at is not None and at >= len(out.token_ids):
        at = None
    record_prefix_check(at)
    if at is not None:
        out.tool_use.prefix_break = at
        out.loss_mask = mask_after_break(out.loss_mask, at)
