"""The API server's own refusals of what the runtime would refuse or crash on (parallel
layouts, managed engine flags, labels): each names the field and says, word for word, what
``agentrl validate`` says — the CEL ``messageExpression`` and the Python message are one text."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from tests.api.cases import BASE, merge
from tests.api.test_runtime_rules import RULE_CASES

from agentrl.devcluster.testing import Kubectl

pytestmark = [pytest.mark.apiserver, pytest.mark.usefixtures("crd_installed")]


@pytest.mark.parametrize(("patch", "path", "message"), RULE_CASES)
def test_the_api_server_refuses_with_the_same_words_as_validate(
    kubectl: Kubectl, patch: dict[str, Any], path: str, message: str
) -> None:
    manifest = merge(BASE, {"spec": patch})
    proc = kubectl.run(
        "create", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump(manifest), check=False
    )
    assert proc.returncode != 0, "the API server accepted it"
    assert path in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr
