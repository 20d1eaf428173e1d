"""The docker runtime: a Plan's ContainerSpec becomes one labelled container, driven through the Docker SDK.

The container is named after the recipe (`sparkctl-<recipe>`) and carries labels with the recipe name
and hash, so `down`/`status`/`logs` find it again from a ServerState and never touch containers that
sparkctl did not create. It runs with the host network and IPC namespace (as Spark deployments do for
NCCL and the OpenAI port) and gets every GPU through a device request.

Every failure the user can act on (daemon down, image missing, port taken, a foreign container in the
way, a container that dies at once) is a RuntimeFailure with one line and a hint; nothing this module
starts is left behind when `start` fails.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import psutil

from sparkctl.atomic import write_atomic
from sparkctl.errors import RuntimeFailure, write_failure
from sparkctl.planner.container import (  # re-exported: the labels and the name are the runtime's API
    LABEL_MANAGED,
    LABEL_MODEL,  # noqa: F401
    LABEL_PORT,  # noqa: F401
    LABEL_RECIPE,
    LABEL_RECIPE_HASH,  # noqa: F401
    ContainerRun,
    container_name_for,  # noqa: F401
    container_run,
)
from sparkctl.planner.facts import link_target_mounts  # re-exported: tests use it here
from sparkctl.runtimes import base
from sparkctl.runtimes.base import ServerState
from sparkctl.runtimes.common import started_state
from sparkctl.runtimes.identity import LABEL_STATE, state_tag
from sparkctl.runtimes.shm import held_segments, remove_leftovers
from sparkctl.server.auth import env_of
from sparkctl.server.ports import ensure_free

if TYPE_CHECKING:  # the SDK is imported lazily: `sparkctl list` must not pay for it
    import docker
    from docker.models.containers import Container

    from sparkctl.planner.types import Plan

DEFAULT_SOCKET = "unix:///var/run/docker.sock"
# The Spark image is built by `sparkctl build` (docker/Dockerfile); what `up` suggests when it is missing.
SPARK_BUILD_HINT = "sparkctl build {recipe} (or sparkctl up {recipe} --build)"
TEST_IMAGE_PREFIX = "sparkctl-test:"


def docker_host() -> str:
    """The daemon address the SDK will use, for messages (DOCKER_HOST or the default socket)."""
    return os.environ.get("DOCKER_HOST") or DEFAULT_SOCKET


def image_build_hint(image: str, recipe: str | None = None) -> str:
    """How to get `image` on this machine: the local test image, our Spark image, or a registry pull."""
    if image.startswith(TEST_IMAGE_PREFIX):
        return "build it: make test-image (a local Debian rootfs imported into Docker; needs root)"
    build = SPARK_BUILD_HINT.format(recipe=recipe or "RECIPE")
    if image.startswith("sparkctl") or image.startswith("ghcr.io/sparkctl"):
        return f"build it, in a sparkctl checkout: {build}"
    return f"pull it: docker pull {image} (or build it: {build})"


def connect(timeout_s: float = 10.0) -> docker.DockerClient:
    """A client for the daemon at DOCKER_HOST, or a RuntimeFailure saying why there is none.

    `docker.from_env` asks the daemon for its API version at once, so an unreachable or forbidden
    socket surfaces here, as one clear line instead of a requests traceback later.
    """
    import docker
    import requests
    from docker.errors import DockerException

    host = docker_host()
    try:
        client = docker.from_env(timeout=int(timeout_s) if timeout_s else None)
        client.ping()
    except (DockerException, requests.exceptions.RequestException) as exc:
        raise _daemon_failure(host, exc) from None
    return client


def _daemon_failure(host: str, exc: BaseException) -> RuntimeFailure:
    text = str(exc)
    if "Permission denied" in text:
        return RuntimeFailure(
            f"Docker daemon at {host} refused access (permission denied)",
            hint="add yourself to the docker group: sudo usermod -aG docker $USER, then log in again",
        )
    return RuntimeFailure(
        f"Docker daemon not reachable at {host}",
        hint=(
            "start it: sudo systemctl start docker (on a dev machine: make docker-engine); "
            "check DOCKER_HOST if it points elsewhere"
        ),
    )


F = TypeVar("F", bound=Any)


def _daemon_errors(fn: F) -> F:
    """Turn a daemon that went away mid-session into the same one-line failure `connect` gives.

    The SDK lets the transport's exceptions (requests) through untouched; without this, `status` or
    `down` run while the daemon restarts would end in a traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import requests  # here, not at import: this module is imported by `status` for every recipe

        try:
            return fn(*args, **kwargs)
        except requests.exceptions.ConnectionError as exc:
            raise _daemon_failure(docker_host(), exc) from None
        except requests.exceptions.Timeout:
            raise RuntimeFailure(
                f"Docker daemon at {docker_host()} did not answer in time",
                hint="it may be overloaded or stuck: check `docker info` and the daemon's log",
            ) from None

    return wrapper  # type: ignore[return-value]


