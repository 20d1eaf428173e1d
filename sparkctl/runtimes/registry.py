"""Runtime name -> runtime object: what `up`, `down`, `status`, `logs` and `chat` share to find a server.

It lives with the runtimes (not in the `up` pipeline) so that stopping or listing servers does not
import the pipeline; each runtime module is imported only when its name is asked for (the docker SDK
costs `sparkctl status` nothing for a native server).
"""

from __future__ import annotations

from sparkctl.errors import UserError
from sparkctl.runtimes.base import Runtime

RUNTIMES: tuple[str, ...] = ("native", "docker", "cluster")


def get_runtime(name: str) -> Runtime:
    """The runtime object for a plan's or a state file's `runtime` name."""
    if name == "native":
        from sparkctl.runtimes.native import NativeRuntime

        return NativeRuntime()
    if name == "docker":
        from sparkctl.runtimes.docker import DockerRuntime

        return DockerRuntime()
    if name == "cluster":
        from sparkctl.runtimes.cluster import ClusterRuntime

        return ClusterRuntime()
    raise UserError(f"unknown runtime {name!r}", hint=f"valid: {', '.join(RUNTIMES)}")
