"""A node's own ConnectX-7 settings: which netdev, its address, both RoCE twins of the port, a GID index
that is non-zero on this node, and the environment NCCL, Gloo, UCX, Ray and vLLM read from them.

These are decided per node from that node's facts, never copied from the head: the cable may sit on a
different port on the worker, and GID tables differ per node and shift after a reboot (an all-zero GID
kills the rank about 60 s into the load).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sparkctl.cluster.findings import Finding
from sparkctl.cluster.probe import NodeFacts, is_zero_gid

MIN_MTU = 9000
# Every variable below names something of this node; vLLM's Ray executor must not carry the head's
# values over to the worker (they go in ray_non_carry_over_env_vars.json).
PER_NODE_VARS = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "VLLM_HOST_IP",
    "RAY_NODE_IP_ADDRESS",
    "RAY_OVERRIDE_NODE_IP_ADDRESS",
)
_V4_MAPPED = "0000:0000:0000:0000:0000:ffff:"


#: what a dry run shows for a value it could not read off a node (unreachable over SSH)
UNPROBED = "<not probed>"


@dataclass(frozen=True)
class NodeNetwork:
    node: str
    interface: str
    address: str
    mtu: int | None
    hcas: tuple[str, ...]
    gid_index: int | None  # None: not probed (a dry run past an unreachable node)

    @classmethod
    def unprobed(cls, node: str) -> NodeNetwork:
        """A node a dry run could not reach: its plan is shown with these values marked, not guessed."""
        return cls(
            node=node, interface=UNPROBED, address=UNPROBED, mtu=None, hcas=(UNPROBED,), gid_index=None
        )

    def env(self) -> dict[str, str]:
        env = {
            var: self.interface for var in PER_NODE_VARS if var.endswith(("IFNAME", "DEVICES", "if_include"))
        }
        env["NCCL_IB_HCA"] = ",".join(self.hcas)
        env["NCCL_IB_GID_INDEX"] = UNPROBED if self.gid_index is None else str(self.gid_index)
        for var in ("VLLM_HOST_IP", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS"):
            env[var] = self.address
        return {k: env[k] for k in PER_NODE_VARS}


def _twin_key(name: str) -> str:
    """enP2p1s0f1np1 and enp1s0f1np1 (or roceP2p1s0f1 and rocep1s0f1) are the two PCIe halves of a port."""
    return re.sub(r"P\d+", "", name)


def _cx7_netdevs(facts: NodeFacts) -> list[str]:
    return sorted({nd for names in facts.ib_netdevs.values() for nd in names})


def _describe(facts: NodeFacts, names: list[str]) -> str:
    parts = []
    for n in names:
        dev = facts.netdevs.get(n)
        parts.append(f"{n} ({dev.operstate if dev else 'absent'})")
    return ", ".join(parts) or "none"


def resolve_network(facts: NodeFacts, cluster: Any) -> tuple[NodeNetwork | None, list[Finding]]:
    """This node's network from its facts and the recipe's preferences (cluster.interface, ib_hca,
    ib_gid_index; each null means: pick on this node). Returns the findings either way."""
    node = facts.node
    out: list[Finding] = []
    cx7 = _cx7_netdevs(facts)
    if not facts.ib_netdevs:
        out.append(
            Finding(
                node,
                "roce",
                "fail",
                "no RoCE devices under /sys/class/infiniband",
                "load the mlx5 driver (modprobe mlx5_ib) and check `ibdev2netdev`",
            )
        )
    # -- interface -----------------------------------------------------------------------------------
    iface = cluster.interface
    if iface:
        dev = facts.netdevs.get(iface)
        if dev is None:
            out.append(
                Finding(
                    node,
                    "interface",
                    "fail",
                    f"interface {iface} not on this node (ConnectX-7 netdevs here: {_describe(facts, cx7)})",
                    "set the netdev that is Up here (`ibdev2netdev`): --set cluster.interface=NAME, "
                    "or --set cluster.interface=null to pick one per node",
                    bad_input=True,
                )
            )
            return None, out
    else:
        up = [n for n in cx7 if facts.netdevs.get(n) and facts.netdevs[n].operstate == "up"]
        with_ip = [n for n in up if facts.addresses.get(n)]
        pick = (with_ip or up or [None])[0]
        if pick is None:
            out.append(
                Finding(
                    node,
                    "interface",
                    "fail",
                    f"no ConnectX-7 interface is up (here: {_describe(facts, cx7)})",
                    "cable the same physical port on both nodes and bring it up "
                    "(/etc/netplan/40-cx7.yaml, then `netplan apply`)",
                )
            )
            return None, out
        iface = pick
        dev = facts.netdevs[iface]
    if dev.operstate != "up":
        out.append(
            Finding(
                node,
                "interface",
                "fail",
                f"interface {iface} is {dev.operstate or 'unknown'}",
                f"check the cable (same physical port on both nodes), then `ip link set {iface} up`",
                apply=(f"ip link set {iface} up",),
            )
        )
    else:
        out.append(Finding(node, "interface", "ok", f"{iface} up"))
    if dev.mtu is not None and dev.mtu < MIN_MTU:
        out.append(
            Finding(
                node,
                "mtu",
                "warn",
                f"{iface} MTU {dev.mtu} (below {MIN_MTU}: NCCL runs ~3 GB/s instead of ~20)",
                f"`ip link set {iface} mtu {MIN_MTU}` now, and `mtu: {MIN_MTU}` in /etc/netplan/40-cx7.yaml",
                apply=(f"ip link set {iface} mtu {MIN_MTU}",),
            )
        )
    else:
        out.append(Finding(node, "mtu", "ok", f"{iface} MTU {dev.mtu}"))
    addresses = facts.addresses.get(iface) or []
    if not addresses:
        out.append(
            Finding(
                node,
                "address",
                "fail",
                f"{iface} has no IPv4 address",
                "give it one (static 192.168.100.x/24 in /etc/netplan/40-cx7.yaml, then `netplan apply`)",
            )
        )
    else:
        out.append(Finding(node, "address", "ok", f"{iface} {addresses[0]}"))
    # -- RoCE devices: both twins of the port ----------------------------------------------------------
    if cluster.ib_hca:
        hcas = list(cluster.ib_hca)
        missing = [h for h in hcas if h not in facts.ib_netdevs and h not in facts.gids]
        if missing:
            out.append(
                Finding(
                    node,
                    "roce",
                    "fail",
                    f"RoCE device(s) {', '.join(missing)} not on this node "
                    f"(here: {', '.join(sorted(facts.ib_netdevs)) or 'none'})",
                    "--set cluster.ib_hca=null to pick both twins of the port per node",
                    bad_input=True,
                )
            )
            return None, out
    else:
        own = sorted(h for h, names in facts.ib_netdevs.items() if iface in names)
        keys = {_twin_key(h) for h in own}
        twins = [
            hca
            for hca, names in facts.ib_netdevs.items()
            if hca not in own
            and _twin_key(hca) in keys
            and any(facts.netdevs.get(n) and facts.netdevs[n].operstate == "up" for n in names)
        ]
        hcas = sorted(own + twins)
        if not hcas:
            if facts.ib_netdevs:
                out.append(
                    Finding(
                        node,
                        "roce",
                        "fail",
                        f"no RoCE device backs {iface}",
                        "pick the ConnectX-7 netdev `ibdev2netdev` lists as Up: --set cluster.interface=NAME",
                    )
                )
            return None, out
    if len(hcas) < 2:
        out.append(
            Finding(
                node,
                "roce",
                "warn",
                f"only one half of the port in NCCL_IB_HCA ({', '.join(hcas)}): about half the bandwidth",
                "bring up both PCIe twins of the port (e.g. enp1s0f1np1 and enP2p1s0f1np1)",
            )
        )
    else:
        out.append(Finding(node, "roce", "ok", ",".join(hcas)))
    # -- GID index: one value for every listed device, non-zero on each -----------------------------------
    gid_index = _gid_index(facts, hcas, cluster.ib_gid_index, addresses, out)
    if gid_index is None or not addresses or dev.operstate != "up":
        return None, out
    return NodeNetwork(node, iface, addresses[0], dev.mtu, tuple(hcas), gid_index), out


def _gid_index(
    facts: NodeFacts, hcas: list[str], wanted: int | None, addresses: list[str], out: list[Finding]
) -> int | None:
    node = facts.node
    nonzero = [{i for i, g in facts.gids.get(h, {}).items() if not is_zero_gid(g)} for h in hcas]
    common = sorted(set.intersection(*nonzero)) if nonzero else []
    if wanted is not None:
        zero = [h for h in hcas if is_zero_gid(facts.gids.get(h, {}).get(wanted, ""))]
        if zero:
            out.append(
                Finding(
                    node,
                    "gid",
                    "fail",
                    f"GID index {wanted} is all-zero on {', '.join(zero)} (the rank would die ~60 s in); "
                    f"non-zero here: {', '.join(map(str, common)) or 'none'}",
                    "--set cluster.ib_gid_index=null to pick per node; after a reboot the table shifts "
                    "unless IPv6 uses eui64 (nmcli con mod CONN ipv6.addr-gen-mode eui64)",
                )
            )
            return None
        out.append(Finding(node, "gid", "ok", f"index {wanted}"))
        return wanted
    if not common:
        out.append(
            Finding(
                node,
                "gid",
                "fail",
                f"no GID index is non-zero on every one of {', '.join(hcas)}",
                "give the interface an address and check /sys/class/infiniband/*/ports/1/gids",
            )
        )
        return None

    def score(i: int) -> tuple[int, int, int]:
        types = [facts.gid_types.get(h, {}).get(i, "") for h in hcas]
        gids = [facts.gids[h][i] for h in hcas]
        v2 = all("v2" in t.lower() for t in types)
        mapped = all(g.startswith(_V4_MAPPED) for g in gids)
        return (0 if v2 else 1, 0 if mapped else 1, i)

    pick = min(common, key=score)
    out.append(Finding(node, "gid", "ok", f"index {pick} (picked on this node)"))
    return pick
