"""Token-level episodes for real models: the ids an episode is built from turn by turn equal
what the model's chat template renders for the whole conversation (TITO), and templates that
cannot guarantee it are refused at start-up, naming the problem and the manifest field."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from agentrl.api.rollout import FailurePolicy, TerminalClass
from agentrl.engine_client.client import (
    ModelInfo,
)
from agentrl.rollout.agent import SYSTEM_PROMPT, TokenAgent, WordTurnTokenizer
from agentrl.rollout.balancer import EnginePool
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.episode import EpisodeRunner
from agentrl.rollout.hf_model_files import build_tokenizer
from agentrl.rollout.hf_tokenizer import (
    HFTurnTokenizer,
    TokenizerConfigError,
    load_hf_turn_tokenizer,
)
from agentrl.rollout.runtime import turn_tokenizer_for
from agentrl.sandbox.fake import FakeProvider
from tests.rollout.fakes import LOGPROB, ScriptedEngine, pytest_handler, toy_task

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Knows system, user and assistant only; other roles raise (like many instruct templates).
NO_TOOL_RAISING = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('unsupported role ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Knows system, user and assistant only; other roles are dropped silently.
NO_TOOL_SILENT = (
    "{% for message in messages %}"
    "{% if message['role'] in ['system', 'user', 'assistant'] %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Rewrites past assistant turns once later messages exist (as reasoning templates drop their
# thinking): not prefix-stable.
ELIDING = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n(elided)<|im_end|>\\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

CORPUS = [
    "You are a software engineer fixing a bug in a repository.",
    "Make test_value pass. Reply with exactly one action on the first line.",
    "run_tests view app.py bash ls apply fix submit",
    "PASSED tests/test_app.py::test_value FAILED VALUE = 'BUG' OTHER = 1",
    "system user assistant tool observation task reply",
]


def make_tokenizer(chat_template: str | None = CHATML) -> PreTrainedTokenizerFast:
    """A real fast tokenizer: byte-level BPE trained here, ChatML special tokens."""
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=model,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=chat_template,
    )


@pytest.fixture(scope="module")
def tok() -> PreTrainedTokenizerFast:
    return make_tokenizer()


def encode(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def special(tok: PreTrainedTokenizerFast, token: str) -> int:
    token_id = tok.convert_tokens_to_ids(token)
    assert isinstance(token_id, int)
    return token_id


def rendered(tok: PreTrainedTokenizerFast, messages: list[dict[str, str]]) -> list[int]:
    """The template's own tokenised rendering (``apply_chat_template(tokenize=True)``)."""
    ids = tok.apply_chat_template(messages, tokenize=True, return_dict=False)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    return cast(list[int], ids)


def test_the_initial_ids_are_the_chatml_prompt_with_the_generation_prompt(
    tok: PreTrainedTokenizerFast,
) -> None:
    hf = HFTurnTokenizer(tok)
    expected = encode(
        tok,
        "<|im_start|>system\nYou are a bot.<|im_end|>\n"
        "<|im_start|>user\nFix it.<|im_end|>\n<|im_start|>assistant\n",
    )
    assert hf.initial_ids("You are a bot.", "Fix it.") == expected
    assert expected[0] == special(tok, "<|im_start|>")


def test_an_observation_is_a_tool_message_plus_the_next_generation_prompt(
    tok: PreTrainedTokenizerFast,
) -> None:
    hf = HFTurnTokenizer(tok)
    assert hf.observation_role == "tool"
    observation = "  PASSED tests/test_app.py::test_value\n\n[exit code 0]"
    assert hf.observation_ids(observation) == encode(
        tok, f"<|im_start|>tool\n{observation}<|im_end|>\n<|im_start|>assistant\n"
    )


def test_closing_a_turn_adds_only_what_the_engine_did_not_generate(
    tok: PreTrainedTokenizerFast,
) -> None:
    hf = HFTurnTokenizer(tok)
    im_end = special(tok, "<|im_end|>")
    newline = encode(tok, "\n")
    reply = encode(tok, "submit")
    assert hf.close_turn_ids([*reply, im_end]) == newline  # stopped on <|im_end|>
    assert hf.close_turn_ids(reply) == [im_end, *newline]  # hit max tokens
    assert hf.close_turn_ids([]) == [im_end, *newline]
    assert hf.stop_token_ids == (im_end,)


