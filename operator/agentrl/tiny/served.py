"""What the CPU engine (:mod:`agentrl.tiny.server`) serves: a model behind one small interface.

The engine's scheduler, routes, metrics, faults and weight updates are one implementation; the
model is a :class:`ServedModel`: its vocabulary and end-of-sequence ids, the next-token logits
of a batch of running requests, decoding ids to text, loading new weights, and what
``/model_info`` says of it. Two kinds:

* :class:`TinyServed`: the built-in tiny policy (:mod:`agentrl.tiny.policy`) with its word
  tokenizer; its per-request state is the context scanner the policy's features come from.
* :class:`HFServed`: any Hugging Face causal LM directory (``config.json`` and safetensors, a
  tokenizer beside them), run by ``transformers`` on CPU in float32. Each request keeps its own
  KV cache: the prompt is prefilled once, then every decode step feeds one token.
  ``/model_info``'s ``tokenizer_path`` is the directory, from which the rollout loads the
  tokenizer and chat template (:func:`agentrl.rollout.runtime.turn_tokenizer_for`).

Callers: :mod:`agentrl.tiny.server`.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import torch

from agentrl.tiny import policy as tiny
from agentrl.tiny.tokenizer import TOKENIZER_NAME, get_tokenizer

#: ``config.json`` fields a weight update must agree on (else it is refused naming the field).
SHAPE_FIELDS = (
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "num_experts",
    "num_local_experts",
    "moe_intermediate_size",
    "tie_word_embeddings",
)


class ServedModel(Protocol):
    """A model the engine decodes with."""

    module: torch.nn.Module
    """The weights (``/update_weights_from_distributed`` writes into its parameters)."""
    vocab_size: int
    eos_ids: frozenset[int]
    tokenizer_path: str
    model_type: str
    architectures: list[str]
    max_context: int | None
    """The model's own context limit (None: none)."""

    def probe_ids(self) -> list[int]:
        """A prompt for ``/health_generate``."""
        ...

    def new_state(self, prompt: Sequence[int]) -> Any:
        """Per-request decoding state for ``prompt``."""
        ...

    def push(self, state: Any, position: int, token: int) -> None:
        """``token`` was sampled at ``position``."""
        ...

    def next_logits(self, batch: Sequence[tuple[Any, Sequence[int]]]) -> torch.Tensor:
        """``[len(batch), vocab]`` logits of the next token of each ``(state, ids)``."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def load_weights(self, path: str) -> None:
        """Load the weights at ``path``; a different shape raises ValueError naming it."""
        ...


class TinyServed:
    """The tiny policy and its word tokenizer."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module
        self.tokenizer_path = TOKENIZER_NAME
        self.model_type = "agentrl-tiny"
        self.architectures = ["TinyPolicy"]
        self.max_context: int | None = None
        self.tokenizer = get_tokenizer()
        self.vocab_size = self.tokenizer.vocab_size
        self.eos_ids = frozenset({self.tokenizer.eos_id})

    def probe_ids(self) -> list[int]:
        return [self.tokenizer.bos_id, self.tokenizer.role_ids["assistant"]]

    def new_state(self, prompt: Sequence[int]) -> tiny.ContextScanner:
        scanner = tiny.ContextScanner(self.tokenizer)
        for pos, token in enumerate(prompt):
            scanner.push(pos, token)
        return scanner

    def push(self, state: tiny.ContextScanner, position: int, token: int) -> None:
        state.push(position, token)

    def next_logits(self, batch: Sequence[tuple[Any, Sequence[int]]]) -> torch.Tensor:
        rows = tiny.StepFeatures(obs_ids=[], prev_ids=[], positions=[], own_ids=[])
        for scanner, ids in batch:
            obs, turn_pos = scanner.context(len(ids))
            rows.obs_ids.append(list(obs))
            rows.own_ids.append(scanner.memory())
            rows.prev_ids.append(ids[-1])
            rows.positions.append(turn_pos)
        with torch.no_grad():
            logits: torch.Tensor = self.module(rows)
        return logits

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def load_weights(self, path: str) -> None:
        new = tiny.load_policy(path)
        if new.config != self.module.config:  # type: ignore[union-attr]
            raise ValueError(f"{path}: shape {new.config} differs from the served model")
        self.module.load_state_dict(new.state_dict())


