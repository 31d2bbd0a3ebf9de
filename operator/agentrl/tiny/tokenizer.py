"""The word tokenizer of the tiny CPU policy (``tokenizer_path: agentrl:tiny``).

Real engines serve HF models with their own tokenizers; the tiny policy behind
``agentrl engine serve-tiny`` reads and writes words. The rollout tier picks this tokenizer when
an engine's ``/get_model_info`` reports ``tokenizer_path == "agentrl:tiny"`` (see
``docs/design/toy-agent-contract.md``), the tiny engine uses it to turn generated ids into
``text``, and the trainer never needs it (it works on ids).

The vocabulary is fixed and shipped in this module, so ids mean the same thing in every process
and every checkpoint:

* special tokens (padding, end of turn, chat role markers),
* the scaffold's tool words and the toy tasks' edit names (what the policy *emits*),
* words common in test output and Python code (what the policy *reads*),
* hash buckets: any other word maps to one of ``HASH_BUCKETS`` ids by a stable CRC32, so an
  unseen word in an observation still carries information instead of collapsing to ``<unk>``.

Chat template (what ``apply_chat_template`` writes): ``<bos>`` then, per message, a role marker
(``<|system|>``, ``<|user|>``, ``<|tool|>``, ``<|assistant|>``) followed by the content's ids;
assistant turns end with ``<eos>``; a generation prompt is a trailing ``<|assistant|>``.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from pydantic import BaseModel, ConfigDict

#: The name engines report as ``tokenizer_path`` for this tokenizer.
TOKENIZER_NAME: Final = "agentrl:tiny"

PAD: Final = "<pad>"
UNK: Final = "<unk>"
BOS: Final = "<bos>"
EOS: Final = "<eos>"
NEWLINE: Final = "<nl>"
ROLE_MARKERS: Final = {
    "system": "<|system|>",
    "user": "<|user|>",
    "tool": "<|tool|>",
    "assistant": "<|assistant|>",
}
SPECIAL_TOKENS: Final = (PAD, UNK, BOS, EOS, NEWLINE, *ROLE_MARKERS.values())

#: The scaffold's tools (docs/design/toy-agent-contract.md), one tool call per turn.
TOOL_WORDS: Final = ("run_tests", "view", "bash", "apply", "submit")

#: Names of candidate edits the toy tasks draw from (shared bug kinds). The tiny policy can only
#: emit words of the vocabulary, so every edit name a toy task may list must be here.
EDIT_WORDS: Final = (
    "off_by_one",
    "swap_comparison",
    "wrong_operator",
    "negate_condition",
    "wrong_constant",
    "missing_return",
    "wrong_variable",
    "swap_arguments",
    "wrong_index",
    "wrong_default",
    "remove_call",
    "wrong_return",
    "swap_branches",
    "wrong_boundary",
    "inverted_check",
    "wrong_sign",
)

_COMMON_WORDS: Final = """
test tests passed failed error errors failure failures FAILED PASSED ERROR ok OK collected
items item session starts short summary info assert AssertionError assertion where
Traceback most recent call last File line in module E
TypeError ValueError IndexError KeyError ZeroDivisionError AttributeError NameError
RecursionError RuntimeError StopIteration NotImplementedError UnboundLocalError
expected got actual returned result results return returns value values wrong right
should be is was not equal equals greater less than bigger smaller larger too many few
more fewer missing none None True False true false off by one sign negative positive zero
empty list dict tuple str int float bool object index range length len out of bounds key
def class if elif else for while in and or import from as with try except raise pass
self lambda yield print sum min max abs sorted reversed enumerate zip map filter
first last count total add sub mul div plus minus times divided mod
edit edits applied apply candidate candidates available unknown no such file not found
usage command exit code status output truncated tool timeout timed seconds
task bug fix fixed repo repository path function functions argument arguments
py python pytest src tests_ test_ main core utils calc
instruction instructions you your the a an to of this that it its which
call calls called turn turns step steps done finished
Right Left contains diff At Use get sequence instance found item items more one
"""

#: Words of test output and code the policy reads (besides tool words and edit names).
COMMON_WORDS: Final = tuple(dict.fromkeys(_COMMON_WORDS.split()))

#: Punctuation kept as tokens of their own.
PUNCTUATION: Final = tuple("()[]{}<>:;,.=!+-*/%'\"#@&|^~`?$\\")

#: Integers spelled as one token each; larger numbers go to hash buckets.
NUMBERS: Final = tuple(str(n) for n in range(101))

#: Ids set aside for words outside the fixed vocabulary (stable CRC32 of the word).
HASH_BUCKETS: Final = 256

#: Words and punctuation: identifiers, whole numbers, any other single character.
_TOKEN_RE: Final = re.compile(r"\n|<\|[a-z]+\|>|<[a-z]+>|[A-Za-z_][A-Za-z0-9_]*|\d+|[^\s]")


def _build_vocab() -> tuple[str, ...]:
    words: dict[str, None] = {}
    for group in (SPECIAL_TOKENS, TOOL_WORDS, EDIT_WORDS, COMMON_WORDS, PUNCTUATION, NUMBERS):
        for word in group:
            words.setdefault(word, None)
    buckets = tuple(f"<w{i}>" for i in range(HASH_BUCKETS))
    return (*words, *buckets)


class ChatMessage(BaseModel):
    """One chat message as the template renders it."""

    model_config = ConfigDict(frozen=True)

    role: str
    """``system``, ``user``, ``tool`` or ``assistant``."""
    content: str
    """The message text."""


class WordTokenizer:
    """Words ↔ ids over the fixed vocabulary above. Stateless and cheap to build."""

    def __init__(self) -> None:
        self.vocab: tuple[str, ...] = _build_vocab()
        self._ids: dict[str, int] = {word: i for i, word in enumerate(self.vocab)}
        self._bucket_base = len(self.vocab) - HASH_BUCKETS
        self._number_ids = frozenset(self._ids[n] for n in NUMBERS)
        self.pad_id = self._ids[PAD]
        self.unk_id = self._ids[UNK]
        self.bos_id = self._ids[BOS]
        self.eos_id = self._ids[EOS]
        self.newline_id = self._ids[NEWLINE]
        self.role_ids: dict[str, int] = {r: self._ids[m] for r, m in ROLE_MARKERS.items()}

    @property
    def vocab_size(self) -> int:
        """Number of ids (fixed words plus hash buckets)."""
        return len(self.vocab)

    @property
    def name(self) -> str:
        """What engines report as ``tokenizer_path``."""
        return TOKENIZER_NAME

    def token_id(self, word: str) -> int:
        """The id of one word: its vocabulary id, else its hash bucket."""
        found = self._ids.get(word)
        if found is not None:
            return found
        return self._bucket_base + zlib.crc32(word.encode()) % HASH_BUCKETS

    def is_hashed(self, token_id: int) -> bool:
        """Whether ``token_id`` is a hash bucket (a word outside the fixed vocabulary)."""
        return token_id >= self._bucket_base

    def is_number(self, token_id: int) -> bool:
        """Whether ``token_id`` is one of the integers spelled as a token of its own."""
        return token_id in self._number_ids

    def encode(self, text: str) -> list[int]:
        """Split ``text`` into words, numbers and punctuation and map each to its id."""
        out: list[int] = []
        for piece in _TOKEN_RE.findall(text):
            out.append(self.newline_id if piece == "\n" else self.token_id(piece))
        return out

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = True) -> str:
        """Ids back to text. Words are separated by spaces; punctuation is glued to its
        neighbours (``calc/core.py``), which is what tool arguments need."""
        parts: list[str] = []
        glue_next = True
        for token_id in ids:
            word = self.vocab[token_id] if 0 <= token_id < len(self.vocab) else UNK
            if word == NEWLINE:
                parts.append("\n")
                glue_next = True
                continue
            if skip_special_tokens and word in SPECIAL_TOKENS:
                continue
            is_punct = word in PUNCTUATION
            if parts and not glue_next and not is_punct:
                parts.append(" ")
            parts.append(word)
            glue_next = is_punct
        return "".join(parts).strip(" ")

    def encode_message(self, role: str, content: str, *, end_of_turn: bool = False) -> list[int]:
        """One message as the chat template writes it: role marker + content (+ ``<eos>``)."""
        if role not in self.role_ids:
            raise ValueError(f"unknown chat role {role!r}; expected one of {sorted(ROLE_MARKERS)}")
        ids = [self.role_ids[role], *self.encode(content)]
        if end_of_turn:
            ids.append(self.eos_id)
        return ids

    def apply_chat_template(
        self,
        messages: Sequence[ChatMessage | Mapping[str, str]],
        *,
        add_generation_prompt: bool = True,
    ) -> list[int]:
        """The whole conversation as ids (HF-style name, so the rollout code reads the same
        for both tokenizers)."""
        ids = [self.bos_id]
        for message in messages:
            msg = message if isinstance(message, ChatMessage) else ChatMessage(**message)
            ids += self.encode_message(msg.role, msg.content, end_of_turn=msg.role == "assistant")
        if add_generation_prompt:
            ids.append(self.role_ids["assistant"])
        return ids


_DEFAULT: WordTokenizer | None = None


def get_tokenizer() -> WordTokenizer:
    """The process-wide tokenizer instance (the vocabulary is fixed, so one is enough)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = WordTokenizer()
    return _DEFAULT
