"""Recipe -> Plan: everything a runtime needs to start one server, decided without touching the machine
(apart from reading the size of an already-present model directory and the host's RAM for CPU plans).
"""

from __future__ import annotations

import hashlib
import json
import os
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from sparkctl.errors import UserError
from sparkctl.models.generators import GENERATORS
from sparkctl.models.source import PrepareSteps
from sparkctl.planner.adapters import adapter_for
from sparkctl.planner.engines import check_extra_args, check_kv_dtype
from sparkctl.planner.memory import plan_memory
from sparkctl.planner.types import ContainerSpec, LoadPolicy, ModelSource, Mount, Plan

CONTAINER_MODEL_ROOT = "/models"
CONTAINER_HF_CACHE = "/root/.cache/huggingface"

# NCCL/Gloo/UCX/Ray settings for Sparks linked over ConnectX-7 (NVIDIA's two-Spark playbook and the
# community compose files): pin every transport to the CX7 netdev, keep IB on (off is ~4x slower),
# no GPUDirect RDMA on the GB10 iGPU, and stop Ray's memory monitor from killing workers mid-load.
_CLUSTER_IF_VARS = (
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "TP_SOCKET_IFNAME",
    "UCX_NET_DEVICES",
    "OMPI_MCA_btl_tcp_if_include",
)


def recipe_hash(recipe: Any) -> str:
    data = recipe.model_dump(mode="json", by_alias=True)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def model_source(recipe: Any) -> ModelSource:
    m = recipe.model
    if m.generate is not None and m.generate not in GENERATORS:
        raise UserError(
            f"recipe {recipe.name}: model.generate: unknown generator {m.generate!r}",
            hint=f"valid: {', '.join(sorted(GENERATORS))}",
        )
    return ModelSource(
        repo=m.repo,
        revision=m.revision,
        allow_patterns=tuple(m.allow_patterns),
        path=_abs(m.path) if m.path else None,
        generate=m.generate,
        format=m.format,
        expected_shards=m.expected_shards,
        expected_bytes=m.expected_bytes,
        needs_token=m.gated,
        prepare=prepare_steps(recipe),
    )


def prepare_steps(recipe: Any) -> PrepareSteps | None:
    """The recipe's prepare steps with the overlay they produce (the engine is pointed there)."""
    m, p = recipe.model, recipe.model.prepare
    if p is None:
        return None
    from sparkctl.prepare.layout import overlay_dir

    overlay = overlay_dir(
        repo=m.repo,
        revision=m.revision,
        path=m.path,
        generate=m.generate,
        index=p.index,
        config=p.config,
        chat_template=p.chat_template,
    )
    return PrepareSteps(index=p.index, config=p.config, chat_template=p.chat_template, overlay=str(overlay))


def _abs(path: str) -> str:
    """Absolute, `~` expanded, symlinks kept: docker bind mounts need absolute host paths."""
    return os.path.abspath(os.path.expanduser(path))


def default_entrypoint(recipe: Any) -> list[str]:
    if recipe.engine.entrypoint:
        return list(recipe.engine.entrypoint)
    return adapter_for(recipe.engine.name).entrypoint(recipe, docker=recipe.runtime == "docker")


def _pick_gguf(directory: Path, recipe: Any) -> str | None:
    """The GGUF file llama-server should open: the named one, or the first match (first shard of a split)."""
    m = recipe.model
    if m.gguf_file:
        return m.gguf_file
    try:
        files = sorted(p.relative_to(directory).as_posix() for p in directory.rglob("*.gguf"))
    except OSError:
        return None
    if m.allow_patterns:
        files = [
            f for f in files if any(fnmatch(f, pat) or fnmatch(Path(f).name, pat) for pat in m.allow_patterns)
        ]
    firsts = [f for f in files if "-00001-of-" in f]
    return (firsts or files or [None])[0]


def _local_dir(recipe: Any, model_path: str | None) -> str | None:
    """The host directory holding the model, when the plan can name one."""
    if model_path:
        return _abs(model_path)
    m = recipe.model
    steps = prepare_steps(recipe)
    if steps is not None:
        return steps.overlay  # `up` prepares it from the download, then serves it
    if m.path:
        return _abs(m.path)
    if m.generate:
        from sparkctl.paths import generated_model_dir

        return str(generated_model_dir(m.generate))
    return None