@_daemon_errors
def ensure_image(image: str, client: docker.DockerClient | None = None, recipe: str | None = None) -> str:
    """Return the local image id of `image`, or fail with how to build or pull it.

    `up` calls this before launching so a missing image is reported before any model download or
    prewarm, not as a container creation error minutes later. Images are never pulled implicitly:
    the Spark image is built locally from docker/Dockerfile and pulling tens of GB unasked is rude.
    """
    from docker.errors import APIError, ImageNotFound

    client = client or connect()
    try:
        return client.images.get(image).id
    except ImageNotFound:
        raise RuntimeFailure(
            f"Docker image {image} not found locally", hint=image_build_hint(image, recipe)
        ) from None
    except APIError as exc:
        raise RuntimeFailure(f"could not inspect Docker image {image}: {_api_text(exc)}") from None


def ensure_plan_image(plan: Plan) -> str:
    """`ensure_image` for a docker Plan (what the `up` pipeline calls at its "ensure image" step)."""
    return ensure_image(container_run(plan).image, recipe=plan.recipe_name)


_NS = 1_000_000_000


def create_kwargs(run: ContainerRun) -> dict[str, Any]:
    """`client.containers.create(**create_kwargs(run))`: the SDK's words for the container `run` describes.

    Pure: `start` prepares the mount sources on the host (and adds the link-target mounts) first."""
    from docker.types import DeviceRequest, Mount, Ulimit

    h = run.healthcheck
    kwargs: dict[str, Any] = {
        "image": run.image,
        "entrypoint": [run.entrypoint],
        "command": list(run.command),
        "name": run.name,
        "detach": True,
        # the env files as `docker run --env-file` reads them (-e wins); the key is never in run.env
        "environment": {k: v for f in run.env_files for k, v in env_of(f).items()} | run.env,
        "labels": dict(run.labels),
        "mounts": [
            Mount(target=m.target, source=m.source, type="bind", read_only=m.read_only) for m in run.mounts
        ],
        "ulimits": [Ulimit(name=k, soft=soft, hard=hard) for k, (soft, hard) in run.ulimits.items()],
        # No auto-remove: the log of a container that died during start-up is what explains it.
        "auto_remove": False,
        "init": run.init,
        "healthcheck": {"test": ["NONE"]}
        if h is None
        else {
            "test": ["CMD-SHELL", h.command],
            "interval": h.interval_s * _NS,
            "timeout": h.timeout_s * _NS,
            "retries": h.retries,
            "start_period": h.start_period_s * _NS,
        },
    }
    if run.restart_policy != "no":  # `up --persist`: back after a reboot; `down` removes the container
        kwargs["restart_policy"] = {"Name": run.restart_policy}
    if run.network_host:
        kwargs["network_mode"] = "host"
    if run.publish:
        kwargs["ports"] = {f"{port}/tcp": (host, port) for host, port in run.publish}
    if run.ipc_host:
        kwargs["ipc_mode"] = "host"
    if run.shm_size:
        kwargs["shm_size"] = run.shm_size
    if run.gpus:
        kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    if run.devices:
        kwargs["devices"] = [f"{d}:{d}:rwm" for d in run.devices]
    if run.memory_limit:
        # Same cap for memory+swap: a runaway load becomes a container OOM, not a host-wide one.
        kwargs["mem_limit"] = run.memory_limit
        kwargs["memswap_limit"] = run.memory_limit
    return kwargs


