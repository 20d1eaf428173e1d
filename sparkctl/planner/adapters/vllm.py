"""vLLM 0.33: its command line (`vllm serve` in the image, the api_server module natively), KV dtypes,
the flags upstream removed, the Python healthcheck its images need (no curl there)."""

from __future__ import annotations

import difflib
import json
import shlex
import sys
from typing import Any

from sparkctl.errors import UserError
from sparkctl.planner.adapters.base import EngineAdapter
from sparkctl.recipe.schema import Recipe

# flag -> why it cannot be used with vLLM 0.33
REMOVED_VLLM_FLAGS = {
    "--max-num-partial-prefills": "removed in vLLM 0.33 (vllm#49244); use long_prefill_token_threshold",
    "--max-long-partial-prefills": "removed in vLLM 0.33 (vllm#49244); use long_prefill_token_threshold",
}


# KV cache dtypes vLLM 0.33 `--kv-cache-dtype` accepts; platform-registered dtypes exist too, so an
# unknown name is a warning, not an error.
VLLM_KV_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "nvfp4_ds_mla",
    "nvfp4",
    "nvfp4_4over6",
    "int4_per_token_head",
    "int8_per_token_head",
    "fp8_per_token_head",
)
VLLM_KV_DTYPE_PREFIXES = ("turboquant_", "octave_", "ultraquant_")


def capture_sizes(recipe: Recipe) -> list[int] | None:
    """CUDA-graph batch sizes: explicit, or derived so every speculative verify batch has a graph.

    A verify step with draft depth k scores k+1 tokens per sequence, so batches of (k+1)*s tokens for
    s = 1..max_num_seqs occur on every decode step; without a captured graph for them decode runs
    eager. Powers of two up to the largest such batch cover prefill tails and partial batches.
    """
    serve = recipe.serve
    spec = serve.speculative
    if serve.cudagraph_capture_sizes is not None:
        sizes = sorted(set(serve.cudagraph_capture_sizes))
        if spec is not None and (spec.num_speculative_tokens + 1) not in sizes and not serve.enforce_eager:
            k = spec.num_speculative_tokens
            raise UserError(
                f"serve.cudagraph_capture_sizes {sizes} must include k+1 = {k + 1} when speculating with "
                f"num_speculative_tokens {k}",
                hint=f"add {k + 1}, or remove the list to have it derived",
            )
        return sizes
    if spec is None or serve.enforce_eager:
        return None
    step = spec.num_speculative_tokens + 1
    seqs = serve.max_num_seqs or 1
    largest = step * seqs
    sizes = {step * s for s in range(1, seqs + 1)}
    p = 1
    while p <= largest:
        sizes.add(p)
        p *= 2
    if serve.max_num_batched_tokens:
        sizes = {s for s in sizes if s <= serve.max_num_batched_tokens}
    return sorted(sizes)


def speculative_json(recipe: Recipe) -> str:
    spec = recipe.serve.speculative
    config: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
    if spec.model:
        config["model"] = spec.model
    config.update(spec.extra)
    return json.dumps(config, separators=(",", ":"))


def vllm_argv(recipe: Recipe, entrypoint: list[str], model_arg: str, revision: str | None) -> list[str]:
    serve = recipe.serve
    cluster = recipe.cluster
    argv = list(entrypoint)
    # `vllm serve` takes the model positionally; the api_server module wants --model
    if entrypoint and entrypoint[-1] == "serve":
        argv.append(model_arg)
    else:
        argv += ["--model", model_arg]
    if revision:
        argv += ["--revision", revision]
    argv += ["--served-model-name", serve.served_model_name or recipe.name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    if cluster.tensor_parallel > 1:
        argv += ["--tensor-parallel-size", str(cluster.tensor_parallel)]
    if cluster.pipeline_parallel > 1:
        argv += ["--pipeline-parallel-size", str(cluster.pipeline_parallel)]
    if cluster.executor:
        argv += ["--distributed-executor-backend", cluster.executor]
    quant = serve.quantization or ("exl3" if recipe.model.format == "exl3" else None)
    if quant:
        argv += ["--quantization", quant]
    if serve.dtype:
        argv += ["--dtype", serve.dtype]
    if serve.load_format:
        argv += ["--load-format", serve.load_format]
    if serve.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += ["--max-model-len", str(serve.max_model_len)]
    if serve.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(serve.kv_cache_memory_bytes)]
    elif serve.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", f"{serve.gpu_memory_utilization:g}"]
    if serve.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(serve.max_num_seqs)]
    if serve.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(serve.max_num_batched_tokens)]
    if serve.long_prefill_token_threshold is not None:
        argv += ["--long-prefill-token-threshold", str(serve.long_prefill_token_threshold)]
    if serve.enable_prefix_caching is True:
        argv.append("--enable-prefix-caching")
    elif serve.enable_prefix_caching is False:
        argv.append("--no-enable-prefix-caching")
    if serve.kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", serve.kv_cache_dtype]
    if serve.enforce_eager:
        argv.append("--enforce-eager")
    if serve.speculative is not None:
        argv += ["--speculative-config", speculative_json(recipe)]
    sizes = capture_sizes(recipe)
    if sizes:
        argv += ["--cudagraph-capture-sizes", *(str(s) for s in sizes)]
    if serve.tool_call_parser:
        argv += ["--tool-call-parser", serve.tool_call_parser]
    auto_tools = serve.enable_auto_tool_choice
    if auto_tools is None:
        auto_tools = serve.tool_call_parser is not None
    if auto_tools:
        argv.append("--enable-auto-tool-choice")
    if serve.reasoning_parser:
        argv += ["--reasoning-parser", serve.reasoning_parser]
    if serve.chat_template:
        argv += ["--chat-template", serve.chat_template]
    argv += serve.extra_args
    return argv


