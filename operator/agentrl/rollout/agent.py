"""The SWE agent scaffolds: the token-level ``/generate`` agent and the OpenAI-compatible chat
agent.

:class:`TokenAgent` is the one training uses. It keeps the conversation as token ids (TITO:
tokens in, tokens out): the prompt is rendered once, each reply's ``output_ids`` and the engine's
logprobs are appended as they came (loss mask 1), and each tool observation is appended as the
chat template renders a tool message (loss mask 0). Nothing is ever re-tokenised, so the ids the
trainer scores are exactly those the engine sampled.

It acts in one of two ways, decided by its turn tokenizer:

- *native tool calls*, when the turn tokenizer is an
  :class:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer` with a ``tool_call_parser`` (a real
  chat model, ``spec.model.toolCallParser``): the prompt is the system prompt and the task's
  instruction rendered with the tool schemas of :func:`~agentrl.rollout.swe_tools.tool_schemas`
  (given to the tokenizer as ``tools``); each reply is parsed from the engine's output ids in the
  model's own call syntax, every call of it runs in order through
  :meth:`~agentrl.rollout.swe_tools.SWEToolRunner.call` until a ``submit`` (which ends the
  episode with the patch on :attr:`TrajectoryBuilder.patch`), and the results go back as the
  template's tool messages, grouped (:meth:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer.
  tool_results_ids`), the last one ending with the turns left when
  ``rollout.showRemainingTurns``. A malformed reply or one without a call gets an error
  observation as a user message and the episode goes on (counted by
  :func:`~agentrl.rollout.toolcalls.record_reply`). Before each generation the episode's
  :class:`~agentrl.rollout.hf_tokenizer.PrefixChecker` checks that the trajectory's ids equal the
  template's rendering of the conversation so far (and once more when the episode ends); at the
  first break the loss is turned off from the break to the end of the trajectory
  (:func:`~agentrl.rollout.hf_tokenizer.mask_after_break`), the break is counted
  (:func:`~agentrl.rollout.hf_tokenizer.record_prefix_check`) and the episode is not checked
  again.
- *text actions* otherwise (the tiny policy's :class:`WordTurnTokenizer`, or a Hugging Face
  tokenizer without a parser): the first line of a reply is an action of
  :func:`~agentrl.rollout.tools.parse_action`.

:class:`ChatAgent` drives a model through ``/v1/chat/completions`` with tool calls (bash, view,
edit, run_tests, submit, and apply for toy tasks). It is for evaluating real models; its
trajectories carry no token ids (``token_level=False``) and are not trained on.

Both write into a :class:`TrajectoryBuilder` owned by the episode, so an episode cut by its wall
clock keeps what it had. Caps (:class:`~agentrl.rollout.caps.EpisodeCaps`): turns, trajectory
tokens (never beyond the engine's context length), tokens per turn, tool output size.

Callers: :mod:`agentrl.rollout.episode`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from agentrl.engine_client.client import (
    EngineRequestError,
    EngineTimeout,
    EngineUnavailable,
    GenerateResponse,
    SamplingParams,
)
from agentrl.rollout import metrics
from agentrl.rollout.balancer import EnginePool, GenerateEngine
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
from agentrl.rollout.tools import ToolCall, ToolResult, ToolRunner, parse_action
from agentrl.rollout.trajectory import TruncationCap, TurnRecord

SYSTEM_PROMPT = (
    "You are a software engineer fixing a bug in a repository. "
    "Work one tool call at a time; submit when the tests pass."
)
#: What a native tool-call agent is told after a reply that called no tool.
NO_TOOL_CALL_OBSERVATION = (
    "Your reply called no tool. Call one of the tools (submit when the task is done)."
)


class TurnTokenizer(Protocol):
    """How a conversation becomes token ids, turn by turn (per model family)."""

    def initial_ids(self, system: str, user: str) -> list[int]:
        """System and user messages plus the generation prompt."""
        ...

    def close_turn_ids(self, generated: Sequence[int]) -> list[int]:
        """Tokens that end an assistant turn the engine stopped without its end token."""
        ...

    def observation_ids(self, observation: str) -> list[int]:
        """A tool message plus the next generation prompt."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...