def is_hf_model_dir(path: str | Path) -> bool:
    """Whether ``path`` is an HF model directory: a ``config.json`` with a ``model_type`` (the
    tiny policy's own ``config.json`` has none)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return False
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "model_type" in data


class _HFState:
    """One request's KV cache and how many of its ids are in it."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.cached = 0


class HFServed:
    """A Hugging Face causal LM directory on CPU (float32)."""

    def __init__(self, directory: str | Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.directory = Path(directory)
        self.tokenizer_path = str(self.directory)
        self.module = AutoModelForCausalLM.from_pretrained(
            self.tokenizer_path, dtype=torch.float32, local_files_only=True
        ).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path, local_files_only=True)
        config = self.module.config
        self.config = _config_dict(self.directory)
        self.vocab_size = int(config.vocab_size)
        self.model_type = str(config.model_type)
        self.architectures = list(config.architectures or [type(self.module).__name__])
        self.max_context = getattr(config, "max_position_embeddings", None)
        eos: set[int] = set()
        for source in (self.module.generation_config.eos_token_id, self.tokenizer.eos_token_id):
            if isinstance(source, int):
                eos.add(source)
            elif source:
                eos.update(int(i) for i in source)
        if isinstance(config.eos_token_id, int):  # SGLang adds config.json's too
            eos.add(config.eos_token_id)
        elif config.eos_token_id:
            eos.update(int(i) for i in config.eos_token_id)
        self.eos_ids = frozenset(eos)
        # transformers 5 names the KV cache argument and output ``cache`` (4.x:
        # ``past_key_values``, deprecated in 5 with a warning)
        forward = inspect.signature(self.module.forward).parameters
        self._cache_arg = "cache" if "cache" in forward else "past_key_values"

    def probe_ids(self) -> list[int]:
        ids = self.tokenizer.encode("ok", add_special_tokens=False)
        return list(ids) or [min(self.eos_ids, default=0)]

    def new_state(self, prompt: Sequence[int]) -> _HFState:
        return _HFState()

    def push(self, state: _HFState, position: int, token: int) -> None:
        """Nothing to do: the next step feeds the new token into the cache."""

    def next_logits(self, batch: Sequence[tuple[Any, Sequence[int]]]) -> torch.Tensor:
        from transformers import DynamicCache

        rows = []
        with torch.no_grad():
            for state, ids in batch:
                if state.cache is None:
                    state.cache = DynamicCache()
                new = torch.tensor([list(ids[state.cached :])], dtype=torch.long)
                out = self.module(
                    input_ids=new, use_cache=True, **{self._cache_arg: state.cache}
                )
                state.cache = out[self._cache_arg]
                state.cached = len(ids)
                rows.append(out.logits[0, -1])
        return torch.stack(rows)

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=True)
        return text

    def load_weights(self, path: str) -> None:
        from safetensors.torch import load_file

        new = _config_dict(Path(path))
        differ = [
            f"{f}: served {self.config.get(f)!r}, {path} has {new.get(f)!r}"
            for f in SHAPE_FIELDS
            if self.config.get(f) != new.get(f)
        ]
        if differ:
            raise ValueError(
                f"{path}/config.json differs from the served model: {'; '.join(differ)}"
            )
        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise ValueError(f"{path}: no *.safetensors weights")
        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        params = self.module.state_dict()
        unknown = [n for n in state if n not in params]
        if unknown:
            raise ValueError(f"{path}: weights the served model does not have: {unknown[:5]}")
        missing = [
            n for n in params if n not in state and not (n == "lm_head.weight" and self._tied)
        ]
        if missing:
            raise ValueError(f"{path}: weights missing for {missing[:5]}")
        self.module.load_state_dict(state, strict=False)

    @property
    def _tied(self) -> bool:
        return bool(self.config.get("tie_word_embeddings", False))


def _config_dict(directory: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return data