def plan(recipe: Any, *, model_path: str | None = None, check_memory: bool = True) -> Plan:
    """Turn a validated Recipe into a Plan.

    `model_path` is the resolved local model directory (after download/generation); for docker it is
    mounted read-only under /models and the command names the in-container path. Without it the command
    names the hub repo (the engine downloads into the mounted HF cache), the local path, or the
    generator's output directory.

    With `check_memory` (the default) a memory plan that cannot work raises UserError with the numbers;
    `show --no-check` passes False to display it anyway (the Plan then has memory.fits False).
    """
    warnings = check_extra_args(recipe) + check_kv_dtype(recipe)
    notes: list[str] = []
    rhash = recipe_hash(recipe)
    docker = recipe.runtime == "docker"
    engine = adapter_for(recipe.engine.name)
    entrypoint = default_entrypoint(recipe)
    mounts: list[Mount] = []

    local = _local_dir(recipe, model_path)
    model_arg: str
    revision: str | None = None
    gguf_model: dict[str, str] = {}
    if local is not None:
        host_dir = Path(local)
        arg_dir = host_dir
        if docker:
            arg_dir = Path(CONTAINER_MODEL_ROOT) / recipe.name
            mounts.append(Mount(source=str(host_dir), target=str(arg_dir), read_only=True))
        model_arg = str(arg_dir)
        if recipe.model.format == "gguf":
            if host_dir.suffix == ".gguf":
                gguf_model = {"path": model_arg}
            else:
                name = _pick_gguf(host_dir, recipe)
                if name is None:
                    raise UserError(
                        f"no .gguf file found in {host_dir}",
                        hint="set model.gguf_file or model.allow_patterns to the file to serve",
                    )
                gguf_model = {"path": str(arg_dir / name)}
    else:
        model_arg = recipe.model.repo
        revision = recipe.model.revision
        gguf_model = engine.hub_model(recipe, notes)

    argv = engine.argv(recipe, entrypoint, model_arg, revision, gguf_model)

    env = _env(recipe, warnings, notes)

    container = None
    if docker:
        c = recipe.container
        if c.hf_cache:
            mounts.append(Mount(source=_abs(c.hf_cache), target=CONTAINER_HF_CACHE))
        for mnt in c.mounts:
            mounts.append(Mount(source=_abs(mnt.source), target=mnt.target, read_only=mnt.read_only))
        steps = prepare_steps(recipe)
        if steps is not None and local == steps.overlay:
            for root in _overlay_link_roots(
                recipe, steps
            ):  # the overlay's links resolve in the container too
                mounts.append(Mount(source=root, target=root, read_only=True))
        container = ContainerSpec(
            image=c.image,
            name=c.name or f"sparkctl-{recipe.name}",
            gpus=c.gpus and recipe.engine.device == "cuda",
            network_host=c.network_host,
            ipc_host=c.ipc_host,
            shm_size=c.shm_size,
            ulimits={k: (v, v) for k, v in c.ulimits.items()},
            mounts=tuple(mounts),
            labels={"io.sparkctl.recipe": recipe.name, "io.sparkctl.recipe-hash": rhash},
            devices=tuple(c.devices),
            memory_limit=c.memory_limit,
        )

    if container is not None:
        warnings += _risky_mounts(container)

    spec = recipe.serve.speculative
    if (
        spec is not None
        and spec.acceptance_cliff_tokens
        and recipe.serve.max_model_len > spec.acceptance_cliff_tokens
    ):
        warnings.append(
            f"max_model_len {recipe.serve.max_model_len:,} is past the draft-acceptance cliff at "
            f"{spec.acceptance_cliff_tokens:,} prompt tokens: longer prompts decode slower with "
            f"{spec.method} than without it (--set serve.speculative=null to turn drafting off)"
        )
    if recipe.cluster.nodes > 1:
        notes.append(
            f"this is the head's command alone: `sparkctl up {recipe.name} --nodes HEAD,WORKER` checks all "
            f"{recipe.cluster.nodes} nodes and starts each one's part with its own environment "
            "(`--dry-run` prints them); the model must be at the same path on every node"
        )

    check = plan_memory(recipe, model_path=local if local and Path(local).exists() else None)
    if check.problems and check_memory:
        raise UserError(
            f"recipe {recipe.name} does not fit in memory: " + "; ".join(check.problems),
            hint=_fit_hint(recipe),
        )
    warnings += list(check.warnings)
    if check.problems:
        warnings += [f"does not fit: {p}" for p in check.problems]

    return Plan(
        recipe_name=recipe.name,
        recipe_hash=rhash,
        runtime=recipe.runtime,
        engine=recipe.engine.name,
        argv=tuple(argv),
        env=env,
        host=recipe.serve.host,
        port=recipe.serve.port,
        served_model_name=recipe.serve.served_model_name or recipe.name,
        model=model_source(recipe),
        load=LoadPolicy(
            prewarm=recipe.load.prewarm,
            workers=recipe.load.workers,
            evict_after_load=recipe.load.evict_after_load,
        ),
        memory=check.plan,
        health_timeout_s=recipe.serve.health_timeout_s,
        container=container,
        device=recipe.engine.device,
        warnings=tuple(warnings),
        notes=tuple(notes),
        api_key_file=_api_key_file(recipe),
        watchdog=(recipe.memory.watchdog.floor_bytes, recipe.memory.watchdog.interval_s)
        if recipe.memory.watchdog
        else None,
        image_pins=recipe.engine.effective_pins() if recipe.runtime == "docker" else {},
    )


