"""Reaching a node: the local one runs commands directly, any other one over the `ssh` client.

The OpenSSH client is used (not a library) so a user's ~/.ssh/config, agent and known_hosts apply as
they do for `ssh HOST`; BatchMode makes a missing key an immediate "auth refused", never a prompt.
Extra client options for every call come from SPARKCTL_SSH_OPTS (e.g. `-i KEY -o UserKnownHostsFile=F`).
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
from dataclasses import dataclass

from sparkctl.errors import RuntimeFailure, UserError

_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "local"}
SSH_CONNECT_TIMEOUT_S = 5


class NodeUnreachable(RuntimeFailure):
    """The node did not answer over SSH (down, wrong address, sshd stopped)."""


class NodeAuthRefused(RuntimeFailure):
    """sshd answered but refused the key: passwordless SSH is not set up for this user."""


@dataclass(frozen=True)
class Node:
    """One Spark as the user named it: `[user@]host[:port]`, or `localhost` for this machine."""

    address: str  # as given, also the name shown in tables
    host: str
    user: str | None = None
    port: int | None = None
    sysroot: str = ""  # where the node's files are read from: "" on a real host, a tree in tests

    @property
    def is_local(self) -> bool:
        return self.host in _LOCAL_NAMES or self.host == socket.gethostname()

    @property
    def ssh_command(self) -> str:
        """How the user reaches it by hand (ssh takes the port as -p, not host:port)."""
        target = f"{self.user}@{self.host}" if self.user else self.host
        return f"ssh -p {self.port} {target}" if self.port else f"ssh {target}"

    def ssh_argv(self) -> list[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"]
        argv += shlex.split(os.environ.get("SPARKCTL_SSH_OPTS", ""))
        if self.port:
            argv += ["-p", str(self.port)]
        argv.append(f"{self.user}@{self.host}" if self.user else self.host)
        return argv


def parse_node(text: str) -> Node:
    spec = text.strip()
    if not spec or any(c.isspace() for c in spec):
        raise UserError(f"node {text!r}: expected [user@]host[:port]")
    user, _, rest = spec.rpartition("@")
    host, port = rest, None
    if rest.count(":") == 1:  # host:port (an IPv6 address has more colons and no port)
        host, _, port_text = rest.partition(":")
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise UserError(f"node {text!r}: port {port_text!r} is not a TCP port")
        port = int(port_text)
    if not host:
        raise UserError(f"node {text!r}: no host name")
    # SPARKCTL_SYSROOT: every node's /sys, /proc and model files are read under this root (tests, recordings)
    sysroot = os.environ.get("SPARKCTL_SYSROOT", "")
    return Node(address=spec, host=host, user=user or None, port=port, sysroot=sysroot)


def parse_nodes(specs: str | list[str] | tuple[str, ...]) -> list[Node]:
    """`--nodes HEAD,WORKER` (or the recipe's cluster.hosts): the head first, each node once."""
    items = specs.split(",") if isinstance(specs, str) else list(specs)
    nodes = [parse_node(item) for item in items if item.strip()]
    if not nodes:
        raise UserError("no nodes given: --nodes HEAD,WORKER (head first)")
    seen: set[str] = set()
    for n in nodes:
        key = "local" if n.is_local else f"{n.host}:{n.port or 22}"
        if key in seen:
            raise UserError(f"node {n.address} is listed twice in --nodes")
        seen.add(key)
    return nodes


def run_on(node: Node, script: str, *, timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run a POSIX sh script on the node (stdin), returning its output; SSH failures become one-line errors."""
    argv = ["sh", "-s"] if node.is_local else [*node.ssh_argv(), "sh", "-s"]
    try:
        proc = subprocess.run(argv, input=script, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as exc:
        raise UserError(f"node {node.address}: {argv[0]} not found ({exc.strerror})") from None
    except subprocess.TimeoutExpired:
        raise NodeUnreachable(
            f"node {node.address}: no answer within {timeout_s:.0f}s",
            hint=f"check that `{node.ssh_command} true` returns",
        ) from None
    if not node.is_local and proc.returncode == 255:
        raise ssh_failure(node, proc.stderr)
    return proc


def popen_on(node: Node, script: str) -> subprocess.Popen[str]:
    """Start a long-running POSIX sh script on the node (`sh -c`), its output on a pipe here. The
    script's stdin is a pipe from here too, so a script can end itself when this side closes it."""
    argv = ["sh", "-c", script] if node.is_local else [*node.ssh_argv(), shlex.join(["sh", "-c", script])]
    try:
        return subprocess.Popen(  # its own session: a terminal's Ctrl-C reaches sparkctl, which ends it
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise UserError(f"node {node.address}: {argv[0]} not found ({exc.strerror})") from None


def ssh_failure(node: Node, stderr: str) -> RuntimeFailure:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and not ln.startswith("Warning:")]
    last = lines[-1] if lines else "ssh exited 255"
    if "Permission denied" in stderr or "Too many authentication failures" in stderr:
        return NodeAuthRefused(
            f"node {node.address}: SSH refused the login ({last})",
            hint=f"set up passwordless SSH: ssh-copy-id{' -p ' + str(node.port) if node.port else ''} "
            f"{node.address.rsplit(':', 1)[0] if node.port else node.address} (then `{node.ssh_command} true`)",
        )
    return NodeUnreachable(
        f"node {node.address} unreachable over SSH: {last}",
        hint=f"check the address, the cable and that sshd runs there: {node.ssh_command} true",
    )
