"""The CPU engine serving a Hugging Face causal LM directory (the Qwen3 model made here), through
the same routes as the tiny policy: generation with output ids and logprobs, ``/model_info``,
weight reloads from what the torch backend exports.

References are independent of the engine: transformers' own ``generate`` for greedy decoding,
one plain forward over prompt + output for every logprob, the trainer's recomputation after a
reload."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import torch
from aiohttp.test_utils import TestServer
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl.api.trainer import TrainerSpec
from agentrl.tiny import policy as tiny
from agentrl.tiny.served import HFServed, is_hf_model_dir
from agentrl.tiny.server import TinyEngine, build_app
from agentrl.trainer import hf_model
from agentrl.trainer.torch_backend import TorchBackend


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_model.create_model(tmp_path_factory.mktemp("qwen3") / "model", seed=0)


@pytest.fixture
async def served(model_dir: Path) -> AsyncIterator[tuple[TinyEngine, str]]:
    hf = HFServed(model_dir)
    engine = TinyEngine(hf.module, served=hf, model_path=str(model_dir), context_length=8192)
    server = TestServer(build_app(engine), host="127.0.0.1")
    await server.start_server()
    try:
        yield engine, str(server.make_url("")).rstrip("/")
    finally:
        await server.close()


def _prompt(model_dir: Path) -> list[int]:
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ids: list[int] = tok.apply_chat_template(
        [{"role": "user", "content": "Fix the failing test."}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    return list(ids)


async def _generate(url: str, ids: list[int], **sampling: object) -> dict:  # type: ignore[type-arg]
    body = {"input_ids": ids, "sampling_params": sampling, "return_logprob": True}
    async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()  # type: ignore[no-any-return]


async def _update(url: str, body: dict[str, str]) -> dict:  # type: ignore[type-arg]
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/update_weights_from_disk", json=body) as r,
    ):
        return await r.json()  # type: ignore[no-any-return]


def _reference(directory: Path, ids: list[int], start: int, t: float) -> list[float]:
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0] / t, dim=-1)
    return [float(logp[j - 1, ids[j]]) for j in range(start, len(ids))]


def test_a_tiny_policy_directory_is_not_taken_for_an_hf_model(
    model_dir: Path, tmp_path: Path
) -> None:
    assert is_hf_model_dir(model_dir)
    assert not is_hf_model_dir(tiny.save_policy(tiny.new_policy(0, dim=8), tmp_path / "tiny"))


async def test_greedy_decoding_is_transformers_own(served, model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    _, url = served
    prompt = _prompt(model_dir)
    raw = await _generate(url, prompt, max_new_tokens=12, temperature=0.0)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    want = model.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False)
    assert raw["output_ids"] == want[0, len(prompt) :].tolist()
    assert raw["meta_info"]["prompt_tokens"] == len(prompt)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_every_logprob_is_the_models_at_the_sampling_temperature(  # type: ignore[no-untyped-def]
    served, model_dir: Path, temperature: float
) -> None:
    _, url = served
    prompt = _prompt(model_dir)
    raw = await _generate(url, prompt, max_new_tokens=16, temperature=temperature)
    out = raw["output_ids"]
    got = [e[0] for e in raw["meta_info"]["output_token_logprobs"]]
    want = _reference(model_dir, prompt + out, len(prompt), temperature)
    assert len(got) == len(out) > 0
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-4


async def test_generation_stops_at_the_end_of_turn_token(served, model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    engine, url = served
    end = AutoTokenizer.from_pretrained(str(model_dir)).convert_tokens_to_ids("<|im_end|>")
    bias = torch.zeros(engine.served.vocab_size)
    bias[end] = 100.0  # the end of turn becomes the only likely token
    hook = engine.model.lm_head.register_forward_hook(lambda _m, _i, out: out + bias)
    try:
        raw = await _generate(url, _prompt(model_dir), max_new_tokens=8, temperature=1.0)
    finally:
        hook.remove()
    assert raw["output_ids"] == [end]
    assert raw["meta_info"]["finish_reason"] == {"type": "stop", "matched": end}


async def test_model_info_points_the_rollout_at_the_tokenizer_and_template(  # type: ignore[no-untyped-def]
    served, model_dir: Path
) -> None:
    _, url = served
    async with aiohttp.ClientSession() as s, s.get(url + "/model_info") as r:
        info = await r.json()
    assert info["model_type"] == "qwen3"
    assert info["architectures"] == ["Qwen3ForCausalLM"]
    tok = AutoTokenizer.from_pretrained(info["tokenizer_path"])
    assert "<tool_call>" in tok.chat_template
    async with aiohttp.ClientSession() as s, s.get(url + "/health_generate") as r:
        assert r.status == 200


async def test_an_id_outside_the_vocabulary_is_a_400(served, model_dir: Path) -> None:  # type: ignore[no-untyped-def]
    engine, url = served
    body = {"input_ids": [1, engine.served.vocab_size], "sampling_params": {"max_new_tokens": 1}}
    async with aiohttp.ClientSession() as s, s.post(url + "/generate", json=body) as r:
        assert r.status == 400
        assert "outside the vocabulary" in await r.text()


async def test_weights_the_trainer_exports_reload_with_its_logprobs(  # type: ignore[no-untyped-def]
    served, model_dir: Path, tmp_path: Path
) -> None:
    """Export → /update_weights_from_disk → the engine's logprobs are the trainer's."""
    from agentrl.trainer.batching import TrainSample
    from tests.trainer.factories import make_trajectory

    _, url = served
    backend = TorchBackend(
        hf_model.load_causal_lm(model_dir),
        TrainerSpec(backend="torch", gpus_per_node=0, optimizer={"lr": 0.05}),
        temperature=1.0,
        source=model_dir,
    )
    ids = [*_prompt(model_dir), 40, 41, 42]
    mask = [0] * (len(ids) - 3) + [1, 1, 1]
    t = make_trajectory("a#0", 1.0, tokens=(ids, [-1.0 if m else 0.0 for m in mask], mask))
    backend.train_step([TrainSample(trajectory=t, advantage=1.0, carries_loss=True)])
    backend.export_weights(tmp_path / "step-1")
    body = {"model_path": str(tmp_path / "step-1"), "weight_version": "1"}
    assert (await _update(url, body))["success"] is True
    prompt = _prompt(model_dir)
    raw = await _generate(url, prompt, max_new_tokens=12, temperature=1.0)
    assert raw["meta_info"]["weight_version"] == "1"
    out = raw["output_ids"]
    with torch.no_grad():
        trainer = hf_model.token_logprobs(
            backend.model, [(prompt + out, [(len(prompt), len(prompt) + len(out))])]
        )[0]
    got = torch.tensor([e[0] for e in raw["meta_info"]["output_token_logprobs"]])
    assert torch.allclose(got, trainer, atol=1e-4)
    # and they are not the initial model's any more
    start = torch.tensor(_reference(model_dir, prompt + out, len(prompt), 1.0))
    assert not torch.allclose(got, start, atol=1e-4)


async def test_a_model_of_another_shape_is_refused_and_the_old_one_serves(  # type: ignore[no-untyped-def]
    served, model_dir: Path, tmp_path: Path
) -> None:
    _, url = served
    prompt = _prompt(model_dir)
    before = await _generate(url, prompt, max_new_tokens=8, temperature=0.0)
    other = hf_model.create_model(tmp_path / "small", preset="small")
    body = {"model_path": str(other), "weight_version": "9"}
    answer = await _update(url, body)
    assert answer["success"] is False
    assert "hidden_size: served 64" in answer["message"]
    after = await _generate(url, prompt, max_new_tokens=8, temperature=0.0)
    assert after["output_ids"] == before["output_ids"]
    assert after["meta_info"]["weight_version"] == before["meta_info"]["weight_version"]
