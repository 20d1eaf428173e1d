"""A real OpenSSH server for the cluster tests: its own host key, one authorised client key, on a port
of this machine (optionally inside a network namespace). Needs root and /usr/sbin/sshd."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def sshd_missing() -> str | None:
    if not Path(SSHD).exists():
        return "needs openssh-server (/usr/sbin/sshd)"
    if os.geteuid() != 0:
        return "needs root (sshd logs in as root here)"
    if not shutil.which("ssh-keygen"):
        return "needs ssh-keygen"
    return None


@dataclass
class Sshd:
    proc: subprocess.Popen[bytes]
    address: str
    port: int
    key: Path  # the authorised client key
    other_key: Path  # a key sshd does not accept
    known_hosts: Path

    def opts(self, key: Path | None = None) -> str:
        return (
            f"-i {key or self.key} -o IdentitiesOnly=yes -o UserKnownHostsFile={self.known_hosts} "
            "-o StrictHostKeyChecking=no -o LogLevel=ERROR"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_sshd(
    work: Path,
    *,
    address: str = "127.0.0.1",
    port: int | None = None,
    netns: str | None = None,
    set_env: dict[str, str] | None = None,
) -> Sshd:
    """`set_env`: variables every session gets (sshd's SetEnv), e.g. the worker's own DOCKER_HOST."""
    work.mkdir(parents=True, exist_ok=True)
    for name in ("host", "client", "other"):
        if not (work / name).exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / name)], check=True
            )
    (work / "authorized_keys").write_text((work / "client.pub").read_text())
    port = port or free_port()
    config = work / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress {address}\nHostKey {work / 'host'}\nPidFile {work / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {work / 'authorized_keys'}\nStrictModes no\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nLogLevel ERROR\n"
        "AcceptEnv LANG\n"
    )
    if set_env:
        with config.open("a") as f:
            f.write("SetEnv " + " ".join(f"{k}={v}" for k, v in set_env.items()) + "\n")
    Path("/run/sshd").mkdir(exist_ok=True)
    argv = [SSHD, "-D", "-e", "-f", str(config)]
    if netns:
        argv = ["ip", "netns", "exec", netns, *argv]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(work / "sshd.log", "wb"))  # noqa: SIM115
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the listening socket is reachable from here (veth or loopback)
        if proc.poll() is not None:
            raise RuntimeError(f"sshd exited: {(work / 'sshd.log').read_text()}")
        try:
            with socket.create_connection((address, port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    return Sshd(proc, address, port, work / "client", work / "other", work / "known_hosts")