class WordTurnTokenizer:
    """:class:`TurnTokenizer` over the tiny policy's word tokenizer (its chat template)."""

    def __init__(self) -> None:
        from agentrl.tiny.tokenizer import ChatMessage, get_tokenizer

        self._tok = get_tokenizer()
        self._message = ChatMessage

    def initial_ids(self, system: str, user: str) -> list[int]:
        return self._tok.apply_chat_template(
            [self._message(role="system", content=system), self._message(role="user", content=user)]
        )

    def close_turn_ids(self, generated: Sequence[int]) -> list[int]:
        return [] if generated and generated[-1] == self._tok.eos_id else [self._tok.eos_id]

    def observation_ids(self, observation: str) -> list[int]:
        return [*self._tok.encode_message("tool", observation), self._tok.role_ids["assistant"]]

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
    prefix_break: int | None = None
    """Where the trajectory first stopped being the template's rendering of the conversation
    (native tool calls); the loss is off from there on."""

    def add_context(self, ids: Sequence[int]) -> None:
        self.token_ids.extend(ids)
        self.logprobs.extend([0.0] * len(ids))
        self.loss_mask.extend([0] * len(ids))

    def add_generated(self, ids: Sequence[int], logprobs: Sequence[float]) -> None:
        self.token_ids.extend(ids)
        self.logprobs.extend(logprobs)
        self.loss_mask.extend([1] * len(ids))


class TokenAgent:
    """The training scaffold over ``/generate``, token ids and logprobs kept: native tool calls
    when the turn tokenizer reads them (:func:`native_tool_calls`), text actions otherwise."""

    def __init__(self, pool: EnginePool, tokenizer: TurnTokenizer, caps: EpisodeCaps) -> None:
        self.pool = pool
        self.tokenizer = tokenizer
        self.caps = caps
        self.native: HFTurnTokenizer | None = (
            tokenizer if isinstance(tokenizer, HFTurnTokenizer) and tokenizer.parser else None
        )
        """The turn tokenizer when the agent acts through native tool calls, else None."""
        if self.native is not None and not self.native.tools:
            raise ValueError(
                "native tool calls need the tool schemas in the turn tokenizer "
                "(HFTurnTokenizer(tools=swe_tools.tool_schemas()))"
            )

    async def run(
        self, episode_id: str, task: Task, tools: ToolRunner, out: TrajectoryBuilder
    ) -> None:
        if self.native is not None:
            await self._run_native(self.native, episode_id, task, swe_tool_runner(tools), out)
            return
        user = f"{task.instruction}\n\n{tools.describe()}"
        out.add_context(self.tokenizer.initial_ids(SYSTEM_PROMPT, user))
        out.prompt_length = len(out.token_ids)
        while True:
            generated = await self._generate(episode_id, out)
            if generated is None:
                return
            response, engine = generated
            text = response.text or self.tokenizer.decode(response.output_ids)
            call = parse_action(text)
            result = await tools.run(call)
            out.tool_seconds += result.seconds
            out.turns.append(
                TurnRecord(
                    action=text.strip().split("\n", 1)[0][:500],
                    observation=result.observation,
                    generated_tokens=len(response.output_ids),
                    finish_reason=response.finish_type,
                    engine=engine,
                    weight_version=response.meta_info.weight_version,
                )
            )
            if result.submitted:
                out.submitted = True
                return
            closing = self.tokenizer.close_turn_ids(response.output_ids)
            observation = self.tokenizer.observation_ids(result.observation)
            self._add_context(out, [*closing, *observation])

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

    async def _run_native(
        self,
        turns: HFTurnTokenizer,
        episode_id: str,
        task: Task,
        tools: SWEToolRunner,
        out: TrajectoryBuilder,
    ) -> None:
        """An episode in native tool calls (see the module docstring)."""
        caps = self.caps
        messages: list[Message] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.instruction},
        ]
        checker = turns.prefix_checker()
        out.add_context(turns.initial_ids(SYSTEM_PROMPT, task.instruction))
        out.prompt_length = len(out.token_ids)
        while True:
            if len(out.turns) < caps.max_turns and len(out.token_ids) < caps.max_trajectory_tokens:
                _check_prefix(checker, out, messages, final=False)
            mark = len(out.token_ids)
            generated = await self._generate(episode_id, out)
            if generated is None:
                break
            response, engine = generated
            if out.prefix_break is not None:  # past a break: nothing more is trained
                out.loss_mask = mask_after_break(out.loss_mask, mark)
            reply = turns.parse_reply(response.output_ids)
            record_reply(reply)
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
        _check_prefix(checker, out, messages, final=True)

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