def test_decoding_skips_special_tokens(tok: PreTrainedTokenizerFast) -> None:
    hf = HFTurnTokenizer(tok)
    ids = [special(tok, "<|im_start|>"), *encode(tok, "apply fix"), special(tok, "<|im_end|>")]
    assert hf.decode(ids) == "apply fix"


@pytest.mark.parametrize("stopped_on_end_token", [True, False], ids=["stop", "max-tokens"])
def test_a_three_turn_episode_equals_the_template_rendering_of_the_conversation(
    tok: PreTrainedTokenizerFast, stopped_on_end_token: bool
) -> None:
    hf = HFTurnTokenizer(tok)
    im_end = special(tok, "<|im_end|>")
    system, user = "You are a software engineer.", "Make test_value pass."
    replies = ["view app.py", "apply fix", "submit"]
    observations = ["VALUE = 'BUG'\nOTHER = 1\n", "PASSED tests/test_app.py::test_value"]

    ids = hf.initial_ids(system, user)
    conversation = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    for turn, reply in enumerate(replies):
        # The engine's output ids (never re-tokenised by the agent).
        generated = [*encode(tok, reply), *([im_end] if stopped_on_end_token else [])]
        ids += [*generated, *hf.close_turn_ids(generated)]
        conversation.append({"role": "assistant", "content": reply})
        if turn < len(observations):
            ids += hf.observation_ids(observations[turn])
            conversation.append({"role": "tool", "content": observations[turn]})

    assert ids == rendered(tok, conversation)


@pytest.mark.parametrize("template", [NO_TOOL_RAISING, NO_TOOL_SILENT], ids=["raises", "drops"])
def test_a_template_without_a_tool_role_gets_observations_as_user_messages(
    template: str,
) -> None:
    tok = make_tokenizer(template)
    hf = HFTurnTokenizer(tok)
    assert hf.observation_role == "user"
    assert hf.observation_ids("ran: ls") == encode(
        tok, "<|im_start|>user\nran: ls<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_template_that_rewrites_earlier_turns_is_refused() -> None:
    with pytest.raises(TokenizerConfigError, match="not prefix-stable") as raised:
        HFTurnTokenizer(make_tokenizer(ELIDING))
    assert "changes the ids of earlier turns" in str(raised.value)
    assert "spec.model.source" in str(raised.value)


def test_a_tokenizer_without_a_chat_template_is_refused() -> None:
    with pytest.raises(TokenizerConfigError, match="no chat_template"):
        HFTurnTokenizer(make_tokenizer(None))


def test_loading_a_model_directory_without_a_chat_template_names_the_manifest_field(
    tmp_path: Path,
) -> None:
    make_tokenizer(None).save_pretrained(tmp_path)
    with pytest.raises(TokenizerConfigError, match="no chat_template") as raised:
        load_hf_turn_tokenizer(str(tmp_path))
    assert "spec.model.source" in str(raised.value)


def test_loading_a_missing_directory_names_the_manifest_field(tmp_path: Path) -> None:
    with pytest.raises(TokenizerConfigError, match=r"spec\.model\.source\.path"):
        load_hf_turn_tokenizer(str(tmp_path / "no-such-model"))


def test_loading_a_directory_without_tokenizer_files_names_the_manifest_field(
    tmp_path: Path,
) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(TokenizerConfigError, match=r"spec\.model\.source\.path"):
        load_hf_turn_tokenizer(str(tmp_path))


def test_a_saved_model_directory_loads_with_its_chat_template(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    tok.save_pretrained(tmp_path)
    hf = load_hf_turn_tokenizer(str(tmp_path))
    assert hf.initial_ids("s", "u") == encode(
        tok,
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n",
    )


async def test_the_token_agent_records_an_episode_in_the_models_chat_format(
    tok: PreTrainedTokenizerFast,
) -> None:
    # The engine answers in the model's ids: the reply's tokens, then <|im_end|>.
    engine = ScriptedEngine(
        ["apply fix", "submit"],
        encode=lambda text: encode(tok, text),
        end_id=special(tok, "<|im_end|>"),
    )
    caps = EpisodeCaps(max_turns=10, max_trajectory_tokens=4096, max_tokens_per_turn=64)
    pool = EnginePool([engine])
    runner = EpisodeRunner(
        provider=FakeProvider(pytest_handler),
        agent=TokenAgent(pool, HFTurnTokenizer(tok), caps),
        caps=caps,
        failure_policy=FailurePolicy(infra_retries=0),
        on_release=pool.release,
    )
    task = toy_task()
    trajectory = await runner.run(task, group_id="g", policy_version=1)
    assert trajectory.terminal_class == TerminalClass.COMPLETED
    assert trajectory.reward == 1.0

    user = (
        f"{task.instruction}\n\nReply with exactly one action on the first line:\n"
        "run_tests | view PATH | bash CMD | apply EDIT_NAME | submit\ncandidate edits: fix decoy"
    )
    observation = trajectory.turns[0].observation
    end = special(tok, "<|im_end|>")
    prompt = encode(
        tok,
        f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n"
        f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n",
    )
    reply1 = [*encode(tok, "apply fix"), end]
    between = encode(tok, f"\n<|im_start|>tool\n{observation}<|im_end|>\n<|im_start|>assistant\n")
    reply2 = [*encode(tok, "submit"), end]

    assert trajectory.prompt_length == len(prompt)
    assert trajectory.token_ids == [*prompt, *reply1, *between, *reply2]
    assert trajectory.loss_mask == (
        [0] * len(prompt) + [1] * len(reply1) + [0] * len(between) + [1] * len(reply2)
    )
    assert [lp for lp, m in zip(trajectory.logprobs, trajectory.loss_mask, strict=True) if m] == (
        [LOGPROB] * (len(reply1) + len(reply2))
    )
    # What the engine was sent each turn is the trajectory so far.
    assert engine.inputs == [prompt, [*prompt, *reply1, *between]]
    # And the trajectory is the template's rendering of the conversation (the episode ended on
    # submit, before the last turn's trailing newline).
    conversation = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user},
        {"role": "assistant", "content": "apply fix"},
        {"role": "tool", "content": observation},
        {"role": "assistant", "content": "submit"},
    ]
    assert [*trajectory.token_ids, *encode(tok, "\n")] == rendered(tok, conversation)