def prepare_mounts(run: ContainerRun) -> list[tuple[str, str]]:
    """Make the host side of `run`'s mounts ready. The plan carries the link-target mounts its symlinks
    need already (planner.facts, so `render` and `--dry-run` show them); a link a mount made since then
    would dangle is added here too. A missing read-only source is a RuntimeFailure."""
    for m in run.mounts:
        source = Path(m.source)
        if not source.exists():
            if m.read_only:
                raise RuntimeFailure(
                    f"mount source {source} does not exist (read-only mount to {m.target})",
                    hint="fix container.mounts in the recipe",
                )
            # Writable mounts are caches (HF hub, JIT caches): create them rather than let Docker
            # create a root-owned directory, or fail.
            source.mkdir(parents=True, exist_ok=True)
    return link_target_mounts([(Path(m.source), m.target) for m in run.mounts])


def _api_text(exc: Exception) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def _start_hint(text: str) -> str:
    """The likely fix for a container the engine refused to start, from the engine's own words."""
    low = text.lower()
    if "rlimit" in low:
        return (
            "this host does not allow the recipe's container.ulimits (e.g. memlock unlimited); "
            "lower them in the recipe, or raise the hard limits of the Docker daemon"
        )
    if "device driver" in low or "nvidia" in low:
        return (
            "Docker cannot give this container a GPU: install the NVIDIA Container Toolkit and restart "
            "Docker (sparkctl doctor checks it), or set container.gpus: false"
        )
    if "no such file" in low or "executable file not found" in low:
        return "engine.entrypoint must exist inside the image (or in a mounted directory)"
    return "check the recipe's container settings (image, mounts, ulimits) and the Docker daemon's log"


