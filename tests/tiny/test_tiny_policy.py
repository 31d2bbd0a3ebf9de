"""The word tokenizer and the tiny policy's causal features."""

from __future__ import annotations

import pytest
import torch

from agentrl.tiny import policy as tiny
from agentrl.tiny.tokenizer import get_tokenizer


def test_tool_calls_round_trip_through_the_word_tokenizer() -> None:
    tok = get_tokenizer()
    for text in ("apply off_by_one", "run_tests", "view core.py", "submit"):
        assert tok.decode(tok.encode(text)) == text


def test_unknown_words_go_to_a_stable_hash_bucket_not_to_unk() -> None:
    tok = get_tokenizer()
    a, b = tok.encode("window_sums"), tok.encode("window_sums")
    assert a == b and tok.is_hashed(a[0]) and a[0] != tok.unk_id


def test_the_chat_template_writes_role_markers_and_a_generation_prompt() -> None:
    tok = get_tokenizer()
    ids = tok.apply_chat_template([{"role": "user", "content": "submit"}])
    expected = [tok.bos_id, tok.role_ids["user"], tok.token_id("submit"), tok.role_ids["assistant"]]
    assert ids == expected


def test_features_of_an_assistant_token_use_the_last_observation_only() -> None:
    tok = get_tokenizer()
    ids = [
        tok.bos_id, tok.role_ids["user"], tok.token_id("fix"),          # 0..2
        tok.role_ids["assistant"], tok.token_id("run_tests"), tok.eos_id,  # 3..5
        tok.role_ids["tool"], tok.token_id("None"), tok.token_id("None"),  # 6..8
        tok.role_ids["assistant"], tok.token_id("apply"),                  # 9..10
    ]  # fmt: skip
    rows = tiny.step_features(ids, 4, 11)
    # token 4 answers the user message; token 10 answers the tool output (distinct ids)
    assert rows.obs_ids[0] == [tok.token_id("fix")]
    assert rows.obs_ids[-1] == [tok.token_id("None")]
    assert rows.positions[0] == 0 and rows.positions[-1] == 0 and rows.positions[1] == 1
    assert rows.prev_ids[-1] == tok.role_ids["assistant"]


@pytest.mark.slow
def test_the_initial_policy_writes_well_formed_calls_whatever_it_reads() -> None:
    tok = get_tokenizer()
    model = tiny.initial_policy(0, steps=150)
    prompt = tok.apply_chat_template([{"role": "tool", "content": "AssertionError got None"}])
    with torch.no_grad():
        logits = model(tiny.step_features(prompt, len(prompt), len(prompt) + 1))
    probs = torch.softmax(logits[0], -1)
    tools = sum(
        float(probs[tok.token_id(w)]) for w in ("run_tests", "apply", "submit", "view", "bash")
    )
    assert tools > 0.9  # the first word of a reply is a tool word