def native_tool_calls(tokenizer: object) -> bool:
    """Whether a :class:`TokenAgent` with this turn tokenizer acts through native tool calls:
    a Hugging Face turn tokenizer given a ``tool_call_parser``."""
    return isinstance(tokenizer, HFTurnTokenizer) and tokenizer.parser is not None


def swe_tool_runner(tools: ToolRunner) -> SWEToolRunner:
    """``tools`` as the :class:`~agentrl.rollout.swe_tools.SWEToolRunner` native tool calls
    run through (the episode's own when it already is one, which is what episodes make)."""
    if isinstance(tools, SWEToolRunner):
        return tools
    return SWEToolRunner(
        tools.sandbox,
        tools.task,
        timeout_seconds=tools.timeout_seconds,
        output_max_bytes=tools.output_max_bytes,
    )


def _action_text(reply: ParsedReply) -> str:
    """A turn's action for logs: its calls as ``name {json arguments}``, one per line, or what
    the model wrote when it called nothing readable."""
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
    if out.prefix_break is not None:
        return
    at = checker.mismatch(out.token_ids, messages)
    if final and at is not None and at >= len(out.token_ids):
        at = None
    record_prefix_check(at)
    if at is not None:
        out.prefix_break = at
        out.loss_mask = mask_after_break(out.loss_mask, at)


# ---------------------------------------------------------------------------------------------
# The OpenAI-compatible chat scaffold


def chat_tools(task: Task) -> list[dict[str, Any]]:
    """OpenAI ``tools`` for a task (``apply`` only where the task has candidate edits)."""

    def tool(name: str, description: str, props: dict[str, str]) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": {
                        k: {"type": "string", "description": v} for k, v in props.items()
                    },
                    "required": list(props),
                },
            },
        }

    tools = [
        tool("bash", "Run a shell command in the repository.", {"command": "the command"}),
        tool("view", "Show a file.", {"path": "file path"}),
        tool(
            "edit",
            "Replace the single occurrence of `old` in a file with `new`.",
            {"path": "file path", "old": "exact text to replace", "new": "replacement"},
        ),
        tool("submit", "Finish; the hidden tests run.", {}),
    ]
    if task.visible_test_command:
        tools.append(tool("run_tests", "Run the visible tests.", {}))
    if task.candidate_edits:
        names = ", ".join(e.name for e in task.candidate_edits)
        tools.append(tool("apply", f"Apply a named candidate edit ({names}).", {"name": "edit"}))
    return tools


