"""What the planner hands to a runtime: everything needed to start one server, nothing recipe-shaped.

This is the contract between the planner (recipe -> Plan) and the runtimes (Plan -> running server).
Runtimes never read a Recipe; the planner never talks to Docker or spawns a process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from sparkctl.models.source import ModelSource

__all__ = ["ContainerSpec", "LoadPolicy", "MemoryPlan", "ModelSource", "Mount", "Plan"]


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ContainerSpec:
    """Docker-only settings; `None` on a Plan for the native runtime."""

    image: str
    name: str
    gpus: bool = True  # request all GPUs through a device request
    network_host: bool = True
    ipc_host: bool = True
    shm_size: str | None = "16g"
    ulimits: dict[str, tuple[int, int]] = field(default_factory=dict)  # name -> (soft, hard)
    mounts: tuple[Mount, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    devices: tuple[str, ...] = ()  # host device paths passed through (e.g. /dev/infiniband for RDMA)
    memory_limit: str | None = None  # cgroup cap, docker's --memory (e.g. "112g")
    # "unless-stopped" with `up --persist`: the daemon starts it again after a reboot or a crash
    restart_policy: Literal["no", "unless-stopped"] = "no"


@dataclass(frozen=True)
class LoadPolicy:
    prewarm: Literal["auto", "always", "never"] = "auto"
    workers: int = 8
    evict_after_load: bool = True  # unified memory: drop cached shards once the server holds them


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes, all against the unified pool; `fits` False means `up` refuses unless forced."""

    total_bytes: int
    budget_bytes: int  # what the engine may use (utilisation x total, or weights + explicit KV bytes)
    weights_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    runtime_overhead_bytes: int
    max_context_tokens: int  # tokens the KV budget holds
    fits: bool
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Plan:
    recipe_name: str
    recipe_hash: str  # sha256 of the resolved recipe; carried as a container label / in state files
    runtime: Literal["docker", "native", "cluster"]
    engine: Literal["vllm", "llama.cpp", "freetoken"]
    argv: tuple[str, ...]  # the full engine command line, model argument included
    env: dict[str, str]
    host: str
    port: int
    served_model_name: str
    model: ModelSource
    load: LoadPolicy
    memory: MemoryPlan | None
    health_timeout_s: float
    container: ContainerSpec | None = None
    # What the engine computes on (recipe engine.device): doctor and `up` check for a GPU only for "cuda".
    device: Literal["cuda", "cpu"] = "cuda"
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()  # things to know that are not problems (e.g. start Ray on both nodes first)
    # The env file (paths.api_key_file, 0600) that hands the API key to the engine; None: no key. Only the
    # path is in a plan: a key is never on a command line, in a log or in a rendered file.
    api_key_file: str | None = None
    # memory.watchdog: (floor bytes, sample interval s); `up` starts sparkctl.watchdog once healthy
    watchdog: tuple[int, float] | None = None
    # component -> version the container image must carry (sparkctl/pins.py + the recipe's engine.pins);
    # doctor compares them with the image's io.sparkctl.pin.* labels. Empty for native runtimes.
    image_pins: dict[str, str] = field(default_factory=dict)
    # Serving across Sparks: the preflight's report and each node's launch (sparkctl.cluster.plan.ClusterPlan,
    # made from the node probes by `up`'s plan stage); runtime is then "cluster". Typed loosely: the planner
    # sits below the cluster package that defines it.
    cluster: Any = None

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"
