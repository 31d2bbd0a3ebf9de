"""The operator names itself to its kopf peers without the password database: an image's
numeric USER (or a uid the cluster assigns) has no /etc/passwd entry, and kopf's default
identity (``getpass.getuser()``) then raises at start. Found on the real node: the chart's
operator pod crash-looped with ``getpwuid(): uid not found: 65532``."""

from __future__ import annotations

import os
import pwd
import socket

import pytest
from kopf._core.engines import peering

from agentrl.controller.cli import peering_identity


@pytest.fixture
def uid_without_passwd_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    def getpwuid(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", getpwuid)
    for var in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.usefixtures("uid_without_passwd_entry")
def test_kopfs_default_identity_fails_where_ours_does_not() -> None:
    with pytest.raises(KeyError, match="uid not found"):
        peering.detect_own_id(manual=False)
    assert peering_identity() == f"{socket.gethostname()}/{os.getpid()}"
