"""A small Hugging Face tokenizer made here, for local models that act through a real chat
template: nothing is downloaded.

:func:`build_tokenizer` trains a byte-level BPE (the ``tokenizers`` library) on a small built-in
corpus of shell, Python, JSON and tool-call text, with the ChatML and tool-use markers as added
tokens (:data:`SPECIAL_TOKENS`: ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, special, so
decoding with ``skip_special_tokens`` drops them; :data:`MARKUP_TOKENS`: ``<tool_call>``,
``</tool_call>``, ``<think>``, ``</think>``, ``<tool_response>``, ``</tool_response>``, not
special, so a decoded reply keeps its tool-call tags for the parser, as Qwen's tokenizers do),
and wraps it as a ``transformers`` fast tokenizer with a bundled chat template
(:mod:`agentrl.rollout.chat_templates`). :func:`write_tokenizer_files` saves it with
``save_pretrained`` (``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``), a
directory ``AutoTokenizer.from_pretrained`` reloads, also beside a Qwen3 ``config.json``.

Training is deterministic: the same corpus and vocabulary size give the same ids.

Callers: tests, ``bench/chat_format.py``; the local small Qwen3-architecture model writes its
tokenizer files with :func:`write_tokenizer_files`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.api.model import BundledChatTemplate
from agentrl.rollout.chat_templates import bundled_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

#: Special tokens, in id order from 0: padding/document end, turn start, turn end (eos).
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
#: Markup the templates write and models generate, one token each, kept when decoding.
MARKUP_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "<tool_response>",
    "</tool_response>",
)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
DEFAULT_VOCAB_SIZE = 1024
#: How text is cut before BPE merges (the split Qwen2/Qwen3 tokenizers use): letters with one
#: leading non-letter, single digits, punctuation runs, and every run of whitespace that ends in
#: newlines as one piece. The last matters for turn-by-turn ids: a generation prompt that ends
#: in newlines (``</think>\n\n``) tokenises the same alone as before the reply that follows.
PRETOKENIZE_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

#: What the BPE merges are learned from: the kinds of text agent episodes hold.
CORPUS: tuple[str, ...] = (
    "You are a software engineer fixing a bug in a repository.",
    "Make the failing test pass, then submit. Work one tool call at a time.",
    "# Tools\n\nThese functions are available to you.",
    '{"type": "function", "function": {"name": "bash", "description": "Run a shell command.", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}}, '
    '"required": ["command"]}}}',
    '{"name": "str_replace_editor", "arguments": {"command": "str_replace", "path": '
    '"/repo/app.py", "old_str": "return 1", "new_str": "return 2"}}',
    "<function=bash>\n<parameter=command>\nls -la /repo\n</parameter>\n</function>",
    "<parameter=path>\n/repo/src/module.py\n</parameter>",
    "cat <<'EOF' > /repo/fix.py\nimport os\nprint(os.getcwd())\nEOF",
    "def value(self):\n    return self._value\n\n\nclass Config:\n    name = 'default'\n",
    "import json\nfrom pathlib import Path\n\nfor line in Path('data.txt').read_text().split():",
    "grep -rn 'def parse' src/ | head -20 && python -m pytest -q tests/test_app.py -x",
    "PASSED tests/test_app.py::test_value FAILED tests/test_app.py::test_other - AssertionError",
    'Traceback (most recent call last):\n  File "app.py", line 3, in <module>\nValueError',
    "[exit code 0] [exit code 1] stdout stderr error warning result observation",
    "Let me look at the file first. I will run the tests to see what fails.",
    "The test expects 2 but the function returns 1. I need to change the return value.",
    "system user assistant tool reasoning thought submit view create insert undo_edit",
    "0 1 2 3 4 5 6 7 8 9 10 100 true false null [] {} () <> == != += -> => ::",
)


def build_tokenizer(
    *,
    template: BundledChatTemplate | str = BundledChatTemplate.QWEN3_INSTRUCT,
    chat_template: str | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    corpus: tuple[str, ...] = CORPUS,
) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``corpus`` with the ChatML and tool markers, whose
    chat template is ``chat_template`` or else the bundled ``template``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    model.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    model.train_from_iterator(corpus, trainer)
    model.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=model,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=chat_template or bundled_template(template),
    )


def write_tokenizer_files(
    directory: str | Path,
    *,
    template: BundledChatTemplate | str = BundledChatTemplate.QWEN3_INSTRUCT,
    chat_template: str | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
) -> Path:
    """Save :func:`build_tokenizer`'s tokenizer into ``directory`` (created if absent): the
    tokenizer files of a model directory. Returns the directory."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(
        template=template, chat_template=chat_template, vocab_size=vocab_size
    ).save_pretrained(out)
    return out
