"""The warm-start path on the real model format, end to end up to the optimizer: expert traces of
the toy tasks (scripted solver, real tool-call syntax, real sandboxes) → read and rendered with
the rollout's own template and tools of the Qwen3 model made here → packed → SFT steps of the
torch backend.

Independent checks: what the mask trains is, decoded, exactly the assistant turns the chat
template writes for the trace's assistant messages (rendered alone by transformers); the loss
falls on the traces it trains on."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from agentrl.api.trainer import TrainerSpec
from agentrl.rollout.caps import EpisodeCaps
from agentrl.rollout.conversations import read_warm_start
from agentrl.rollout.hf_tokenizer import load_hf_turn_tokenizer
from agentrl.rollout.swe_tools import tool_schemas
from agentrl.rollout.tasks.toy import generate_toy_tasks
from agentrl.rollout.tasks.traces import write_traces
from agentrl.rollout.toolcalls import get_parser
from agentrl.sandbox.local import LocalProvider
from agentrl.trainer import hf_model
from agentrl.trainer.sft_batches import epoch_batches
from agentrl.trainer.torch_backend import TorchBackend


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_model.create_model(tmp_path_factory.mktemp("qwen3") / "model", seed=0)


async def test_traces_of_the_toy_tasks_warm_the_model_up(model_dir: Path, tmp_path: Path) -> None:
    tasks = [t for t in generate_toy_tasks(0) if t.id.startswith("toy-stats-")][:3]
    traces = tmp_path / "traces.jsonl"
    report = await write_traces(
        tasks,
        LocalProvider(base_dir=str(tmp_path)),
        get_parser("qwen25"),
        EpisodeCaps(max_turns=12, tool_timeout_seconds=60, verifier_timeout_seconds=60),
        traces,
    )
    assert report.written == 3
    turns = load_hf_turn_tokenizer(str(model_dir), tools=tool_schemas(), tool_call_parser="qwen25")
    read = read_warm_start(traces, turns, tokens_per_batch=8192)
    assert read.errors == []
    assert [c.line for c in read.conversations] == [1, 2, 3]

    # what is trained is the template's own text of each assistant turn, end token included
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    first = read.conversations[0]
    trained = tok.decode([t for t, m in zip(first.token_ids, first.loss_mask, strict=True) if m])
    whole = tok.decode(first.token_ids)
    assistant_turns = [
        part.split("<|im_end|>")[0] + "<|im_end|>"
        for part in whole.split("<|im_start|>assistant\n")[1:]
    ]
    assert len(assistant_turns) == 5
    assert trained == "".join(assistant_turns)
    assert '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>' in trained

    backend = TorchBackend(
        hf_model.load_causal_lm(model_dir),
        TrainerSpec(backend="torch", gpus_per_node=0),
        temperature=1.0,
        source=model_dir,
    )
    losses = []
    for epoch in range(4):
        for batch in epoch_batches(read.conversations, tokens_per_batch=8192, seed=0, epoch=epoch):
            assert batch.tokens <= 8192
            losses.append(backend.sft_step(batch, lr=3e-3).loss)
    assert losses[-1] < 0.8 * losses[0]
