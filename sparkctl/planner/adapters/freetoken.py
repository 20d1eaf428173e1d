"""FreeToken (`ft serve`): MoE experts offloaded to host RAM, NVIDIA GPUs only; its own venv natively."""

from __future__ import annotations

from sparkctl.errors import UserError
from sparkctl.planner import engine_bins
from sparkctl.planner.adapters.base import EngineAdapter
from sparkctl.planner.engines import _FREETOKEN_HAS, _refuse_vllm_only
from sparkctl.recipe.schema import Recipe


def freetoken_argv(recipe: Recipe, entrypoint: list[str], model_arg: str) -> list[str]:
    """`ft serve` flags (FreeToken 0.2's CLI); `model_arg` is a local dir, a .gguf file or a hub repo id."""
    serve = recipe.serve
    opts = recipe.engine.serve
    _refuse_vllm_only(recipe, "FreeToken", allowed=_FREETOKEN_HAS)
    argv = list(entrypoint)
    argv += ["--model-path", model_arg]
    argv += ["--served-model-name", serve.served_model_name or recipe.name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    argv += ["--max-seq-len-override", str(serve.max_model_len)]
    if serve.max_num_seqs is not None:
        argv += ["--max-running-requests", str(serve.max_num_seqs)]
    if serve.dtype:
        argv += ["--dtype", serve.dtype]
    argv += ["--moe-strategy", opts.moe_strategy]
    if opts.moe_cache_mem:
        argv += ["--moe-cache-mem", opts.moe_cache_mem.replace(" ", "")]
    if opts.moe_cache_rate is not None:
        argv += ["--moe-cache-rate", f"{opts.moe_cache_rate:g}"]
    if opts.moe_cpu_threads is not None:
        argv += ["--moe-cpu-threads", str(opts.moe_cpu_threads)]
    if opts.memory_ratio is not None:
        argv += ["--memory-ratio", f"{opts.memory_ratio:g}"]
    if opts.cuda_graph_max_bs is not None:
        argv += ["--cuda-graph-max-bs", str(opts.cuda_graph_max_bs)]
    if opts.cache_type:
        argv += ["--cache-type", opts.cache_type]
    if serve.tool_call_parser:
        argv += ["--tool-call-parser", serve.tool_call_parser]
    if serve.reasoning_parser:
        argv += ["--reasoning-parser", serve.reasoning_parser]
    argv += serve.extra_args
    return argv


class FreeTokenAdapter(EngineAdapter):
    name = "freetoken"
    api_key_env = "VLLM_API_KEY"
    install_hint = "install FreeToken into its venv: make freetoken"
    doctor_check = "freetoken"
    kv_up_front = True
    kv_owner = "FreeToken (at least)"

    def entrypoint(self, recipe: Recipe, *, docker: bool) -> list[str]:
        return ["ft" if docker else engine_bins.freetoken_command(), "serve"]

    def argv(
        self,
        recipe: Recipe,
        entrypoint: list[str],
        model_arg: str,
        revision: str | None,
        gguf: dict[str, str],
    ) -> list[str]:
        return freetoken_argv(recipe, entrypoint, gguf.get("path") or model_arg)

    def check_kv_dtype(self, recipe: Recipe) -> list[str]:
        dtype = recipe.serve.kv_cache_dtype
        if dtype != "auto":
            raise UserError(
                f"serve.kv_cache_dtype {dtype!r}: FreeToken picks its KV dtype itself", hint="remove it"
            )
        return []


FREETOKEN = FreeTokenAdapter()
