"""Each node's environment from its own sysfs: the probe script runs for real against a tree laid out
like a Spark's /sys (the interface is named `lo` so the real `ip` reports an address for it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_sysfs import V2, ZERO, make_node, spark, v4_gid

from sparkctl.cluster.netenv import PER_NODE_VARS, resolve_network
from sparkctl.cluster.nodes import Node
from sparkctl.cluster.probe import probe
from sparkctl.recipe.schema import ClusterSpec

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow


def at(root: Path, name: str = "localhost") -> Node:
    """This machine, with its files read from `root`."""
    return Node(address=name, host="localhost", sysroot=str(root))


def test_probe_reads_the_tree_like_ibdev2netdev(tmp_path: Path) -> None:
    facts = probe(at(spark(tmp_path)))
    assert facts.ib_netdevs == {
        "rocep1s0f1": ["lo"],
        "roceP2p1s0f1": ["enP2lo"],
        "rocep1s0f0": ["enp1s0f0np0"],
    }
    assert facts.netdevs["lo"].operstate == "up" and facts.netdevs["lo"].mtu == 9000
    assert facts.gids["rocep1s0f1"][3] == v4_gid("127.0.0.1")
    assert facts.gid_types["rocep1s0f1"][3] == V2
    assert facts.gids["rocep1s0f0"][3] == ZERO
    assert "127.0.0.1" in facts.addresses["lo"]
    assert facts.mem_available == 120 * 1024**3
    assert abs(facts.clock_offset_s) < 1.0


def test_env_names_this_nodes_interface_both_twins_and_a_nonzero_gid(tmp_path: Path) -> None:
    facts = probe(at(spark(tmp_path, gid_index=5)))
    net, findings = resolve_network(facts, ClusterSpec())
    assert net is not None, findings
    env = net.env()
    assert list(env) == list(PER_NODE_VARS)
    assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == env["UCX_NET_DEVICES"] == "lo"
    assert env["NCCL_IB_HCA"] == "roceP2p1s0f1,rocep1s0f1"
    assert env["NCCL_IB_GID_INDEX"] == "5"  # the RoCE v2 IPv4 GID, not index 0 (v1)
    assert env["VLLM_HOST_IP"] == env["RAY_NODE_IP_ADDRESS"] == "127.0.0.1"
    assert all(f.status == "ok" for f in findings)


def test_a_pinned_gid_index_that_is_zero_on_this_node_fails(tmp_path: Path) -> None:
    facts = probe(at(spark(tmp_path, gid_index=5)))
    net, findings = resolve_network(facts, ClusterSpec(ib_gid_index=3))
    assert net is None
    (bad,) = [f for f in findings if f.status == "fail"]
    assert bad.check == "gid" and "all-zero" in bad.detail and "non-zero here: 0, 5" in bad.detail
    assert "ib_gid_index=null" in bad.fix


def test_a_wrong_interface_name_is_bad_input(tmp_path: Path) -> None:
    facts = probe(at(spark(tmp_path)))
    net, findings = resolve_network(facts, ClusterSpec(interface="enp1s0f1np1"))
    assert net is None
    (bad,) = [f for f in findings if f.status == "fail"]
    assert bad.bad_input and "enp1s0f1np1 not on this node" in bad.detail
    assert "lo (up)" in bad.detail and "enp1s0f0np0 (down)" in bad.detail


@pytest.mark.parametrize(
    ("kwargs", "check", "status", "text"),
    [
        ({"state": "down"}, "interface", "fail", "lo is down"),
        ({"mtu": 1500}, "mtu", "warn", "MTU 1500"),
        ({"twin_up": False}, "roce", "warn", "only one half of the port"),
    ],
)
def test_link_findings(tmp_path: Path, kwargs: dict, check: str, status: str, text: str) -> None:
    facts = probe(at(spark(tmp_path, **kwargs)))
    _, findings = resolve_network(facts, ClusterSpec(interface="lo"))
    hits = [f for f in findings if f.check == check and f.status == status]
    assert hits and text in hits[0].detail, findings
    if check in ("interface", "mtu"):
        assert hits[0].apply  # `cluster check --apply` can fix these


def test_no_roce_devices(tmp_path: Path) -> None:
    root = make_node(tmp_path, ports={}, gids={}, extra_netdevs={"eth0": ("up", 1500)})
    net, findings = resolve_network(probe(at(root)), ClusterSpec())
    assert net is None
    assert any(f.check == "roce" and "no RoCE devices" in f.detail for f in findings)
