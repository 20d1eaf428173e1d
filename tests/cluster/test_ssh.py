"""Reaching a node over real SSH: the probe runs through an OpenSSH server (on 127.0.0.2, which is not
"this machine" to sparkctl), a refused key and a stopped sshd each end in one line saying which and the fix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fake_sysfs import spark
from sshd import Sshd, sshd_missing, start_sshd

from sparkctl.cluster.nodes import Node, NodeAuthRefused, NodeUnreachable, parse_node
from sparkctl.cluster.probe import probe

pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(sshd_missing()), reason=sshd_missing() or "")]
ADDRESS = "127.0.0.2"


@pytest.fixture(scope="module")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    server = start_sshd(tmp_path_factory.mktemp("sshd"), address=ADDRESS)
    yield server
    server.stop()


def worker(port: int, root: Path | None = None) -> Node:
    node = parse_node(f"root@{ADDRESS}:{port}")
    assert not node.is_local
    return Node(node.address, node.host, node.user, node.port, sysroot=str(root or ""))


def test_probe_over_ssh(sshd: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts())
    facts = probe(worker(sshd.port, spark(tmp_path)))
    assert facts.ib_netdevs["rocep1s0f1"] == ["lo"]
    assert facts.gids["rocep1s0f1"][3].startswith("0000:0000:0000:0000:0000:ffff:")
    assert "127.0.0.1" in facts.addresses["lo"]


def test_a_refused_key_is_auth_refused(sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", sshd.opts(sshd.other_key))
    node = worker(sshd.port)
    with pytest.raises(NodeAuthRefused, match=f"node {node.address}: SSH refused the login") as err:
        probe(node)
    assert f"ssh-copy-id -p {sshd.port} root@{ADDRESS}" in (err.value.hint or "")


def test_a_stopped_sshd_is_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = start_sshd(tmp_path / "gone", address=ADDRESS)
    server.stop()
    monkeypatch.setenv("SPARKCTL_SSH_OPTS", server.opts())
    node = worker(server.port)
    with pytest.raises(
        NodeUnreachable, match=f"node {node.address} unreachable over SSH: .*Connection refused"
    ):
        probe(node)