class _InfoClient:
    """Answers ``/get_model_info`` only: what ``turn_tokenizer_for`` reads of an engine."""

    def __init__(self, tokenizer_path: str | None) -> None:
        self.tokenizer_path = tokenizer_path

    async def get_model_info(self) -> ModelInfo:
        return ModelInfo(model_path="/models/m", tokenizer_path=self.tokenizer_path)


async def test_the_runtime_picks_the_tokenizer_the_engine_reports(
    tok: PreTrainedTokenizerFast, tmp_path: Path
) -> None:
    tok.save_pretrained(tmp_path)
    picked = await turn_tokenizer_for(_InfoClient(str(tmp_path)))  # type: ignore[arg-type]
    assert isinstance(picked, HFTurnTokenizer)
    system, user = "be brief", "fix the bug"
    assert picked.initial_ids(system, user) == encode(
        tok,
        f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
        "<|im_start|>assistant\n",
    )
    for tiny_path in (None, "agentrl:tiny"):
        word = await turn_tokenizer_for(_InfoClient(tiny_path))  # type: ignore[arg-type]
        assert isinstance(word, WordTurnTokenizer)
    with pytest.raises(TokenizerConfigError, match=r"spec\.model\.source"):
        await turn_tokenizer_for(_InfoClient(str(tmp_path / "absent")))  # type: ignore[arg-type]


def test_the_bundled_template_serves_the_text_action_agent_without_tools() -> None:
    # The TokenAgent of today (text actions, no tools): a bundled template renders its
    # observations as tool responses in a user turn, and a turn closes with <|im_end|>\n.
    tok = build_tokenizer(template="qwen3-instruct")
    hf = HFTurnTokenizer(tok)
    assert hf.initial_ids("s", "u") == encode(
        tok,
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nu<|im_end|>\n<|im_start|>assistant\n",
    )
    assert hf.observation_ids("ok") == encode(
        tok,
        "<|im_start|>user\n<tool_response>\nok\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
    )
    assert hf.close_turn_ids(encode(tok, "submit")) == encode(tok, "<|im_end|>\n")
