"""The tiny torch policy: a word-level model small enough to train with GRPO on two CPU cores.

Used by the tiny engine (``agentrl.tiny.server``, which samples from it), by the torch
trainer backend (``agentrl.trainer.torch_backend``, which recomputes logprobs and steps it) and by
``agentrl run``. Both sides call :func:`sequence_logprobs` / :func:`step_features` here, so the
trainer's logprobs equal the engine's up to float rounding — the tiny model has no train/inference
mismatch of its own, which makes the mismatch metrics a clean check of the pipeline.

The model
---------
A next-token predictor over :class:`~agentrl.tiny.tokenizer.WordTokenizer` ids. The state at a
position is four things, all causal (they use only earlier tokens):

* the **last observation**: the distinct vocabulary words of the most recent non-assistant
  message (the tool output the agent is answering; names outside the vocabulary and numbers
  are not read, see :meth:`ContextScanner.read`), summed and scaled by 1/sqrt(count) so one
  telling word is not drowned by a long test log;
* the **memory**: the distinct words the agent wrote in its earlier turns of the episode (which
  edits it has already tried);
* the **previous token** (what was just written in this turn);
* the **position within the assistant turn** (clamped).

``h = tanh(obs + prev + pos)``, one residual tanh layer, then logits over the vocabulary, plus
two direct *vote* terms: every observed word and every remembered word adds its own row of
logits (``obs_vote``, ``own_vote``, times ``vote_gain``), one row per word *and turn position*
(``vote_slots``: the tool word and its argument are different decisions). The votes are what
RL moves fastest: one word's association with one next token is one weight, so "an applied
edit → run the tests", "``None`` in the log → ``missing_return``" or "already tried
``off_by_one`` → not again" are each learnable from a few hundred episodes, where through the
hidden layer they were not (measured: no held-out gain in 1,280 episodes). About 2.6 M
parameters, nearly all of them votes. This is enough for the
toy tasks' contract; it cannot do anything a real SWE agent does, and is not meant to.

The initial weights
-------------------
A real run starts from a pretrained model that already writes well-formed tool calls. The tiny
policy gets the same starting point from :func:`initial_policy`: a short supervised fit on
well-formed replies (``run_tests``, ``apply <edit>``, ``submit``, ...) sampled independently of
the observation, so at step 0 it writes valid calls but picks among them blindly — the
"random policy picks right about 1 time in 6" of the toy contract. Both vote matrices start
at zero and the fit leaves them there. RL has to learn the rest.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import torch
from pydantic import BaseModel, Field
from torch import nn

from agentrl.tiny.tokenizer import (
    COMMON_WORDS,
    EDIT_WORDS,
    NUMBERS,
    TOKENIZER_NAME,
    WordTokenizer,
    get_tokenizer,
)

#: Architecture name written to ``config.json``.
ARCHITECTURE: Final = "AgentRLTinyPolicy"
#: The ``spec.model.source.path`` value that means "the built-in tiny policy".
BUILTIN_PATH: Final = "tiny"
WEIGHTS_FILE: Final = "model.safetensors"
CONFIG_FILE: Final = "config.json"

#: The edit names the toy contract names explicitly; the initial prior spreads over these
#: unless the caller passes the dataset's own list.
DEFAULT_PRIOR_EDITS: Final = EDIT_WORDS[:6]


class TinyConfig(BaseModel):
    """Shape of the tiny policy (``config.json`` next to the weights)."""

    architecture: str = ARCHITECTURE
    """Always ``AgentRLTinyPolicy``."""
    tokenizer: str = TOKENIZER_NAME
    """Tokenizer the ids belong to."""
    vocab_size: int = Field(ge=16)
    """Number of token ids."""
    dim: int = Field(default=64, ge=4, le=4096)
    """Hidden width."""
    max_turn_positions: int = Field(default=8, ge=2, le=512)
    """Positions within an assistant turn that get their own embedding (later ones share the
    last)."""
    obs_gain: float = Field(default=8.0, gt=0.0, le=100.0)
    """Factor on the observation's word embeddings (initialised smaller by the same factor).
    Adam moves every parameter by about the learning rate per step; without the gain a word
    of a 60-word test log moves the hidden state sqrt(60) times less per step than the
    previous-token and position embeddings, so RL shifts the policy's *marginal* choice long
    before it learns which words point to which edit (measured: it collapsed onto one edit)."""

    vote_gain: float = Field(default=20.0, ge=0.0, le=1000.0)
    """Factor on the observation's direct votes for next tokens."""
    vote_slots: int = Field(default=3, ge=1, le=16)
    """Positions within an assistant turn that get their own vote rows (later positions share
    the last). The first word of a turn (which tool) and the second (its argument: which
    edit) are different decisions: with one shared table, what RL taught the votes for one
    leaked into the other (measured: after ``apply``, 22% of the words written were tool
    names instead of edits, and a failing log got ``apply`` 70% of the time instead of the
    prior's 90%)."""


