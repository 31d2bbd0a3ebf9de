"""The ``agentrl`` command line.

Every verb lives in the package that implements it and is imported only when it runs
(``LazyGroup``), so ``agentrl --help`` and ``agentrl validate`` never pay for torch, ray or kopf.
To add a verb, add one line to ``COMMANDS`` naming ``module:attribute`` of a click command.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from agentrl import __version__

#: verb -> "module:attribute" of a click.Command, imported on first use.
COMMANDS: dict[str, str] = {
    "dev": "agentrl.devcluster.cli:dev",
    "validate": "agentrl.sim.cli:validate",
    "crds": "agentrl.api.cli:crds",
    "docs": "agentrl.api.cli:docs",
    "render": "agentrl.reconcile.cli:render",
    "operator": "agentrl.controller.cli:operator",
    "run": "agentrl.local.cli:run",
    "plan": "agentrl.sim.cli:plan",
    "engine": "agentrl.engine.cli:engine",
    "tasks": "agentrl.rollout.tasks.cli:tasks",
    "trainer": "agentrl.trainer.cli:trainer",
    "model": "agentrl.trainer.model_cli:model",
    "ray": "agentrl.ray_cluster.cli:ray",
}

#: One-line help shown by ``agentrl --help`` without importing the verb.
SHORT_HELP: dict[str, str] = {
    "dev": "Local development tools: a real Kubernetes control plane with simulated GPU nodes.",
    "validate": "Check AgentRLJob manifests offline: the API server's rules, trainer memory.",
    "crds": "Print or write the CustomResourceDefinition generated from the models.",
    "docs": "Write the manifest reference generated from the models.",
    "render": "Print the Kubernetes objects the operator would create for a manifest.",
    "operator": "Run the operator (kopf) against the current kubeconfig.",
    "run": "Run an AgentRLJob manifest on this machine (local engine, sandboxes, trainer).",
    "plan": "Capacity plan and rollout simulation for a manifest.",
    "engine": "Engine tools: launch SGLang, the GPU watchdog, the tiny CPU engine.",
    "tasks": "Dataset tools: generate the bundled toy tasks, validate a dataset.",
    "trainer": "Run the job's GRPO trainer (the trainer pod's entry point).",
    "model": "Model tools: make a small Qwen3 model in HF format here (nothing downloaded).",
    "ray": "This pod's Ray node: join the job's head and follow it (rollout worker pods).",
}


class LazyGroup(click.Group):
    """A click group whose sub-commands are imported when first invoked."""

    def __init__(self, *args: Any, lazy: dict[str, str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy = lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self._lazy:
            module_name, attr = self._lazy[cmd_name].split(":")
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name and exc.name.startswith("agentrl"):
                    return None
                missing = exc.name or "a dependency"
                raise click.ClickException(
                    f"'agentrl {cmd_name}' needs {missing}, which is not installed. "
                    "Install the extra it belongs to, e.g. pip install 'agentrl[local]'."
                ) from exc
            command = getattr(module, attr)
            assert isinstance(command, click.Command)
            return command
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, SHORT_HELP.get(name, "")) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _print_version(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if not value or ctx.resilient_parsing:
        return
    from agentrl.api.wire import WIRE_VERSION  # only here: ``agentrl --help`` stays cheap

    click.echo(f"agentrl {__version__} (wire contract {WIRE_VERSION})")
    ctx.exit()


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--version",
    is_flag=True,
    expose_value=False,
    is_eager=True,
    callback=_print_version,
    help="Show the version and the wire contract version (operator and images must be at most "
    "one minor version of it apart), then exit.",
)
def main() -> None:
    """agentrl: agentic RL jobs on Kubernetes clusters of AMD Instinct GPUs.

    The same AgentRLJob manifest runs on a cluster (kubectl apply, with the operator
    installed by the Helm chart) and on this machine (agentrl run).
    """


if __name__ == "__main__":
    main()
