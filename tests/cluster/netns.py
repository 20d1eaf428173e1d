"""Two simulated Sparks: two network namespaces joined by a veth pair (10.77.0.1, 10.77.0.2), an sshd in
the worker's, and a Spark-like tree whose two ConnectX-7 netdevs are the veth ends (each node sees only
its own end with an address, so each picks its own). Needs root, iproute2 and /usr/sbin/sshd."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from fake_sysfs import V2, make_node, v4_gid
from sshd import Sshd, start_sshd

HEAD_IP, WORKER_IP = "10.77.0.1", "10.77.0.2"


@dataclass
class Namespaces:
    head_ns: str
    worker_ns: str
    head_if: str
    worker_if: str
    sshd: Sshd
    tree: Path

    @property
    def worker(self) -> str:
        return f"root@{WORKER_IP}:{self.sshd.port}"

    def pids(self, ns: str) -> set[int]:
        out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout
        return {int(p) for p in out.split()} - {self.sshd.proc.pid}


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@contextlib.contextmanager
def namespaces(work: Path, port: int = 2222) -> Iterator[Namespaces]:
    tag = str(os.getpid() % 100000)
    head_ns, worker_ns = f"spk-h{tag}", f"spk-w{tag}"
    head_if, worker_if = f"cx7h{tag}", f"cx7w{tag}"
    _ip("netns", "add", head_ns)
    _ip("netns", "add", worker_ns)
    server = None
    try:
        _ip("link", "add", head_if, "type", "veth", "peer", "name", worker_if)
        _ip("link", "set", head_if, "netns", head_ns)
        _ip("link", "set", worker_if, "netns", worker_ns)
        for ns, dev, addr in ((head_ns, head_if, HEAD_IP), (worker_ns, worker_if, WORKER_IP)):
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", dev, "mtu", "9000")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        server = start_sshd(work / "sshd", address=WORKER_IP, port=port, netns=worker_ns)
        tree = make_node(
            work / "tree",
            ports={"rocep1s0f1": (head_if, "up", 9000), "rocep2s0f1": (worker_if, "up", 9000)},
            gids={"rocep1s0f1": {3: (v4_gid(HEAD_IP), V2)}, "rocep2s0f1": {3: (v4_gid(WORKER_IP), V2)}},
        )
        yield Namespaces(head_ns, worker_ns, head_if, worker_if, server, tree)
    finally:
        if server is not None:
            server.stop()
        for ns in (head_ns, worker_ns):
            for pid in subprocess.run(
                ["ip", "netns", "pids", ns], capture_output=True, text=True
            ).stdout.split():
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