class ChatClient:
    """Minimal OpenAI ``/v1/chat/completions`` caller on one shared aiohttp pool.

    Not an SGLang client: it speaks the OpenAI API any server (SGLang, vLLM, a hosted model)
    offers. Its pool size is passed in, derived from the spec like the engine client's.
    """

    def __init__(self, *, model: str, max_connections: int, api_key: str | None = None) -> None:
        self.model = model
        self._max_connections = max_connections
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None

    def _ensure(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, limit_per_host=self._max_connections
            )
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def complete(
        self, base_url: str, body: dict[str, Any], *, timeout: float
    ) -> dict[str, Any]:
        url = f"{base_url.rstrip('/')}/v1/chat/completions"
        try:
            async with self._ensure().post(
                url,
                json={"model": self.model, **body},
                timeout=aiohttp.ClientTimeout(total=timeout),
            ) as resp:
                text = await resp.text()
                if resp.status >= 500:
                    raise EngineUnavailable(
                        f"{url}: HTTP {resp.status}: {text[:200]}", url=url, status=resp.status
                    )
                if resp.status >= 400:
                    raise EngineRequestError(
                        f"{url}: HTTP {resp.status}: {text[:200]}", url=url, status=resp.status
                    )
                data: dict[str, Any] = json.loads(text)
                return data
        except TimeoutError as exc:
            raise EngineTimeout(f"{url}: no answer within {timeout:g}s", url=url) from exc
        except aiohttp.ClientError as exc:
            raise EngineUnavailable(f"{url}: {exc}", url=url) from exc
        except json.JSONDecodeError as exc:
            raise EngineUnavailable(f"{url}: response is not JSON", url=url) from exc


class ChatAgent:
    """Evaluation scaffold: OpenAI chat with tool calls, one tool call executed per turn."""

    def __init__(self, pool: EnginePool, client: ChatClient, caps: EpisodeCaps) -> None:
        self.pool = pool
        self.client = client
        self.caps = caps

    async def run(
        self, episode_id: str, task: Task, tools: ToolRunner, out: TrajectoryBuilder
    ) -> None:
        caps = self.caps
        out.token_level = False
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": task.instruction},
        ]
        spec_tools = chat_tools(task)
        used_tokens = 0
        while True:
            if len(out.turns) >= caps.max_turns:
                out.truncation = TruncationCap.TURNS
                return
            budget = caps.max_trajectory_tokens - used_tokens
            if budget <= 0:
                out.truncation = TruncationCap.TRAJECTORY_TOKENS
                return
            body = {
                "messages": messages,
                "tools": spec_tools,
                "max_tokens": min(caps.max_tokens_per_turn, budget),
                "temperature": caps.temperature,
                "top_p": caps.top_p,
            }
            start = time.monotonic()

            async def send(engine: GenerateEngine, body: dict[str, Any] = body) -> dict[str, Any]:
                return await self.client.complete(
                    engine.base_url, body, timeout=caps.llm_timeout_seconds
                )

            data, engine_url = await self.pool.call(episode_id, send)
            out.llm_seconds += time.monotonic() - start
            usage = data.get("usage") or {}
            used_tokens = int(usage.get("total_tokens", used_tokens))
            choice = (data.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            messages.append({k: v for k, v in message.items() if v is not None})
            calls = message.get("tool_calls") or []
            if not calls:
                observation = "Call exactly one tool."
                messages.append({"role": "user", "content": observation})
                out.turns.append(
                    TurnRecord(
                        action=str(message.get("content", ""))[:500],
                        observation=observation,
                        engine=engine_url,
                    )
                )
                continue
            first = calls[0]
            function = first.get("function") or {}
            name = str(function.get("name", ""))
            try:
                raw_args = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                raw_args = {}
            args = {str(k): str(v) for k, v in (raw_args or {}).items()}
            call = (
                ToolCall(name=name, arguments=args)
                if name in ("bash", "view", "edit", "submit", "run_tests", "apply")
                else None
            )
            result = await tools.run(call)
            out.tool_seconds += result.seconds
            out.turns.append(
                TurnRecord(
                    action=f"{name} {json.dumps(args)}"[:500],
                    observation=result.observation,
                    finish_reason=str(choice.get("finish_reason", "")),
                    engine=engine_url,
                )
            )
            if result.submitted:
                out.submitted = True
                return
            for extra in calls:
                # One tool call runs per turn; the others are answered so the API stays valid.
                content = result.observation if extra is first else "not run: one call per turn"
                messages.append(
                    {"role": "tool", "tool_call_id": extra.get("id", ""), "content": content}
                )
