"""Every environment variable a built-in recipe (or its plan) sets has a reader: our code, the installed
vLLM's envs module, or a documented external reader. A variable nothing reads (another project's plugin
knob, say) does nothing in our image and only misleads whoever reads the recipe."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from sparkctl.planner import plan
from sparkctl.recipe import builtin_names, load_recipe

ROOT = Path(__file__).resolve().parents[2]
OUR_CODE = ("sparkctl", "kernels/sparkctl_exl3", "prewarm", "docker")

#: Readers outside Python packages we can inspect here (libraries, C++ runtimes), with where it is documented.
EXTERNAL_READERS = {
    "PYTORCH_CUDA_ALLOC_CONF": "torch's CUDA caching allocator (pytorch.org/docs/stable/notes/cuda.html)",
    "DO_NOT_TRACK": "vLLM usage stats, through VLLM_DO_NOT_TRACK's default in vllm/envs.py",
    "NCCL_IB_DISABLE": "NCCL (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)",
    "NCCL_IGNORE_CPU_AFFINITY": "NCCL",
    "NCCL_NET_GDR_LEVEL": "NCCL",
    "NCCL_SOCKET_IFNAME": "NCCL",
    "NCCL_IB_HCA": "NCCL",
    "NCCL_IB_GID_INDEX": "NCCL",
    "GLOO_SOCKET_IFNAME": "torch.distributed's Gloo backend",
    "TP_SOCKET_IFNAME": "torch's TensorPipe RPC backend",
    "UCX_NET_DEVICES": "UCX (openucx.readthedocs.io)",
    "OMPI_MCA_btl_tcp_if_include": "Open MPI's TCP transport",
    "MASTER_ADDR": "torch.distributed env:// rendezvous",
    "RAY_memory_monitor_refresh_ms": "Ray's memory monitor (docs.ray.io, out-of-memory prevention)",
    "RAY_NODE_IP_ADDRESS": "Ray node start-up",
    "RAY_OVERRIDE_NODE_IP_ADDRESS": "Ray node start-up",
}


def _env_vars() -> dict[str, set[str]]:
    """variable -> the recipes that set it (their env block and what the planner adds)."""
    found: dict[str, set[str]] = {}
    for name in builtin_names():
        recipe = load_recipe(name)
        for var in {*recipe.env, *plan(recipe, check_memory=False).env}:
            found.setdefault(var, set()).add(name)
    return found


def _our_readers() -> str:
    texts = []
    for top in OUR_CODE:
        for path in (ROOT / top).rglob("*"):
            if path.is_file() and path.suffix in {".py", ".sh", ".cpp", ".cu", ".h", ""}:
                texts.append(path.read_text(errors="ignore"))
    return "\n".join(texts)


def _vllm_envs_source() -> str | None:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return (Path(next(iter(spec.submodule_search_locations))) / "envs.py").read_text()


def test_every_recipe_env_var_has_a_reader() -> None:
    found = _env_vars()
    assert "PYTORCH_CUDA_ALLOC_CONF" in found  # the scan sees recipe env blocks
    ours = _our_readers()
    vllm_envs = _vllm_envs_source()
    unread = []
    for var, recipes in sorted(found.items()):
        if var in EXTERNAL_READERS:
            continue
        # our code reads it: an environ lookup or a settings table naming it, never just a comment
        if re.search(rf"[\"']{re.escape(var)}[\"']", ours):
            continue
        if var.startswith("VLLM_"):
            if vllm_envs is None:
                pytest.skip("vllm is not installed: cannot check VLLM_* variables against vllm/envs.py")
            if re.search(rf"^\s*\"{re.escape(var)}\":", vllm_envs, flags=re.MULTILINE):
                continue
        unread.append(f"{var} (set by {', '.join(sorted(recipes))})")
    assert not unread, "nothing reads: " + "; ".join(unread)


def test_the_other_projects_plugin_knobs_are_gone() -> None:
    # vllm-exl3 reads these; our image does not carry that plugin, so in our recipes they did nothing
    found = _env_vars()
    for var in ("EXL3_FUSED_MOE", "VLLM_EXL3_NGRAM_KERNEL", "VLLM_EXL3_PREFILL_SYNC"):
        assert var not in found, var