def _overlay_link_roots(recipe: Any, steps: PrepareSteps) -> list[str]:
    """Host directories the prepare overlay's links point into, mounted at their own path.

    From the overlay itself once it exists; before that, where the download will be: the repo's blob
    store in the mounted HF cache, or the local model directory.
    """
    overlay = Path(steps.overlay)
    if overlay.is_dir():
        roots = {str(Path(os.path.realpath(p)).parent) for p in overlay.rglob("*") if p.is_symlink()}
        return sorted(roots)
    m = recipe.model
    if m.repo and recipe.container.hf_cache:
        return [
            os.path.join(
                _abs(recipe.container.hf_cache), "hub", "models--" + m.repo.replace("/", "--"), "blobs"
            )
        ]
    if m.path:
        return [os.path.realpath(_abs(m.path))]
    return []


def _fit_hint(recipe: Any) -> str:
    return adapter_for(recipe.engine.name).fit_hint(recipe)


def _env(recipe: Any, warnings: list[str], notes: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    cluster = recipe.cluster
    if cluster.nodes > 1:
        env["RAY_memory_monitor_refresh_ms"] = "0"
        env["NCCL_IB_DISABLE"] = "0"
        env["NCCL_IGNORE_CPU_AFFINITY"] = "1"
        env["NCCL_NET_GDR_LEVEL"] = "0"
        if cluster.interface:
            for var in _CLUSTER_IF_VARS:
                env[var] = cluster.interface
        else:
            warnings.append("cluster.interface not set: NCCL may pick the wrong NIC (see `ibdev2netdev`)")
        if cluster.ib_hca:
            env["NCCL_IB_HCA"] = ",".join(cluster.ib_hca)
        if cluster.ib_gid_index is not None:
            env["NCCL_IB_GID_INDEX"] = str(cluster.ib_gid_index)
        if cluster.head_address:
            for var in ("VLLM_HOST_IP", "MASTER_ADDR", "RAY_NODE_IP_ADDRESS", "RAY_OVERRIDE_NODE_IP_ADDRESS"):
                env[var] = cluster.head_address
        else:
            warnings.append(
                "cluster.head_address not set: pass the head's ConnectX-7 address with "
                "--set cluster.head_address=192.168.100.x"
            )
    env.update(recipe.env_strings())
    return env


def _api_key_file(recipe: Any) -> str | None:
    """The key env file the engine reads its API key from: when the recipe names a key file (`up` writes
    the env file from it), or when a key was stored for this recipe before (`up --api-key`)."""
    from sparkctl.paths import api_key_file

    path = api_key_file(recipe.name)
    return str(path) if recipe.serve.api_key_file or path.exists() else None


# Host paths that hand the container the whole machine: the engine (and any model code it runs with
# trust_remote_code) could then read the HF token, start containers of its own, or read physical memory.
_RISKY_HOST_PATHS = {
    "/": "the whole host filesystem",
    "/var/run/docker.sock": "the Docker socket (root on the host)",
    "/run/docker.sock": "the Docker socket (root on the host)",
    "/dev/mem": "physical memory",
    "/dev/kmem": "kernel memory",
}


def _risky_mounts(container: ContainerSpec) -> list[str]:
    out = []
    for source, kind in [(m.source, "mount") for m in container.mounts] + [
        (d, "device") for d in container.devices
    ]:
        what = _RISKY_HOST_PATHS.get(os.path.normpath(source))
        if what:
            out.append(f"container {kind} {source} gives the engine {what}; remove it unless you mean it")
    return out
