"""Helpers shared by the docker runtime tests (imported by name; pytest puts this folder on sys.path)."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

from plans import build_plan

from sparkctl.planner.types import ContainerSpec, ModelSource, Mount, Plan
from sparkctl.runtimes.docker import LABEL_MANAGED

REPO = Path(__file__).resolve().parents[2]
TEST_IMAGE = "sparkctl-test:cpu"
SETUP_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sparkctl" / "docker"


def recorded_reason(name: str) -> str | None:
    """The reason scripts/docker-engine.sh or scripts/test-image.sh wrote when they could not set up."""
    path = SETUP_CACHE / f"{name}.status"
    try:
        state, _, reason = path.read_text().strip().partition("\t")
    except OSError:
        return None
    return reason if state == "unavailable" else None


def managed_container_ids(client) -> set[str]:
    return {c.id for c in client.containers.list(all=True, filters={"label": f"{LABEL_MANAGED}=true"})}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def host_python_mounts() -> tuple[Mount, ...]:
    """The host Python and the repo (with its .venv) at their own paths, read-only, so the venv's
    interpreter and every package in it work unchanged inside the Debian test image."""
    paths: list[str] = []
    for p in (sys.base_prefix, str(REPO), sys.prefix):
        if not any(p == q or p.startswith(q.rstrip("/") + "/") for q in paths):
            paths.append(p)
    return tuple(Mount(source=p, target=p, read_only=True) for p in paths)


def host_python() -> str:
    """The host interpreter's path, valid inside the test image once host_python_mounts() are in."""
    return str(Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}")


def make_plan(
    name: str,
    argv: list[str],
    *,
    port: int,
    image: str = TEST_IMAGE,
    env: dict[str, str] | None = None,
    mounts: tuple[Mount, ...] = (),
    gpus: bool = False,
    **container: object,
) -> Plan:
    """A docker Plan built by hand: these tests exercise the runtime, not the planner."""
    return build_plan(
        recipe_name=name,
        recipe_hash=f"hash-of-{name}",
        runtime="docker",
        argv=argv,
        env=env or {},
        port=port,
        model=ModelSource(path="/nonexistent"),
        health_timeout_s=60,
        container=ContainerSpec(
            image=image,
            name=f"sparkctl-{name}",
            gpus=gpus,
            mounts=host_python_mounts() + mounts,
            **container,  # type: ignore[arg-type]
        ),
    )


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def fake_hf_snapshot(root: Path) -> Path:
    """The Hugging Face cache layout: snapshot files are relative links into ../../blobs."""
    repo = root / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "0123abcd").write_text('{"model_type": "llama"}')
    snap = repo / "snapshots" / "rev1"
    (snap / "sub").mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/0123abcd")
    (snap / "sub" / "nested.json").symlink_to("../../../blobs/0123abcd")
    return snap