def test_saved_weights_load_back_identically(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = tiny.new_policy(3, dim=8)
    tiny.save_policy(model, tmp_path / "w")
    loaded = tiny.load_policy(tmp_path / "w")
    for a, b in zip(model.parameters(), loaded.parameters(), strict=False):
        assert torch.equal(a, b)


def _next_token_probs(
    model: tiny.TinyPolicy, role: str, text: str, reply: list[str]
) -> torch.Tensor:
    tok = get_tokenizer()
    prompt = [tok.bos_id, tok.role_ids[role], *tok.encode(text), tok.role_ids["assistant"]]
    ids = prompt + [tok.token_id(w) for w in reply]
    with torch.no_grad():
        logits = model(tiny.step_features(ids, len(ids), len(ids) + 1))
    return torch.softmax(logits[0], -1)


@pytest.mark.slow
def test_the_initial_policy_follows_the_protocol_and_picks_edits_blind_to_the_evidence() -> None:
    tok = get_tokenizer()
    edits = tiny.DEFAULT_PRIOR_EDITS
    model = tiny.initial_policy(0, edit_names=edits)
    # Real observations, not the prior's own synthetic ones.
    task = (
        "The repository has a bug: the test tests/test_bank.py::test_net_flow fails.\n"
        "`net_flow` in bank.py should do this: Sum of all amounts.\n"
        "Find the bug and fix it without breaking the other tests.\n\n"
        "Reply with exactly one action on the first line:\n"
        "run_tests | view PATH | bash CMD | apply EDIT_NAME | submit\n"
        "candidate edits: swap_comparison missing_return wrong_operator wrong_constant"
    )
    none_log = (
        ".....F [100%]\n=== FAILURES ===\ntests/test_bank.py:51: in test_net_flow\n"
        "E   AssertionError: net_flow([10, -3, 5]): expected 12, got None\n"
        "E   assert None == 12\n1 failed, 5 passed in 0.03s\n[exit code 1]"
    )
    bool_log = none_log.replace("expected 12, got None", "expected True, got False").replace(
        "None == 12", "False == True"
    )
    assert _next_token_probs(model, "user", task, [])[tok.token_id("run_tests")] > 0.8
    assert _next_token_probs(model, "tool", none_log, [])[tok.token_id("apply")] > 0.8
    applied = _next_token_probs(model, "tool", "applied missing_return to bank.py", [])
    assert applied[tok.token_id("submit")] > 0.8  # the prior says 0.9 (300 fit steps gave 0.6)
    # Which edit: spread over the six, and the same whatever the evidence says (no leak).
    ids = [tok.token_id(e) for e in edits]
    for log in (none_log, bool_log):
        p = _next_token_probs(model, "tool", log, ["apply"])[ids]
        assert float(p.sum()) > 0.9
        assert float(p.min()) > 0.05  # uniform would be 1/6 ≈ 0.17 each
    p_none = _next_token_probs(model, "tool", none_log, ["apply"])[ids]
    p_bool = _next_token_probs(model, "tool", bool_log, ["apply"])[ids]
    assert float((p_none - p_bool).abs().max()) < 0.1


def test_observed_words_vote_for_next_tokens_through_their_own_weights() -> None:
    """The direct term: logits += vote_gain · Σ_w U[w] / sqrt(n) over the n distinct observed
    words. Two models differing only in one vote weight differ in exactly that logit."""
    tok = get_tokenizer()
    torch.manual_seed(0)
    config = tiny.TinyConfig(vocab_size=tok.vocab_size, dim=8, vote_gain=10.0)
    plain = tiny.TinyPolicy(config)
    voting = tiny.TinyPolicy(config)
    voting.load_state_dict(plain.state_dict())
    none_id, target = tok.token_id("None"), tok.token_id("missing_return")
    with torch.no_grad():  # the vote of "None" at turn position 1 (the argument after apply)
        voting.obs_vote.weight[1 * tok.vocab_size + none_id, target] = 0.5
    words = [tok.token_id(w) for w in ("got", "None", "expected", "value")]
    features = tiny.StepFeatures(
        obs_ids=[words, words, words],
        prev_ids=[tok.token_id("apply"), tok.bos_id, tok.eos_id],
        positions=[1, 0, 7],
    )
    with torch.no_grad():
        delta = voting(features) - plain(features)
    assert float(delta[0, target]) == pytest.approx(10.0 * 0.5 / 2.0)  # n = 4 → 1/sqrt(4)
    others = torch.cat([delta[0, :target], delta[0, target + 1 :]])
    assert float(others.abs().max()) == 0.0
    # Other turn positions have their own votes: the first word of a turn (which tool) and
    # a late one are untouched by the argument's vote.
    assert float(delta[1:].abs().max()) == 0.0
    # A fresh policy's votes are all zero, and the prior fit leaves them there.
    assert float(tiny.new_policy(0).obs_vote.weight.detach().abs().max()) == 0.0
    prior = tiny.initial_policy(0, steps=5)
    assert float(prior.obs_vote.weight.detach().abs().max()) == 0.0


def test_the_agents_earlier_turns_are_its_memory_and_vote_without_scaling() -> None:
    tok = get_tokenizer()
    ids = tok.apply_chat_template(
        [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": "apply off_by_one"},
            {"role": "tool", "content": "applied off_by_one to a.py"},
            {"role": "assistant", "content": "run_tests"},
            {"role": "tool", "content": "1 failed"},
        ]
    )
    ids += [tok.token_id("apply")]  # the current turn is not memory yet
    rows = tiny.step_features([*ids, 0], len(ids), len(ids) + 1, tok)
    words = {tok.vocab[i] for i in rows.own_ids[0]}
    assert words == {"apply", "off_by_one", "run_tests"}
    assert {tok.vocab[i] for i in rows.obs_ids[0]} == {"failed"}  # "1" is a number: not read

    torch.manual_seed(0)
    config = tiny.TinyConfig(vocab_size=tok.vocab_size, dim=8, vote_gain=10.0)
    plain = tiny.TinyPolicy(config)
    remembering = tiny.TinyPolicy(config)
    remembering.load_state_dict(plain.state_dict())
    tried = tok.token_id("off_by_one")
    position = rows.positions[0]
    assert position == 1  # the argument of the current "apply"
    with torch.no_grad():
        remembering.own_vote.weight[position * tok.vocab_size + tried, tried] = -0.4
        delta = remembering(rows)[0] - plain(rows)[0]
    assert float(delta[tried]) == pytest.approx(-4.0)  # 10 × -0.4, one word, no 1/sqrt(n)
    assert float(torch.cat([delta[:tried], delta[tried + 1 :]]).abs().max()) == 0.0
