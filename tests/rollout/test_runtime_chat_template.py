"""``spec.model.chatTemplate.configMapKeyRef`` in the rollout: the runtime reads the template
from the directory the operator mounts the ConfigMap at (``wire.CHAT_TEMPLATE_MOUNT_PATH``),
laid out as the kubelet lays out a ConfigMap volume (a timestamped directory, ``..data``
pointing at it, and the key as a link into ``..data``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agentrl.api.job import AgentRLJobSpec
from agentrl.api.wire import CHAT_TEMPLATE_MOUNT_PATH
from agentrl.engine_client.client import ModelInfo
from agentrl.rollout import runtime
from agentrl.rollout.hf_model_files import write_tokenizer_files
from agentrl.rollout.hf_tokenizer import HFTurnTokenizer, TokenizerConfigError
from agentrl.rollout.runtime import open_episode_runner, turn_tokenizer_for
from agentrl.sandbox.fake import FakeProvider
from tests.rollout.fakes import ScriptedEngine

KEY = "template.jinja"
#: The XML tool list of the Qwen3-Coder template (the model directory's own template is the
#: JSON one, which writes a ``<tools>`` block of JSON schemas instead).
XML_TOOL_LIST = "<function>\n<name>str_replace_editor</name>"
JSON_TOOL_LIST = '{"type": "function", "function": {"name": "bash"'
TEMPLATES = Path(__file__).resolve().parents[2] / "operator/agentrl/rollout/chat_templates"


def kubelet_config_map_dir(root: Path, data: dict[str, str]) -> Path:
    """A ConfigMap volume as the kubelet writes it (atomic writer): the files in a timestamped
    directory, ``..data`` a link to it, and each key a link to ``..data/KEY``."""
    root.mkdir()
    stamped = root / "..2026_12_04_17_00_00.000000001"
    stamped.mkdir()
    for key, text in data.items():
        (stamped / key).write_text(text)
    (root / "..data").symlink_to(stamped.name)
    for key in data:
        (root / key).symlink_to(f"..data/{key}")
    return root


def _spec(model_dir: Path) -> AgentRLJobSpec:
    return AgentRLJobSpec.model_validate(
        {
            "model": {
                "source": {"path": str(model_dir)},
                "chatTemplate": {"configMapKeyRef": {"name": "templates", "key": KEY}},
                "toolCallParser": "qwen3_coder",
            },
            "sandbox": {"provider": "local", "concurrency": 1},
        }
    )


def _setup(tmp_path: Path) -> tuple[Path, Path]:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    write_tokenizer_files(model_dir, template="qwen3-instruct")
    coder = (TEMPLATES / "qwen3-coder.jinja").read_text()
    mounted = kubelet_config_map_dir(tmp_path / "mount", {KEY: coder})
    return model_dir, mounted


class _InfoEngine(ScriptedEngine):
    """An engine that reports ``tokenizer_path`` (``/get_model_info``) and can be closed."""

    def __init__(self, url: str, tokenizer_path: str, **_: Any) -> None:
        super().__init__(["unused"], base_url=url)
        self.tokenizer_path = tokenizer_path

    async def get_model_info(self) -> ModelInfo:
        return ModelInfo(model_path=self.tokenizer_path, tokenizer_path=self.tokenizer_path)

    async def close(self) -> None:
        pass


async def test_the_template_is_read_from_a_config_map_volume_as_the_kubelet_lays_it_out(
    tmp_path: Path,
) -> None:
    model_dir, mounted = _setup(tmp_path)
    engine = _InfoEngine("http://e", str(model_dir))
    picked = await turn_tokenizer_for(
        engine,  # type: ignore[arg-type]
        _spec(model_dir),
        config_map_dir=str(mounted),
    )
    assert isinstance(picked, HFTurnTokenizer)
    prompt = picked.decode(picked.initial_ids("s", "u"))
    assert XML_TOOL_LIST in prompt
    assert JSON_TOOL_LIST not in prompt


async def test_the_template_is_not_read_when_the_config_map_is_not_mounted(
    tmp_path: Path,
) -> None:
    model_dir, _ = _setup(tmp_path)
    engine = _InfoEngine("http://e", str(model_dir))
    with pytest.raises(TokenizerConfigError, match=r"configMapKeyRef templates/template\.jinja"):
        await turn_tokenizer_for(
            engine,  # type: ignore[arg-type]
            _spec(model_dir),
            config_map_dir=str(tmp_path / "absent"),
        )


async def test_the_episode_runner_reads_the_template_at_the_operators_mount_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pods mount the ConfigMap at the wire's path; here that path is a temporary directory.
    assert CHAT_TEMPLATE_MOUNT_PATH == "/etc/agentrl-chat-template"
    model_dir, mounted = _setup(tmp_path)
    monkeypatch.setattr(runtime, "CHAT_TEMPLATE_MOUNT_PATH", str(mounted))

    def client(url: str, **kwargs: Any) -> _InfoEngine:
        return _InfoEngine(url, str(model_dir), **kwargs)

    async with open_episode_runner(
        _spec(model_dir),
        provider=FakeProvider(),
        engine_urls=["http://engine-0"],
        pool_size=4,
        engine_client=client,
    ) as runner:
        tokenizer = runner.agent.tokenizer
        assert isinstance(tokenizer, HFTurnTokenizer)
        assert XML_TOOL_LIST in tokenizer.decode(tokenizer.initial_ids("s", "u"))