class VllmAdapter(EngineAdapter):
    name = "vllm"
    api_key_env = "VLLM_API_KEY"
    install_hint = "install the engine (for vLLM on the CPU: make install-vllm)"
    removed_flags = REMOVED_VLLM_FLAGS
    builds_image = True

    def entrypoint(self, recipe: Recipe, *, docker: bool) -> list[str]:
        return ["vllm", "serve"] if docker else [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]

    def argv(
        self,
        recipe: Recipe,
        entrypoint: list[str],
        model_arg: str,
        revision: str | None,
        gguf: dict[str, str],
    ) -> list[str]:
        argv = vllm_argv(recipe, entrypoint, model_arg, revision)
        if recipe.model.prepare is not None and recipe.model.prepare.chat_template:
            from sparkctl.prepare.plan import CHAT_TEMPLATE_NAME

            argv += ["--chat-template", f"{model_arg}/{CHAT_TEMPLATE_NAME}"]
        return argv

    def check_kv_dtype(self, recipe: Recipe) -> list[str]:
        dtype = recipe.serve.kv_cache_dtype
        if dtype in VLLM_KV_DTYPES or dtype.startswith(VLLM_KV_DTYPE_PREFIXES):
            return []
        close = difflib.get_close_matches(dtype, VLLM_KV_DTYPES, n=1)
        suggestion = f" (did you mean {close[0]!r}?)" if close else ""
        return [f"serve.kv_cache_dtype {dtype!r} is not a vLLM 0.33 built-in KV dtype{suggestion}"]

    def key_gate_args(self) -> tuple[str, ...]:
        from sparkctl.planner.keyed import KEY_GATE

        return ("--middleware", KEY_GATE)

    def check_model(self, recipe: Recipe, config: dict[str, Any] | None) -> None:
        """GLM-4-MoE in fp16 is wrong in vLLM 0.26 through 0.34: its MoE runner divides the shared experts'
        output by ``routed_scaling_factor`` in fp16 and leaves the rescale to the decoder layer, which
        GLM-4-MoE's does not do (top-1 agreement 0.61 against exllamav3 in the engine check, kernels/PERF.md,
        runs 4 and 6). bf16 or fp32 are exact."""
        if not config:
            return
        text = config.get("text_config") or config
        dtype = recipe.serve.dtype or "auto"
        fp16 = dtype in ("float16", "half") or (
            dtype == "auto" and str(text.get("torch_dtype") or config.get("torch_dtype")) == "float16"
        )
        glm4moe = any(a.startswith("Glm4Moe") for a in config.get("architectures") or ())
        scaled = float(text.get("routed_scaling_factor") or 1.0) != 1.0 and (
            text.get("n_shared_experts") or 0
        )
        if fp16 and glm4moe and scaled:
            raise UserError(
                f"{recipe.name}: vLLM computes GLM-4-MoE with shared experts wrongly in float16 (the shared "
                "experts' output is left divided by routed_scaling_factor)",
                hint="--set serve.dtype=bfloat16 (exact; float32 too)",
            )

    def fit_hint(self, recipe: Recipe) -> str:
        from sparkctl.planner.memory import gib

        s = recipe.serve
        if s.kv_cache_memory_bytes is not None:
            return (
                f"lower serve.max_model_len (now {s.max_model_len}) or adjust serve.kv_cache_memory_bytes "
                f"(now {gib(s.kv_cache_memory_bytes)}), e.g. --set serve.max_model_len=32768"
            )
        return (
            f"lower serve.max_model_len (now {s.max_model_len}), raise serve.gpu_memory_utilization, or use "
            "a kv_cache_dtype of fp8, e.g. --set serve.max_model_len=32768"
        )

    def health_command(self, url: str) -> str:
        # Python (vLLM images have no curl); the URL as an argument: the code needs no quotes of its own
        return (
            'python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" '
            + shlex.quote(url)
        )


VLLM = VllmAdapter()
