"""CPU per agent turn of the chat-format layer: rendering, parsing and the prefix check.

One episode of ``--turns`` turns (default 20) is replayed through
:class:`~agentrl.rollout.hf_tokenizer.HFTurnTokenizer` over the tokenizer
:mod:`agentrl.rollout.hf_model_files` makes (nothing is downloaded), for each chat format
(``qwen3-instruct`` with the ``qwen25`` parser, ``qwen3-coder`` with ``qwen3_coder``,
``qwen3-thinking`` with ``qwen25``). Each turn does what the token-level agent does between two
generations, and each part is timed in process CPU time:

- ``parse``: decode the engine's output ids and read the tool calls (:meth:`parse_reply`);
- ``render``: the closing ids and the tool results' ids plus the next generation prompt
  (:meth:`close_turn_ids`, :meth:`tool_results_ids`);
- ``prefix_check``: render the whole conversation so far with the tools and compare its ids
  with the trajectory, through the episode's
  :class:`~agentrl.rollout.hf_tokenizer.PrefixChecker` (only the text new since the last check
  is tokenised; the rendering still grows with the episode);
- ``prefix_check_stateless`` (reported beside, not in the total): the same with
  :meth:`prefix_mismatch`, which tokenises the whole conversation every time.

The engine's output ids are made beforehand (the reply text encoded, then ``<|im_end|>``) and
are not timed. ``--rounds`` replays (default 5); the figure is the median round's mean per
turn, in microseconds, plus the last turn's prefix check (the longest conversation). Prints one
JSON object.

    python bench/chat_format.py [--turns 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from agentrl.rollout.hf_model_files import build_tokenizer
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }
    for name, description, props, required in (
        ("bash", "Run a shell command.", {"command": {"type": "string"}}, ["command"]),
        (
            "str_replace_editor",
            "View, create and edit files.",
            {
                "command": {"type": "string", "enum": ["view", "create", "str_replace"]},
                "path": {"type": "string"},
                "old_str": {"type": "string"},
                "new_str": {"type": "string"},
            },
            ["command", "path"],
        ),
        ("submit", "Finish the task.", {}, []),
    )
]
CALLS: list[dict[str, Any]] = [
    {"name": "bash", "arguments": {"command": "cd /repo && python -m pytest -q -x tests/"}},
    {"name": "str_replace_editor", "arguments": {"command": "view", "path": "/repo/app.py"}},
    {
        "name": "str_replace_editor",
        "arguments": {
            "command": "str_replace",
            "path": "/repo/app.py",
            "old_str": "def value(self):\n    return self._value + 1\n",
            "new_str": "def value(self):\n    return self._value\n",
        },
    },
    {"name": "bash", "arguments": {"command": "cat <<'EOF' > t.py\nimport app\nprint(1)\nEOF"}},
]
OBSERVATION = (
    "============================= test session starts ==============================\n"
    + "tests/test_app.py::test_value PASSED\n" * 20
    + "FAILED tests/test_app.py::test_other - AssertionError: assert 1 == 2\n[exit code 1]\n"
)
FORMATS = {
    "qwen3-instruct": "qwen25",
    "qwen3-coder": "qwen3_coder",
    "qwen3-thinking": "qwen25",
}


def assistant_message(fmt: str, turn: int) -> dict[str, Any]:
    """The assistant message of ``turn``; the model's reply is its rendering by the template."""
    call = CALLS[turn % len(CALLS)]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": f"Step {turn}: checking the code.",
        "tool_calls": [{"type": "function", "function": call}],
    }
    if fmt == "qwen3-thinking":
        message["reasoning_content"] = f"Turn {turn}. The test still fails; look closer."
    return message


def run(fmt: str, parser: str, turns: int) -> dict[str, Any]:
    tok = build_tokenizer(template=fmt)
    started = time.process_time()
    hf = HFTurnTokenizer(tok, tools=TOOLS, tool_call_parser=parser)
    construction = time.process_time() - started
    end = int(tok.convert_tokens_to_ids("<|im_end|>"))  # type: ignore[arg-type]
    head = [
        {"role": "system", "content": "You are a software engineer."},
        {"role": "user", "content": "Make the failing test pass."},
    ]
    # The replies as the model writes them: each assistant message rendered by the template.
    outputs: list[list[int]] = []
    for turn in range(turns):
        message = assistant_message(fmt, turn)
        prompt = str(tok.apply_chat_template(head, tools=TOOLS, tokenize=False,  # type: ignore[arg-type]
                                             add_generation_prompt=True))  # fmt: skip
        whole = str(tok.apply_chat_template([*head, message], tools=TOOLS, tokenize=False))  # type: ignore[arg-type]
        reply = whole[len(prompt) : whole.rindex("<|im_end|>")]
        outputs.append([*tok.encode(reply, add_special_tokens=False), end])

    ids = hf.initial_ids(head[0]["content"], head[1]["content"])
    messages: list[dict[str, Any]] = list(head)
    parts = {"parse": 0.0, "render": 0.0, "prefix_check": 0.0}
    stateless = 0.0
    last_check = 0.0
    checker = hf.prefix_checker()
    for turn, out in enumerate(outputs):
        t0 = time.process_time()
        parsed = hf.parse_reply(out)
        t1 = time.process_time()
        ids += [*out, *hf.close_turn_ids(out)]
        ids += hf.tool_results_ids([OBSERVATION])
        t2 = time.process_time()
        messages += [parsed.assistant_message(), {"role": "tool", "content": OBSERVATION}]
        mismatch = checker.mismatch(ids, messages)
        t3 = time.process_time()
        again = hf.prefix_mismatch(ids, messages)
        stateless += time.process_time() - t3
        if parsed.error is not None or not parsed.calls or mismatch is not None or again:
            raise SystemExit(f"{fmt} turn {turn}: {parsed.error} {parsed.calls} {mismatch}")
        parts["parse"] += t1 - t0
        parts["render"] += t2 - t1
        parts["prefix_check"] += t3 - t2
        last_check = t3 - t2
    us = {k: v / turns * 1e6 for k, v in parts.items()}
    return {
        **{f"{k}_us_per_turn": round(v, 1) for k, v in us.items()},
        "total_us_per_turn": round(sum(us.values()), 1),
        "last_turn_prefix_check_us": round(last_check * 1e6, 1),
        "prefix_check_stateless_us_per_turn": round(stateless / turns * 1e6, 1),
        "trajectory_tokens": len(ids),
        "construction_ms": round(construction * 1e3, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result: dict[str, Any] = {"turns": args.turns, "rounds": args.rounds, "formats": {}}
    for fmt, name in FORMATS.items():
        rounds = [run(fmt, name, args.turns) for _ in range(args.rounds)]
        rounds.sort(key=lambda r: r["total_us_per_turn"])
        median = rounds[len(rounds) // 2]
        median["total_us_per_turn_min_max"] = [
            rounds[0]["total_us_per_turn"],
            rounds[-1]["total_us_per_turn"],
        ]
        result["formats"][fmt] = median
    result["total_us_per_turn_median"] = statistics.median(
        r["total_us_per_turn"] for r in result["formats"].values()
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
