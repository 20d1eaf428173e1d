"""llama.cpp's llama-server: its command line (sparkctl's pinned build natively, the image's own in a
container), the GGUF it loads from a hub repo, its cache types, a KV allocated up front for all slots."""

from __future__ import annotations

import difflib

from sparkctl.errors import UserError
from sparkctl.planner import engine_bins
from sparkctl.planner.adapters.base import EngineAdapter
from sparkctl.planner.engines import _refuse_vllm_only
from sparkctl.recipe.schema import Recipe

LLAMACPP_KV_DTYPES = ("auto", "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")


def llamacpp_ctx_size(recipe: Recipe) -> int:
    """llama-server's --ctx-size: the KV total of all slots, so max_model_len for each of max_num_seqs.

    `-c` is not per sequence: with `-np 4 -c 2048` every slot gets 512 tokens. Rendering
    max_model_len x max_num_seqs keeps the recipe's promise (each sequence up to max_model_len, as in
    vLLM) and allocates exactly the KV the memory plan counts. With llama_cpp.kv_unified the same
    total becomes one shared pool, each slot capped at max_model_len by --kv-unified-per-slot.
    """
    return recipe.serve.max_model_len * (recipe.serve.max_num_seqs or 1)


def llamacpp_argv(recipe: Recipe, entrypoint: list[str], model: dict[str, str]) -> list[str]:
    """llama-server flags; `model` is {"path": file} or {"hf": "repo:quant"} / {"hf": repo, "file": f}."""
    serve = recipe.serve
    opts = recipe.engine.serve
    _refuse_vllm_only(recipe, "llama-server")
    argv = list(entrypoint)
    if "path" in model:
        argv += ["--model", model["path"]]
    else:
        argv += ["--hf-repo", model["hf"]]
        if "file" in model:
            argv += ["--hf-file", model["file"]]
    argv += ["--alias", serve.served_model_name or recipe.name]
    argv += ["--host", serve.host, "--port", str(serve.port)]
    # Explicit -np: left out, llama-server picks 4 slots and a unified KV ("auto"), which is not what
    # the memory plan counted.
    argv += ["--ctx-size", str(llamacpp_ctx_size(recipe)), "--parallel", str(serve.max_num_seqs or 1)]
    if opts.kv_unified:
        argv += ["--kv-unified", "--kv-unified-per-slot", str(serve.max_model_len)]
    argv += ["--n-gpu-layers", str(opts.n_gpu_layers if recipe.engine.device == "cuda" else 0)]
    if opts.cpu_moe:
        argv.append("--cpu-moe")
    if opts.n_cpu_moe is not None:
        argv += ["--n-cpu-moe", str(opts.n_cpu_moe)]
    if opts.override_tensor:
        argv += ["--override-tensor", ",".join(opts.override_tensor)]
    argv += ["--flash-attn", "on" if opts.flash_attn else "off"]
    if serve.kv_cache_dtype != "auto":
        argv += ["--cache-type-k", serve.kv_cache_dtype, "--cache-type-v", serve.kv_cache_dtype]
    batch = opts.batch_size or serve.max_num_batched_tokens
    if batch:
        argv += ["--batch-size", str(batch)]
    if opts.ubatch_size:
        argv += ["--ubatch-size", str(opts.ubatch_size)]
    if opts.threads:
        argv += ["--threads", str(opts.threads)]
    if opts.load_mode:
        argv += ["--load-mode", opts.load_mode]
    spec = opts.speculative
    if spec is not None:
        argv += ["--spec-type", spec.type]
        if spec.draft_model:
            argv += ["--spec-draft-model", spec.draft_model]
        if spec.draft_max is not None:
            argv += ["--spec-draft-n-max", str(spec.draft_max)]
        if spec.draft_min is not None:
            argv += ["--spec-draft-n-min", str(spec.draft_min)]
    if opts.metrics:
        argv.append("--metrics")
    if opts.jinja:
        argv.append("--jinja")
    if serve.chat_template:
        argv += ["--chat-template-file", serve.chat_template]
    argv += serve.extra_args
    return argv


class LlamaCppAdapter(EngineAdapter):
    name = "llama.cpp"
    api_key_env = "LLAMA_API_KEY"
    install_hint = "build the pinned llama-server: make llama-server"
    doctor_check = "llama.cpp"
    kv_up_front = True
    kv_owner = "llama-server"

    def entrypoint(self, recipe: Recipe, *, docker: bool) -> list[str]:
        # the image's own, or sparkctl's pinned build (`make llama-server`) / the one on PATH
        return ["llama-server"] if docker else [engine_bins.llama_server_command(recipe.engine.device)]

    def hub_model(self, recipe: Recipe, notes: list[str]) -> dict[str, str]:
        m = recipe.model
        if m.gguf_file:
            gguf = {"hf": m.repo, "file": m.gguf_file}
        elif m.quant:
            gguf = {"hf": f"{m.repo}:{m.quant}"}
        else:
            raise UserError(
                "a GGUF repo needs model.gguf_file or model.quant to pick the file llama-server loads"
            )
        if m.revision:
            notes.append(f"llama-server downloads the newest revision; {m.revision} is checked by `up` only")
        return gguf

    def argv(
        self,
        recipe: Recipe,
        entrypoint: list[str],
        model_arg: str,
        revision: str | None,
        gguf: dict[str, str],
    ) -> list[str]:
        return llamacpp_argv(recipe, entrypoint, gguf)

    def check_kv_dtype(self, recipe: Recipe) -> list[str]:
        dtype = recipe.serve.kv_cache_dtype
        if dtype not in LLAMACPP_KV_DTYPES:  # llama-server exits on an unknown cache type
            close = difflib.get_close_matches(dtype, LLAMACPP_KV_DTYPES, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise UserError(
                f"serve.kv_cache_dtype {dtype!r} is not a llama-server cache type; {hint}"
                f"valid: {', '.join(LLAMACPP_KV_DTYPES)}"
            )
        return []

    def kv_dtype(self, recipe: Recipe, dtype: str) -> str:
        if dtype == "bfloat16" and recipe.serve.kv_cache_dtype == "auto":
            return "f16"  # llama-server's default cache type
        return dtype


LLAMA_CPP = LlamaCppAdapter()
