"""A docker Plan as one container description, which the Docker SDK runtime, `render --format shell` and
`render --format compose` all translate from.

Three hand-written translations drifted apart (a rendered `docker run` lacked `--init` and SPARKCTL_PORT,
so the image's healthcheck probed port 8000 whatever the server listened on); with one record, a field
added here reaches all three, and tests/planner/test_container_parity.py proves they describe the same
container field by field. What differs between a hand-run and `up` is named here too (`hand_run_env`),
not left to each translation.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sparkctl.errors import UserError
from sparkctl.planner.types import Mount, Plan

LABEL_MANAGED = "io.sparkctl.managed"
LABEL_RECIPE = "io.sparkctl.recipe"
LABEL_RECIPE_HASH = "io.sparkctl.recipe-hash"
LABEL_PORT = "io.sparkctl.port"
LABEL_MODEL = "io.sparkctl.served-model-name"
# What the image's HEALTHCHECK (docker/healthcheck.py) reads for the port to probe.
PORT_ENV = "SPARKCTL_PORT"
# Compose's defaults for a healthcheck, kept explicit so every translation says the same.
HEALTH_INTERVAL_S = 30
HEALTH_TIMEOUT_S = 10
HEALTH_RETRIES = 3


@dataclass(frozen=True)
class Healthcheck:
    """A shell-form probe (docker's CMD-SHELL: the only form `docker run --health-cmd` takes)."""

    command: str
    interval_s: int = HEALTH_INTERVAL_S
    timeout_s: int = HEALTH_TIMEOUT_S
    retries: int = HEALTH_RETRIES
    start_period_s: int = 0


@dataclass(frozen=True)
class ContainerRun:
    """Everything the engine is told about one container, in docker's own terms."""

    image: str
    name: str
    entrypoint: str  # argv[0] of the engine command
    command: tuple[str, ...]  # the rest of the engine command
    env: dict[str, str]
    env_files: tuple[str, ...]  # read by docker (the 0600 API key file); the key is never inline
    # Taken from the caller's environment by a hand-run only: `up` fetched the model already, so the
    # container it starts never needs the token.
    hand_run_env: tuple[str, ...]
    mounts: tuple[Mount, ...]
    devices: tuple[str, ...]  # host device paths, each at the same path inside
    gpus: bool  # every GPU, through a device request
    ulimits: dict[str, tuple[int, int]]
    shm_size: str | None  # None with the host's IPC namespace: /dev/shm is the host's, a size means nothing
    ipc_host: bool
    network_host: bool
    publish: tuple[tuple[str, int], ...]  # (host address, port), only without the host network
    memory_limit: str | None  # memory and memory+swap cap
    init: bool
    labels: dict[str, str]
    restart_policy: str
    healthcheck: Healthcheck | None  # None: serves no HTTP (a cluster worker), the image's check is off


def container_name_for(recipe_name: str) -> str:
    return f"sparkctl-{recipe_name}"


def _url_host(host: str) -> str:
    probe = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    return f"[{probe}]" if ":" in probe else probe


def _healthcheck(plan: Plan) -> Healthcheck:
    """GET /health from inside the container, as the engine's adapter says its image can."""
    from sparkctl.planner.adapters import adapter_for

    command = adapter_for(plan.engine).health_command(f"http://{_url_host(plan.host)}:{plan.port}/health")
    return Healthcheck(command=command, start_period_s=int(plan.health_timeout_s))


def container_run(plan: Plan) -> ContainerRun:
    """The container a docker Plan runs; a UserError for a Plan without container settings."""
    c = plan.container
    if c is None:
        raise UserError(
            f"recipe {plan.recipe_name} has no container settings for the docker runtime",
            hint="set container.image in the recipe, or use runtime: native",
        )
    if not plan.argv:
        raise UserError(f"recipe {plan.recipe_name} produced an empty engine command line")
    labels = {
        **c.labels,
        LABEL_MANAGED: "true",
        LABEL_RECIPE: plan.recipe_name,
        LABEL_RECIPE_HASH: plan.recipe_hash,
        LABEL_PORT: str(plan.port),
        LABEL_MODEL: plan.served_model_name,
    }
    mounts = tuple(Mount(str(Path(m.source).expanduser()), m.target, m.read_only) for m in c.mounts)
    return ContainerRun(
        image=c.image,
        name=c.name or container_name_for(plan.recipe_name),
        entrypoint=plan.argv[0],
        command=tuple(plan.argv[1:]),
        env={**plan.env, PORT_ENV: str(plan.port)},
        env_files=(plan.api_key_file,) if plan.api_key_file else (),
        hand_run_env=("HF_TOKEN",) if plan.model.needs_token else (),
        mounts=mounts,
        devices=tuple(c.devices),
        gpus=c.gpus,
        ulimits={k: (int(soft), int(hard)) for k, (soft, hard) in c.ulimits.items()},
        shm_size=None if c.ipc_host else c.shm_size,
        ipc_host=c.ipc_host,
        network_host=c.network_host,
        publish=() if c.network_host else ((plan.host, plan.port),),
        memory_limit=c.memory_limit,
        # An init as PID 1 forwards SIGTERM to the engine and reaps its workers; a bare Python as PID 1
        # ignores SIGTERM, so every stop would wait out the timeout and end in SIGKILL.
        init=True,
        labels=labels,
        restart_policy=c.restart_policy,
        healthcheck=_healthcheck(plan),
    )