class DockerRuntime:
    """Runtime protocol implementation for `runtime: docker` recipes (see sparkctl.runtimes.base)."""

    name = "docker"
    capabilities = frozenset({base.PERSIST, base.API_KEY, base.LOCAL_MODEL, base.WATCHDOG})

    def __init__(self, *, image: str | None = None, timeout_s: float = 10.0) -> None:
        # `image`, when known up front, lets `check()` also report a missing image (doctor, `up`).
        self.image = image
        self.timeout_s = timeout_s
        self._client: docker.DockerClient | None = None

    # -- connection ---------------------------------------------------------------------------------

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect(self.timeout_s)
        return self._client

    @_daemon_errors
    def check(self) -> None:
        """Fail with one line + hint unless the daemon answers (and the image, when known, is here)."""
        self._client = connect(self.timeout_s)
        if self.image:
            ensure_image(self.image, self._client)

    def ensure_ready(self, plan: Plan) -> Plan:
        """The image must be here before a model download (a missing image costs seconds, not a fetch)."""
        ensure_plan_image(plan)
        return plan

    def parts(self, state: ServerState) -> list[dict[str, Any]]:
        return []

    def persistence(
        self, plan: Plan, log_path: Path, *, install: bool, strict: bool = True
    ) -> tuple[str, str] | None:
        """`up --persist`: the container's restart policy (in the plan already) is all it takes."""
        return None

    # -- start --------------------------------------------------------------------------------------

    @_daemon_errors
    def start(self, plan: Plan, log_path: Path, progress: Callable[[str], None] | None = None) -> ServerState:
        """Create and start the container; return at once (the caller gates on health).

        On any failure after the container exists it is removed again, so a failed start leaves
        nothing of ours behind.
        """
        from docker.errors import APIError, ImageNotFound
        from docker.types import Mount

        run = container_run(plan)
        client = self.client
        image_id = ensure_image(run.image, client)
        name = run.name
        self._clear_name(name, plan.recipe_name)

        # Host network: a taken port would otherwise surface only as the engine's "address already in
        # use" deep in the container log, after the image has started.
        ensure_free(plan.host, plan.port)

        kwargs = create_kwargs(run)
        kwargs["labels"][LABEL_STATE] = state_tag()  # found again by label if its state file is lost
        for host_dir, container_dir in prepare_mounts(run):
            kwargs["mounts"].append(Mount(target=container_dir, source=host_dir, type="bind", read_only=True))
        try:
            container = client.containers.create(**kwargs)
        except ImageNotFound:
            raise RuntimeFailure(
                f"Docker image {run.image} not found locally",
                hint=image_build_hint(run.image, plan.recipe_name),
            ) from None
        except APIError as exc:
            raise RuntimeFailure(
                f"could not create container {name}: {_api_text(exc)}",
                hint="check the recipe's container.mounts and container.image",
            ) from None
        try:
            container.start()
        except APIError as exc:
            with contextlib.suppress(APIError):
                container.remove(force=True)
            raise RuntimeFailure(
                f"container {name} failed to start: {_api_text(exc)}", hint=_start_hint(_api_text(exc))
            ) from None
        except BaseException:  # Ctrl-C between create and start: leave nothing behind
            with contextlib.suppress(Exception):
                container.remove(force=True)
            raise
        return started_state(
            plan,
            self.name,
            log_path,
            container_id=container.id,
            container_name=name,
            extra={"image": run.image, "image_id": image_id}
            | ({"api_key_file": plan.api_key_file} if plan.api_key_file else {}),
        )

    def _clear_name(self, name: str, recipe: str) -> None:
        """Remove a stopped container of ours holding `name`; refuse a running one or a foreign one."""
        from docker.errors import APIError, NotFound

        try:
            existing = self.client.containers.get(name)
        except NotFound:
            return
        labels = existing.labels or {}
        if labels.get(LABEL_MANAGED) != "true":
            raise RuntimeFailure(
                f"a container named {name} exists that sparkctl did not create",
                hint=f"remove or rename it: docker rm -f {name}",
            )
        if existing.status in ("running", "restarting", "paused"):
            raise RuntimeFailure(
                f"container {name} for recipe {labels.get(LABEL_RECIPE, recipe)} is already {existing.status}",
                hint=f"stop it first: sparkctl down {labels.get(LABEL_RECIPE, recipe)}",
            )
        try:
            existing.remove(force=True)
        except NotFound:
            pass
        except APIError as exc:
            raise RuntimeFailure(f"could not remove the old container {name}: {_api_text(exc)}") from None

    # -- inspect ------------------------------------------------------------------------------------

    def _find(self, state: ServerState) -> Container | None:
        """The container of `state`: by id (by name only for a state that has no id).

        Never by name when the id is gone: another state directory (a test's, another user's) may
        have started a new container of the same recipe under that name, and a stale state must not
        stop it.
        """
        from docker.errors import NotFound

        key = state.container_id or state.container_name
        if not key:
            return None
        try:
            container = self.client.containers.get(key)
        except NotFound:
            return None
        return container if (container.labels or {}).get(LABEL_RECIPE) == state.recipe else None

    @_daemon_errors
    def is_running(self, state: ServerState) -> bool:
        container = self._find(state)
        return container is not None and container.status == "running"

    @_daemon_errors
    def exit_detail(self, state: ServerState) -> str | None:
        """Why the container is not running ("exited with code 2", "OOM-killed"), or None if it runs.

        The health gate uses this to say *how* a server died during start-up, not only that it did.
        """
        container = self._find(state)
        if container is None:
            return "container no longer exists"
        s = container.attrs.get("State", {})
        if s.get("Running"):
            return None
        if s.get("OOMKilled"):
            return "container was OOM-killed"
        detail = f"container exited with code {s.get('ExitCode')}"
        if s.get("ExitCode") == 143:  # 128 + SIGTERM: stopped from outside, not a crash of the engine
            detail += " (SIGTERM: `docker stop`, or the Docker daemon stopping)"
        if s.get("Error"):
            detail += f": {s['Error']}"
        return detail

    @_daemon_errors
    def stats(self, state: ServerState) -> dict[str, int] | None:
        """Memory in use by the container (bytes), for `status`; None when it is not running."""
        container = self._find(state)
        if container is None or container.status != "running":
            return None
        # one_shot: a single sample now, instead of waiting a second for a CPU delta `status` never shows
        raw = container.stats(stream=False, one_shot=True)
        mem = raw.get("memory_stats", {})
        usage = int(mem.get("usage", 0))
        # cgroup v1 counts page cache in `usage`; what the engine itself holds is usage minus cache
        cache = int(
            (mem.get("stats") or {}).get(
                "total_inactive_file", (mem.get("stats") or {}).get("inactive_file", 0)
            )
        )
        return {"memory_bytes": max(0, usage - cache), "memory_limit_bytes": int(mem.get("limit", 0))}

    # -- stop ---------------------------------------------------------------------------------------

    @_daemon_errors
    def stop(self, state: ServerState, timeout_s: float = 30.0) -> None:
        """Stop and remove the container, keeping its log in `state.log_path`. A gone one is fine. With the
        host's IPC namespace, the shared memory its processes held and that outlives them is unlinked (shm.py):
        their /dev/shm is the host's, and a SIGKILLed engine leaves its segments there."""
        from docker.errors import APIError, NotFound

        container = self._find(state)
        if container is None:
            return
        segments = self._host_shm_segments(container)
        log_failure: RuntimeFailure | None = None
        try:
            if container.status in ("running", "restarting", "paused"):
                container.stop(timeout=max(1, int(timeout_s)))
            try:
                self._save_log(container, state)
            except RuntimeFailure as exc:  # a full disk loses the log, never leaves the container behind
                log_failure = exc
            container.remove(force=True)
        except NotFound:
            pass  # gone meanwhile: what it left in /dev/shm is still ours to remove
        except APIError as exc:
            raise RuntimeFailure(
                f"could not stop container {state.container_name or state.container_id}: {_api_text(exc)}",
                hint=f"remove it by hand: docker rm -f {state.container_name or state.container_id}",
            ) from None
        remove_leftovers(segments)
        if log_failure is not None:
            raise RuntimeFailure(
                f"stopped {state.recipe}, but its log was not kept: {log_failure}", hint=log_failure.hint
            )

    @staticmethod
    def _host_shm_segments(container: Container) -> set[Path]:
        """The host /dev/shm files the container's processes hold, when it shares the host's IPC namespace (seen
        through /proc: needs the rights to read them, else nothing is found and nothing removed)."""
        attrs = container.attrs
        if (attrs.get("HostConfig") or {}).get("IpcMode") != "host":
            return set()
        pid = int((attrs.get("State") or {}).get("Pid") or 0)
        if pid <= 0:
            return set()
        try:
            init = psutil.Process(pid)
            procs = [init, *init.children(recursive=True)]
        except psutil.Error:
            return set()
        return held_segments(procs)

    @staticmethod
    def _save_log(container: Container, state: ServerState) -> None:
        """Keep the container's log after removal, for `sparkctl logs` and post-mortems (atomic write)."""
        if not state.log_path:
            return
        path = Path(state.log_path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, container.logs(stdout=True, stderr=True))
        except OSError as exc:  # the log is lost, the stop must still happen: `stop` goes on and says so
            raise write_failure(path, exc) from None

    # -- logs ---------------------------------------------------------------------------------------

    def logs(self, state: ServerState, *, tail: int | None = None, follow: bool = False) -> Iterator[str]:
        """Lines of the container's output; from the saved log file once the container is gone."""
        import requests
        import urllib3

        try:
            container = self._find(state)
            if container is None:
                yield from _file_lines(state, tail)
                return
            if follow:
                # The default client has a short read timeout; a quiet server must not end `logs -f`.
                follow_client = connect(timeout_s=0)
                container = follow_client.containers.get(container.id)
            chunks = container.logs(
                stdout=True, stderr=True, stream=True, follow=follow, tail="all" if tail is None else tail
            )
            yield from _split_lines(chunks)
        except (requests.exceptions.ConnectionError, urllib3.exceptions.ProtocolError) as exc:
            raise _daemon_failure(docker_host(), exc) from None


def _split_lines(chunks: Iterator[bytes]) -> Iterator[str]:
    pending = b""
    for chunk in chunks:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield line.decode("utf-8", "replace").rstrip("\r")
    if pending:
        yield pending.decode("utf-8", "replace").rstrip("\r")


def _file_lines(state: ServerState, tail: int | None) -> Iterator[str]:
    if not state.log_path or not Path(state.log_path).exists():
        raise RuntimeFailure(
            f"no container and no saved log for recipe {state.recipe}",
            hint="the container was removed outside sparkctl (docker rm)",
        )
    lines = Path(state.log_path).read_text(errors="replace").splitlines()
    yield from lines if tail is None else lines[-tail:] if tail > 0 else []
