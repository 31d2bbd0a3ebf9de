"""``agentrl model create``: make a small HF-format model here (:mod:`agentrl.trainer.hf_model`)."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def model() -> None:
    """Model tools: make a small Qwen3-architecture model in HF format, nothing downloaded."""


@model.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", default=0, show_default=True, type=int, help="Initial weights' seed.")
@click.option(
    "--preset",
    default="mini",
    show_default=True,
    type=click.Choice(["mini", "small"]),
    help="Model size (agentrl.trainer.hf_model.PRESETS).",
)
def create(directory: Path, seed: int, preset: str) -> None:
    """Write a Qwen3 model with random weights, the project's tokenizer and its tool-calling
    chat template into DIRECTORY (config.json, model.safetensors, generation_config.json,
    tokenizer files): a directory AutoModelForCausalLM and AutoTokenizer load."""
    from agentrl.trainer import hf_model

    out = hf_model.create_model(directory, seed=seed, preset=preset)
    params = sum(p.numel() for p in hf_model.load_causal_lm(out).parameters())
    click.echo(f"{out}: Qwen3ForCausalLM, preset {preset}, {params:,} parameters, seed {seed}")
