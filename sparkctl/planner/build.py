"""Recipe -> Plan: everything a runtime needs to start one server, decided without touching the machine
(apart from reading the size of an already-present model directory and the host's RAM for CPU plans).
"""

from __future__ import annotations

import hashlib
import json
import os
from fnmatch import fnmatch
from pathlib import Path

from sparkctl.errors import UserError
from sparkctl.models.generators import GENERATORS
from sparkctl.models.source import PrepareSteps
from sparkctl.planner.adapters import adapter_for
from sparkctl.planner.engines import check_extra_args, check_kv_dtype
from sparkctl.planner.facts import Facts
from sparkctl.planner.keyed import with_key_file
from sparkctl.planner.memory import plan_memory
from sparkctl.planner.types import ContainerSpec, LoadPolicy, ModelSource, Mount, Plan
from sparkctl.recipe.schema import Recipe

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


def recipe_hash(recipe: Recipe) -> str:
    data = recipe.model_dump(mode="json", by_alias=True)
    blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def model_source(recipe: Recipe) -> ModelSource:
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
        path=abs_path(m.path) if m.path else None,
        generate=m.generate,
        format=m.format,
        expected_shards=m.expected_shards,
        expected_bytes=m.expected_bytes,
        needs_token=m.gated,
        prepare=prepare_steps(recipe),
    )


def prepare_steps(recipe: Recipe) -> PrepareSteps | None:
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


def abs_path(path: str) -> str:
    """Absolute, `~` expanded, symlinks kept: docker bind mounts need absolute host paths."""
    return os.path.abspath(os.path.expanduser(path))


def default_entrypoint(recipe: Recipe) -> list[str]:
    if recipe.engine.entrypoint:
        return list(recipe.engine.entrypoint)
    return adapter_for(recipe.engine.name).entrypoint(recipe, docker=recipe.runtime == "docker")


def _pick_gguf(files: tuple[str, ...], recipe: Recipe) -> str | None:
    """The GGUF file llama-server should open: the named one, or the first match (first shard of a split)."""
    m = recipe.model
    if m.gguf_file:
        return m.gguf_file
    picked = list(files)
    if m.allow_patterns:
        picked = [
            f
            for f in picked
            if any(fnmatch(f, pat) or fnmatch(Path(f).name, pat) for pat in m.allow_patterns)
        ]
    firsts = [f for f in picked if "-00001-of-" in f]
    return (firsts or picked or [None])[0]


def local_dir(recipe: Recipe, model_path: str | None) -> str | None:
    """The host directory holding the model, when the plan can name one."""
    if model_path:
        return abs_path(model_path)
    m = recipe.model
    steps = prepare_steps(recipe)
    if steps is not None:
        return steps.overlay  # `up` prepares it from the download, then serves it
    if m.path:
        return abs_path(m.path)
    if m.generate:
        from sparkctl.paths import generated_model_dir

        return str(generated_model_dir(m.generate))
    return None


def plan(recipe: Recipe, *, model_path: str | None = None, check_memory: bool = True) -> Plan:
    """Gather this machine's facts for `recipe` (planner.facts), then plan from them (`make_plan`).

    `model_path` is the resolved local model directory (after download/generation); for docker it is
    mounted read-only under /models and the command names the in-container path. Without it the command
    names the hub repo (the engine downloads into the mounted HF cache), the local path, or the
    generator's output directory.
    """
    from sparkctl.planner.facts import gather_facts

    return make_plan(recipe, gather_facts(recipe, model_path), check_memory=check_memory)


def container_mounts(recipe: Recipe, facts: Facts) -> list[Mount]:
    """Every mount of a docker plan but the link targets, decided here only: the model directory, the
    HF cache, the recipe's own, and where a prepared overlay's links point. [] for a native plan."""
    if recipe.runtime != "docker":
        return []
    mounts: list[Mount] = []
    if facts.model_dir is not None:
        target = str(Path(CONTAINER_MODEL_ROOT) / recipe.name)
        mounts.append(Mount(source=str(Path(facts.model_dir)), target=target, read_only=True))
    c = recipe.container
    if c.hf_cache:
        mounts.append(Mount(source=abs_path(c.hf_cache), target=CONTAINER_HF_CACHE))
    for mnt in c.mounts:
        mounts.append(Mount(source=abs_path(mnt.source), target=mnt.target, read_only=mnt.read_only))
    steps = prepare_steps(recipe)
    if steps is not None and facts.model_dir == steps.overlay:
        for root in facts.overlay_link_roots:  # the overlay's links resolve in the container too
            mounts.append(Mount(source=root, target=root, read_only=True))
    return mounts


def make_plan(recipe: Recipe, facts: Facts, *, check_memory: bool = True) -> Plan:
    """Turn a validated Recipe and the facts gathered about this machine into a Plan; no I/O.

    With `check_memory` (the default) a memory plan that cannot work raises UserError with the numbers;
    `show --no-check` passes False to display it anyway (the Plan then has memory.fits False).
    """
    warnings = check_extra_args(recipe) + check_kv_dtype(recipe)
    notes: list[str] = []
    rhash = recipe_hash(recipe)
    docker = recipe.runtime == "docker"
    engine = adapter_for(recipe.engine.name)
    engine.check_model(recipe, facts.model_config)
    entrypoint = list(facts.entrypoint) or default_entrypoint(recipe)

    local = facts.model_dir
    model_arg: str
    revision: str | None = None
    gguf_model: dict[str, str] = {}
    if local is not None:
        host_dir = Path(local)
        arg_dir = Path(CONTAINER_MODEL_ROOT) / recipe.name if docker else host_dir
        model_arg = str(arg_dir)
        if recipe.model.format == "gguf":
            if host_dir.suffix == ".gguf":
                gguf_model = {"path": model_arg}
            else:
                name = _pick_gguf(facts.gguf_files, recipe)
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
        mounts = [*container_mounts(recipe, facts), *facts.link_mounts]
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

    check = plan_memory(
        recipe,
        model_config=facts.model_config,
        weights_bytes=facts.weights_bytes,
        host_bytes=facts.host_memory_bytes,
    )
    if check.problems and check_memory:
        raise UserError(
            f"recipe {recipe.name} does not fit in memory: " + "; ".join(check.problems),
            hint=_fit_hint(recipe),
        )
    warnings += list(check.warnings)
    if check.problems:
        warnings += [f"does not fit: {p}" for p in check.problems]

    plan = Plan(
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
        watchdog=(recipe.memory.watchdog.floor_bytes, recipe.memory.watchdog.interval_s)
        if recipe.memory.watchdog
        else None,
        image_pins=recipe.engine.effective_pins() if recipe.runtime == "docker" else {},
    )
    return with_key_file(plan, facts.api_key_file)


def _fit_hint(recipe: Recipe) -> str:
    return adapter_for(recipe.engine.name).fit_hint(recipe)


def _env(recipe: Recipe, warnings: list[str], notes: list[str]) -> dict[str, str]:
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
