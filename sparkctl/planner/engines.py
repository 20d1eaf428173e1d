"""Checks every engine's command line shares: serve.extra_args (no key on a command line, no flag the
engine removed upstream: vLLM would otherwise exit with `unrecognized arguments` after the image is
pulled) and the vLLM-only settings an other engine must not carry. Each engine's own flags are built by
its adapter (sparkctl.planner.adapters)."""

from __future__ import annotations

from sparkctl.errors import UserError
from sparkctl.recipe.schema import Recipe


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def check_kv_dtype(recipe: Recipe) -> list[str]:
    """Unknown KV dtypes: the engine's adapter says (an error where the engine exits on them)."""
    from sparkctl.planner.adapters import adapter_for

    return adapter_for(recipe.engine.name).check_kv_dtype(recipe)


def check_extra_args(recipe: Recipe) -> list[str]:
    """Refuse removed flags; return warnings for flags known to misbehave."""
    from sparkctl.planner.adapters import adapter_for

    warnings = []
    args = recipe.serve.extra_args
    for i, arg in enumerate(args):
        name = _flag_name(arg)
        if name == "--api-key":
            raise UserError(
                "serve.extra_args: --api-key here would be written into the log and every rendered command",
                hint="pass it with `sparkctl up --api-key KEY` or serve.api_key_file (the engine gets it "
                "through its environment)",
            )
        removed = adapter_for(recipe.engine.name).removed_flags
        if name in removed:
            raise UserError(f"serve.extra_args: {name} is {removed[name]}")
        nxt = args[i + 1] if i + 1 < len(args) else ""
        value = arg.split("=", 1)[1] if "=" in arg else nxt
        if name == "--moe-backend" and value == "marlin" and recipe.model.format == "exl3":
            warnings.append("serve.extra_args: --moe-backend marlin is wrong for EXL3 packs (GK2)")
    return warnings


# vLLM-only settings a llama.cpp or FreeToken recipe must not carry (they would be silently meaningless)
_VLLM_ONLY = (
    "gpu_memory_utilization",
    "kv_cache_memory_bytes",
    "long_prefill_token_threshold",
    "enable_prefix_caching",
    "speculative",
    "cudagraph_capture_sizes",
    "quantization",
    "load_format",
    "tool_call_parser",
    "reasoning_parser",
)
# ... of which FreeToken has its own spelling
_FREETOKEN_HAS = ("tool_call_parser", "reasoning_parser")


def _refuse_vllm_only(recipe: Recipe, engine: str, allowed: tuple[str, ...] = ()) -> None:
    serve = recipe.serve
    for name in _VLLM_ONLY:
        if name not in allowed and getattr(serve, name) is not None:
            raise UserError(f"serve.{name} is a vLLM setting; {engine} has no equivalent", hint="remove it")
    if recipe.cluster.nodes > 1:
        raise UserError(f"{recipe.engine.name} recipes run on one Spark (cluster.nodes must be 1)")
