"""Who holds a TCP port: checked before launch so a clash is one clear line, not an engine traceback.

The port is tested by binding it (what the server will do); only if that fails do we look for the
owner, first among our own recorded servers, then in the kernel's connection table via psutil.
"""

from __future__ import annotations

import contextlib
import socket

from sparkctl.errors import UserError

PORT_HINT = "stop that server, or pick another port: --port N (or --port 0 for any free one)"


def port_is_free(host: str, port: int) -> bool:
    """True if a server could bind `host:port` right now (SO_REUSEADDR, as uvicorn binds)."""
    bind_host = "0.0.0.0" if host in ("", "*") else host
    family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind_host, port))
        except OSError:
            return False
    return True


def ensure_free(host: str, port: int) -> None:
    """The one port check (`up` before anything costly, the docker runtime again right before it creates
    the container): a taken port is a UserError naming its owner, with one hint."""
    if port_is_free(host, port):
        return
    owner = listener(port) or "another process"
    raise UserError(f"port {port} on {host} is already in use by {owner}", hint=PORT_HINT)


def listener(port: int) -> str | None:
    """ "pid N (command)" of the process listening on `port`, or None if psutil cannot tell."""
    import psutil

    try:
        conns = psutil.net_connections(kind="inet")
    except (psutil.AccessDenied, OSError):
        return None
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        if not conn.pid:
            return None  # another user's socket: the kernel does not tell us whose
        cmd = "?"
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(conn.pid)
            cmd = " ".join(proc.cmdline()) or proc.name()
        if len(cmd) > 100:
            cmd = cmd[:97] + "..."
        return f"pid {conn.pid} ({cmd})"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """An unused port picked by the kernel (tests and `--port 0`)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