class StepFeatures(BaseModel):
    """The model's inputs for predicting a batch of tokens (one row per predicted token)."""

    obs_ids: list[list[int]]
    """Distinct ids of the last observation, per row."""
    prev_ids: list[int]
    """The token before the predicted one, per row."""
    positions: list[int]
    """Position of the predicted token within its assistant turn, per row (unclamped)."""
    own_ids: list[list[int]] = Field(default_factory=list)
    """Distinct words the agent wrote in its earlier turns of the episode, per row (empty: no
    memory, e.g. for callers that predate it)."""


class TinyPolicy(nn.Module):
    """Bag-of-observation + previous-token + turn-position → next-token logits."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        self.config = config
        v, d = config.vocab_size, config.dim
        self.obs_embedding = nn.EmbeddingBag(v, d, mode="sum")
        self.prev_embedding = nn.Embedding(v, d)
        self.position_embedding = nn.Embedding(config.max_turn_positions, d)
        self.hidden = nn.Linear(d, d)
        self.output = nn.Linear(d, v)
        # Row ``slot · V + word``: the vote of ``word`` at turn position ``slot``.
        self.obs_vote = nn.EmbeddingBag(config.vote_slots * v, v, mode="sum")
        nn.init.zeros_(self.obs_vote.weight)
        self.own_vote = nn.EmbeddingBag(config.vote_slots * v, v, mode="sum")
        nn.init.zeros_(self.own_vote.weight)
        for emb in (self.prev_embedding, self.position_embedding):
            nn.init.normal_(emb.weight, std=0.3)
        nn.init.normal_(self.obs_embedding.weight, std=0.3 / config.obs_gain)

    def forward(self, features: StepFeatures) -> torch.Tensor:
        """Logits ``[rows, vocab]`` for the rows of ``features``."""
        flat: list[int] = []
        offsets: list[int] = []
        weights: list[float] = []
        for ids in features.obs_ids:
            offsets.append(len(flat))
            flat.extend(ids)
            # sum / sqrt(n): a long log does not wash out the one word that matters.
            weights.extend([1.0 / math.sqrt(max(len(ids), 1))] * len(ids))
        flat_t = torch.tensor(flat, dtype=torch.long)
        offsets_t = torch.tensor(offsets, dtype=torch.long)
        weights_t = torch.tensor(weights, dtype=torch.float32)
        obs = self.obs_embedding(flat_t, offsets_t, per_sample_weights=weights_t)
        obs = obs * self.config.obs_gain
        last = self.config.max_turn_positions - 1
        pos = torch.tensor([min(p, last) for p in features.positions], dtype=torch.long)
        prev = torch.tensor(features.prev_ids, dtype=torch.long)
        h = torch.tanh(obs + self.prev_embedding(prev) + self.position_embedding(pos))
        h = h + torch.tanh(self.hidden(h))
        logits: torch.Tensor = self.output(h)
        v, top = self.config.vocab_size, self.config.vote_slots - 1
        bases = [min(p, top) * v for p in features.positions]
        slotted = [base + i for ids, base in zip(features.obs_ids, bases, strict=True) for i in ids]
        votes = self.obs_vote(
            torch.tensor(slotted, dtype=torch.long), offsets_t, per_sample_weights=weights_t
        )
        if features.own_ids:
            own: list[int] = []
            own_offsets: list[int] = []
            for ids, base in zip(features.own_ids, bases, strict=True):
                own_offsets.append(len(own))
                own.extend(base + i for i in ids)
            votes = votes + self.own_vote(
                torch.tensor(own, dtype=torch.long), torch.tensor(own_offsets, dtype=torch.long)
            )
        return logits + votes * self.config.vote_gain


class ContextScanner:
    """Causal scan over a token sequence: feed tokens with :meth:`push`, ask :meth:`context`
    for the inputs of the next one. The engine keeps one per request (incremental decoding);
    :func:`step_features` runs one over a whole sequence."""

    def __init__(self, tokenizer: WordTokenizer) -> None:
        self.assistant = tokenizer.role_ids["assistant"]
        self.markers = set(tokenizer.role_ids.values())
        self.skip = {tokenizer.bos_id, tokenizer.pad_id}
        self.tokenizer = tokenizer
        self.segment: list[int] = []
        self.in_assistant = False
        self.turn_start = 0
        self.observation: list[int] = []
        self.own: set[int] = set()

    def memory(self) -> list[int]:
        """The distinct words of the agent's finished turns in this episode (what it has
        already tried)."""
        return sorted(self.own)

    def context(self, position: int) -> tuple[list[int], int]:
        """(observation ids, position within the turn) for predicting token ``position``."""
        if self.in_assistant:
            return self.observation, position - self.turn_start
        # Outside an assistant turn (no chat template): everything so far is the observation.
        return self.read(self.segment), position

    def read(self, segment: Sequence[int]) -> list[int]:
        """What the policy reads of a message: the distinct vocabulary words in it.

        Names outside the vocabulary (hash buckets) and numbers are left out. They identify a
        task (its module, functions and values) rather than describe a failure, and a word-bag
        policy that reads them memorises which edit fixed which training task instead of what
        the evidence says (measured: held-out edit choice at chance while the training tasks'
        rose to 0.43)."""
        tok = self.tokenizer
        return sorted({t for t in segment if not tok.is_number(t) and not tok.is_hashed(t)})

    def push(self, position: int, token: int) -> None:
        """Account for ``token`` at ``position``."""
        if token in self.markers:
            if self.in_assistant:
                self.own.update(t for t in self.segment if t != self.tokenizer.eos_id)
            if token == self.assistant:
                if not self.in_assistant:
                    self.observation = self.read(self.segment)
                self.in_assistant = True
                self.turn_start = position + 1
            else:
                self.in_assistant = False
            self.segment = []
        elif token not in self.skip:
            self.segment.append(token)


def step_features(
    ids: Sequence[int], start: int, end: int, tokenizer: WordTokenizer | None = None
) -> StepFeatures:
    """Inputs for predicting ``ids[start:end]`` from what precedes each of them.

    The engine calls it with the prompt plus the tokens generated so far (one row); the
    trainer with a whole trajectory and the ranges the agent generated (many rows). Both get
    identical rows for the same token, which is what makes their logprobs equal.
    """
    tok = tokenizer or get_tokenizer()
    scan = ContextScanner(tok)
    rows = StepFeatures(obs_ids=[], prev_ids=[], positions=[], own_ids=[])
    for position in range(end):
        if position >= start:
            observation, turn_pos = scan.context(position)
            rows.obs_ids.append(list(observation))
            rows.prev_ids.append(ids[position - 1] if position > 0 else tok.bos_id)
            rows.positions.append(turn_pos)
            rows.own_ids.append(scan.memory())
        if position < len(ids):  # end may be len(ids) + 1: the token about to be sampled
            scan.push(position, ids[position])
    return rows


def sequence_logprobs(
    model: TinyPolicy,
    ids: Sequence[int],
    spans: Sequence[tuple[int, int]],
    *,
    temperature: float = 1.0,
) -> torch.Tensor:
    """Logprobs (with gradient) of ``ids[a:b]`` for every ``(a, b)`` in ``spans``, concatenated.

    ``temperature`` scales the logits the way the engine's sampler did: the engine reports the
    logprob of the distribution it sampled from, and the trainer must compare like with like.
    """
    return batch_logprobs(model, [(ids, spans)], temperature=temperature)[0]


def batch_logprobs(
    model: TinyPolicy,
    items: Sequence[tuple[Sequence[int], Sequence[tuple[int, int]]]],
    *,
    temperature: float = 1.0,
) -> list[torch.Tensor]:
    """:func:`sequence_logprobs` for many sequences in one forward pass (the trainer's path)."""
    tok = get_tokenizer()
    merged = StepFeatures(obs_ids=[], prev_ids=[], positions=[], own_ids=[])
    targets: list[int] = []
    sizes: list[int] = []
    for ids, spans in items:
        n = 0
        for a, b in spans:
            rows = step_features(ids, a, b, tok)
            merged.obs_ids += rows.obs_ids
            merged.prev_ids += rows.prev_ids
            merged.positions += rows.positions
            merged.own_ids += rows.own_ids
            targets += list(ids[a:b])
            n += b - a
        sizes.append(n)
    if not targets:
        return [torch.zeros(0) for _ in items]
    logits = model(merged) / max(temperature, 1e-6)
    logp = torch.log_softmax(logits, dim=-1)
    picked = logp.gather(1, torch.tensor(targets, dtype=torch.long).unsqueeze(1)).squeeze(1)
    return list(torch.split(picked, sizes))


def new_policy(seed: int = 0, *, dim: int = 64) -> TinyPolicy:
    """A randomly initialised tiny policy over the shipped vocabulary."""
    torch.manual_seed(seed)
    return TinyPolicy(TinyConfig(vocab_size=get_tokenizer().vocab_size, dim=dim))


def initial_policy(
    seed: int = 0,
    *,
    edit_names: Sequence[str] = DEFAULT_PRIOR_EDITS,
    dim: int = 64,
    steps: int = 600,
) -> TinyPolicy:
    """The starting point of a run: follows the tool protocol, picks edits blindly.

    A short supervised fit (:func:`_fit_prior`) on replies to synthetic observations of the
    scaffold's five situations (:data:`PRIOR_REPLIES`): a task statement is answered with
    ``run_tests``, a failing test log with ``apply <edit>``, an applied edit with ``submit``,
    and so on. The edit is always uniform over ``edit_names`` and the observations' contents
    (values, error types, pytest's explanations) are drawn at random, independently of the
    edit; so the prior knows *when* to apply an edit but nothing about *which* one fits the
    evidence — that is what RL has to learn.
    """
    tok = get_tokenizer()
    unknown = [name for name in edit_names if name not in tok.vocab]
    if unknown:
        raise ValueError(f"edit names outside the tiny vocabulary: {unknown}")
    with single_thread():
        return _fit_prior(seed, tuple(edit_names), dim=dim, steps=steps)


@contextmanager
def single_thread() -> Iterator[None]:
    """Run torch on one thread inside the block.

    The tiny model's matrices are small enough that a second intra-op thread only adds
    synchronisation; on a loaded two-core machine it made a training step 25x slower
    (measured: 180 ms vs 7 ms for a 64-sequence step).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- the prior's situations --------------------------------------------------------------------
#
# What a pretrained model brings to the toy scaffold: it reads the kind of observation it got
# and answers with the matching tool. Each situation renders a random observation of that kind
# and has a fixed reply distribution; ``APPLY`` stands for "apply <edit>" with the edit uniform
# over the dataset's edit names, whatever the observation says.

APPLY: Final = "apply"

#: situation → (reply, probability). Small off-protocol shares keep exploration alive.
PRIOR_REPLIES: Final[dict[str, tuple[tuple[str, float], ...]]] = {
    "task": (("run_tests", 0.95), (APPLY, 0.05)),
    "failing_tests": ((APPLY, 0.94), ("run_tests", 0.03), ("submit", 0.03)),
    "passing_tests": (("submit", 0.95), ("run_tests", 0.05)),
    "edit_applied": (("submit", 0.9), ("run_tests", 0.1)),
    "edit_refused": ((APPLY, 0.6), ("run_tests", 0.2), ("submit", 0.2)),
    "other": (("run_tests", 0.7), (APPLY, 0.3)),
}

_VALUES: Final = (
    "None", "True", "False", "0", "1", "2", "3", "7", "12", "42", "-1", "[]", "[1, 2]",
    "[3, 5, 7]", "'a'", "'abc'", "''", "(1, 2)", "{'a': 1}", "2.5",
)  # fmt: skip
_EXPLANATIONS: Final = (
    "Right contains one more item: {v}",
    "Left contains one more item: {v}",
    "At index 0 diff: {v} != {w}",
    "Use -v to get more diff",
    "- {v}",
    "+ {w}",
)
_ERRORS: Final = ("AssertionError", "TypeError", "ValueError", "IndexError", "KeyError")


def _word(rng: random.Random) -> str:
    """A made-up identifier (module, function and file names differ from task to task)."""
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(3, 10)))


def _filler(rng: random.Random, n: int) -> str:
    pool = (*COMMON_WORDS, *NUMBERS)
    return " ".join(rng.choice(pool) if rng.random() < 0.6 else _word(rng) for _ in range(n))


def _test_log(rng: random.Random, *, failing: bool) -> str:
    """A pytest ``-q --tb=short`` log with random names and values."""
    module, tests = _word(rng), [_word(rng) for _ in range(rng.randint(3, 7))]
    bad = rng.randrange(len(tests)) if failing else -1
    dots = "".join("F" if i == bad else "." for i in range(len(tests)))
    lines = [f"{dots} [100%]"]
    if not failing:
        lines += [f"{len(tests)} passed in 0.0{rng.randint(1, 9)}s", "[exit code 0]"]
        return "\n".join(lines)
    v, w = rng.choice(_VALUES), rng.choice(_VALUES)
    error = rng.choice(_ERRORS)
    name = tests[bad]
    call = f"{name}({_filler(rng, rng.randint(1, 4))})"
    lines += [
        "=== FAILURES ===",
        f"___ test_{name} ___",
        f"tests/test_{module}.py:{rng.randint(5, 60)}: in test_{name}",
        f"assert got == {v}, '{call}: expected {v}, got ' + repr(got)",
        f"E {error}: {call}: expected {v}, got {w}",
        f"E assert {w} == {v}",
    ]
    for text in rng.sample(_EXPLANATIONS, rng.randint(0, 3)):
        lines.append("E " + text.format(v=rng.choice(_VALUES), w=rng.choice(_VALUES)))
    lines += [
        "=== short test summary info ===",
        f"FAILED tests/test_{module}.py::test_{name} - {error}: {call[:20]}...",
        f"1 failed, {len(tests) - 1} passed in 0.0{rng.randint(1, 9)}s",
        "[exit code 1]",
    ]
    return "\n".join(lines)


def prior_observation(situation: str, rng: random.Random, edit_names: Sequence[str]) -> str:
    """A random observation of one of :data:`PRIOR_REPLIES`' situations."""
    module, function = _word(rng), _word(rng)
    offered = " ".join(rng.sample(list(edit_names), min(len(edit_names), rng.randint(3, 6))))
    edit = rng.choice(list(edit_names))
    if situation == "task":
        return (
            f"The repository has a bug: the test tests/test_{module}.py::test_{function} fails.\n"
            f"`{function}` in {module}.py should do this: {_filler(rng, rng.randint(4, 14))}\n"
            "Find the bug and fix it without breaking the other tests.\n\n"
            "Reply with exactly one action on the first line:\n"
            "run_tests | view PATH | bash CMD | apply EDIT_NAME | submit\n"
            f"candidate edits: {offered}"
        )
    if situation in ("failing_tests", "passing_tests"):
        return _test_log(rng, failing=situation == "failing_tests")
    if situation == "edit_applied":
        return f"applied {edit} to {module}.py"
    if situation == "edit_refused":
        if rng.random() < 0.5:
            return f"unknown edit '{edit}'; candidate edits: {offered}"
        return (
            f"edit {edit} does not apply: expected exactly one occurrence of the old text "
            f"in {module}.py, found 0"
        )
    return rng.choice(
        [
            f"Your tool call could not be read (unknown_tool): '{_word(rng)}' is not an "
            "action; reply with one of: run_tests | view PATH | bash CMD | apply EDIT_NAME | "
            "submit",
            "str_replace_editor view: give the file's `path`",
            "bash: give the command to run in `command`",
            f"The path {_filler(rng, 1)} does not exist.",
            f"sh: 1: {_word(rng)}: not found\n[exit code 127]",
        ]
    )


def _prior_example(
    rng: random.Random, edit_names: Sequence[str]
) -> tuple[list[int], tuple[int, int]]:
    """One (ids, reply span) pair: a situation, a random observation of it, a reply."""
    tok = get_tokenizer()
    situation = rng.choice(list(PRIOR_REPLIES))
    replies = PRIOR_REPLIES[situation]
    reply = rng.choices([r for r, _ in replies], weights=[p for _, p in replies])[0]
    words = [APPLY, rng.choice(list(edit_names))] if reply == APPLY else [reply]
    role = "user" if situation == "task" else "tool"
    obs = tok.encode(prior_observation(situation, rng, edit_names))
    prompt = [tok.bos_id, tok.role_ids[role], *obs, tok.role_ids["assistant"]]
    ids = prompt + [tok.token_id(w) for w in words] + [tok.eos_id]
    return ids, (len(prompt), len(ids))


def _fit_prior(seed: int, edit_names: Sequence[str], *, dim: int, steps: int) -> TinyPolicy:
    model = new_policy(seed, dim=dim)
    rng = random.Random(seed + 1)
    # The votes stay at zero: fitted on observations drawn independently of the edit, they
    # would only learn the sample's chance correlations (measured: a prior that picked one
    # edit with p 0.49 and another with 0.007 on a real log). RL moves them from zero.
    fitted = [
        p for name, p in model.named_parameters() if not name.startswith(("obs_vote", "own_vote"))
    ]
    optimizer = torch.optim.Adam(fitted, lr=0.02)
    batch = 64
    for _ in range(steps):
        examples = [_prior_example(rng, edit_names) for _ in range(batch)]
        logps = batch_logprobs(model, [(ids, [span]) for ids, span in examples])
        loss = -torch.stack([lp.sum() for lp in logps]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model


def save_policy(model: TinyPolicy, directory: Path | str) -> Path:
    """Write ``config.json`` + ``model.safetensors`` (what ``/update_weights_from_disk`` reads)."""
    from safetensors.torch import save_file

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    tmp = out / (WEIGHTS_FILE + ".tmp")
    save_file(state, str(tmp))
    tmp.replace(out / WEIGHTS_FILE)  # atomic: an engine never reads half a file
    (out / CONFIG_FILE).write_text(json.dumps(model.config.model_dump(), indent=2) + "\n")
    return out


def load_policy(directory: Path | str) -> TinyPolicy:
    """Read a policy written by :func:`save_policy`."""
    from safetensors.torch import load_file

    src = Path(directory)
    config_path = src / CONFIG_FILE
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: not a tiny policy directory")
    config = TinyConfig.model_validate_json(config_path.read_text())
    if config.architecture != ARCHITECTURE:
        raise ValueError(
            f"{config_path}: architecture {config.architecture!r} is not {ARCHITECTURE}"
        )
    model = TinyPolicy(config)
    model.load_state_dict(load_file(str(src / WEIGHTS_FILE)))
    return model
