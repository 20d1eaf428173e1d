"""The recipe schema (`schema: 1`): one pydantic model per YAML block, every field documented.

The models check shape only: types, ranges and fields that exclude each other. Whether a recipe fits the
machine (memory, engine support for a flag) is the planner's job, because it depends on more than one
block. Every model forbids unknown keys, so a misspelt key is an error with a suggestion, never a
silently ignored setting that turns into a default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GiB = 1024**3

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"

Scalar = str | int | float | bool


class Strict(BaseModel):
    """Base: unknown keys are errors, values are not coerced across types (a string is not a number)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class KVGeometry(Strict):
    """How many bytes one token of context costs in the KV cache, from the attention geometry."""

    layers: Annotated[
        int,
        Field(
            gt=0,
            description="Layers that keep a KV cache. For hybrid models (linear attention / mamba) count only "
            "the full-attention layers.",
        ),
    ]
    kv_heads: Annotated[
        int | None, Field(default=None, gt=0, description="Key/value heads per layer (GQA/MHA models).")
    ]
    head_dim: Annotated[int | None, Field(default=None, gt=0, description="Dimension of one attention head.")]
    mla_dim: Annotated[
        int | None,
        Field(
            default=None,
            gt=0,
            description="Latent width per token per layer for MLA models (kv_lora_rank + qk_rope_head_dim; "
            "576 for the DeepSeek/GLM MLA family). Mutually exclusive with kv_heads/head_dim.",
        ),
    ]
    bytes_per_token: Annotated[
        int | None,
        Field(
            default=None,
            gt=0,
            description="Explicit KV bytes per token (all layers, at the serving KV dtype). Overrides the "
            "geometry when the model's layout is unusual.",
        ),
    ]

    @model_validator(mode="after")
    def _one_geometry(self) -> KVGeometry:
        has_mha = self.kv_heads is not None or self.head_dim is not None
        if self.bytes_per_token is None:
            if self.mla_dim is not None and has_mha:
                raise ValueError("set either mla_dim (MLA) or kv_heads + head_dim (MHA/GQA), not both")
            if self.mla_dim is None and (self.kv_heads is None or self.head_dim is None):
                raise ValueError("needs mla_dim, or both kv_heads and head_dim, or bytes_per_token")
        return self


class PrepareSpec(Strict):
    """What the prepare stage makes of a published pack before vLLM loads it (never editing the download).

    `up` (and `sparkctl prepare`) builds an overlay directory of links to the downloaded files plus the
    files rewritten here, under the sparkctl cache, keyed by the pack and its revision; the engine is
    pointed at the overlay. Deleting the overlay undoes it (`sparkctl prepare RECIPE --remove`).
    """

    index: Annotated[
        bool,
        Field(
            default=False,
            description="Regenerate model.safetensors.index.json from every *.safetensors file's header "
            "(a shipped index that omits files, e.g. an n-gram table, makes vLLM skip their tensors).",
        ),
    ]
    config: Annotated[
        bool,
        Field(
            default=False,
            description="Rewrite config.json as the exl3 plugin reads it: quantization_config declared at "
            "the top level (a stale text_config one removed), codebook from the tensor markers, the n-gram "
            "table described, tie_word_embeddings off when the pack stores its own lm_head.",
        ),
    ]
    chat_template: Annotated[
        str | None,
        Field(
            default=None,
            description="A chat template shipped with sparkctl (sparkctl/prepare/templates/NAME.jinja), "
            "written into the overlay as chat_template.jinja and passed as --chat-template.",
        ),
    ]

    @model_validator(mode="after")
    def _something(self) -> PrepareSpec:
        if not (self.index or self.config or self.chat_template):
            raise ValueError("prepare needs at least one of index, config or chat_template (or drop it)")
        if self.chat_template is not None:
            from sparkctl.prepare.chat_templates import shipped_templates

            if self.chat_template not in shipped_templates():
                raise ValueError(
                    f"unknown chat_template {self.chat_template!r}; shipped: {', '.join(shipped_templates())}"
                )
        return self


class ModelSpec(Strict):
    """Where the weights come from and what they must look like once fetched."""

    repo: Annotated[
        str | None,
        Field(default=None, description="Hugging Face repo id (owner/name) to download the model from."),
    ]
    revision: Annotated[
        str | None,
        Field(
            default=None,
            description="Pinned commit sha, tag or branch of `repo`. A commit sha makes the recipe reproducible.",
        ),
    ]
    path: Annotated[
        str | None,
        Field(default=None, description="A local directory that already holds the model (no download)."),
    ]
    generate: Annotated[
        str | None,
        Field(
            default=None,
            description="Name of a local generator that makes a small model on first use (tests, `tiny`). "
            "See sparkctl/models/generators.py.",
        ),
    ]
    allow_patterns: Annotated[
        list[str],
        Field(default_factory=list, description="Only download files matching these globs (all when empty)."),
    ]
    format: Annotated[
        Literal["exl3", "gguf", "safetensors"],
        Field(
            default="safetensors",
            description="Weight format: exl3 (EXL3 trellis packs), gguf or safetensors.",
        ),
    ]
    quant: Annotated[
        str | None,
        Field(
            default=None,
            description="Quantisation label shown by `list` (e.g. K2, 3.05bpw, IQ3_S). For GGUF repos served "
            "straight from the hub it selects the file (llama-server -hf repo:quant).",
        ),
    ]
    gguf_file: Annotated[
        str | None,
        Field(
            default=None,
            description="GGUF file inside the model directory (the first shard of a split). Found by "
            "allow_patterns when unset.",
        ),
    ]
    expected_shards: Annotated[
        int | None,
        Field(default=None, gt=0, description="Number of weight files the download must contain (verified)."),
    ]
    expected_bytes: Annotated[
        int | None,
        Field(
            default=None,
            gt=0,
            description="Total bytes of the weight files on disk (verified after download).",
        ),
    ]
    gated: Annotated[
        bool, Field(default=False, description="The repo needs a Hugging Face token (doctor checks for one).")
    ]
    kv: Annotated[
        KVGeometry | None,
        Field(
            default=None,
            description="Attention geometry, used to size the KV cache in the memory plan. When unset, it is "
            "read from the model's config.json once the model is local.",
        ),
    ]
    prepare: Annotated[
        PrepareSpec | None,
        Field(
            default=None,
            description="Fix-ups the published pack needs before the engine can load it, made in an overlay "
            "of links (the download stays pristine).",
        ),
    ]

    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        sources = [name for name in ("repo", "path", "generate") if getattr(self, name)]
        if len(sources) != 1:
            got = ", ".join(sources) if sources else "none"
            raise ValueError(f"set exactly one of repo, path or generate (got {got})")
        if self.revision and not self.repo:
            raise ValueError("revision only applies to a hub repo")
        if self.repo and self.repo.count("/") != 1:
            raise ValueError(f"repo must look like owner/name, got {self.repo!r}")
        return self


class EngineSpec(Strict):
    """Which inference engine serves the model, and the versions it was validated with."""

    name: Annotated[
        Literal["vllm", "llama.cpp"], Field(default="vllm", description="vllm or llama.cpp (llama-server).")
    ]
    version: Annotated[
        str | None,
        Field(default=None, description="Engine version the recipe's flags are written for (e.g. 0.33.0)."),
    ]
    device: Annotated[
        Literal["cuda", "cpu"],
        Field(
            default="cuda",
            description="cuda: the Spark's GPU and its unified memory pool; cpu: host RAM (the `tiny` recipe "
            "on machines without a GPU).",
        ),
    ]
    entrypoint: Annotated[
        list[str] | None,
        Field(
            default=None,
            description="Command prefix before the engine flags. Default: `vllm serve` in a container, "
            "`<python> -m vllm.entrypoints.openai.api_server` natively, `llama-server` for llama.cpp.",
        ),
    ]
    pins: Annotated[
        dict[str, str],
        Field(
            default_factory=dict,
            description="Extra component -> version or commit the image must contain (e.g. exllamav3). The "
            "engine release's own pins (torch, flashinfer, cuda, ...) come from sparkctl/pins.py and need not be "
            "repeated; a pin here that contradicts them is an error. Doctor compares them with the image's labels.",
        ),
    ]

    @model_validator(mode="after")
    def _pins_agree(self) -> EngineSpec:
        from sparkctl.pins import conflicts, pins_for

        release = pins_for(self.name, self.version)
        bad = conflicts(release, self.pins) if release else []
        if bad:
            raise ValueError(f"pins contradict sparkctl's pins for this engine release: {'; '.join(bad)}")
        return self

    def effective_pins(self) -> dict[str, str]:
        """The engine release's pins with the recipe's extra pins on top (what the image must carry)."""
        from sparkctl.pins import pins_for

        release = pins_for(self.name, self.version)
        return {**(release.components() if release else {}), **self.pins}


class Speculative(Strict):
    """Speculative decoding, passed to vLLM as `--speculative-config` JSON."""

    method: Annotated[
        Literal["mtp", "ngram", "eagle", "eagle3", "dflash", "dspark", "draft_model", "suffix"],
        Field(description="Draft method. Use `mtp` for multi-token-prediction heads (vLLM 0.33 name)."),
    ]
    num_speculative_tokens: Annotated[
        int, Field(gt=0, le=16, description="Draft depth k; each verify step scores k+1 tokens.")
    ]
    model: Annotated[
        str | None, Field(default=None, description="Draft model (repo or path) for draft-model methods.")
    ]
    acceptance_cliff_tokens: Annotated[
        int | None,
        Field(
            default=None,
            gt=0,
            description="Prompt length beyond which draft acceptance is known to collapse; the planner warns "
            "when max_model_len exceeds it.",
        ),
    ]
    extra: Annotated[
        dict[str, Any],
        Field(default_factory=dict, description="More keys merged into the speculative-config JSON."),
    ]


class LlamaCppOptions(Strict):
    """llama-server options without a vLLM counterpart."""

    n_gpu_layers: Annotated[int, Field(default=99, ge=0, description="Layers offloaded to the GPU (-ngl).")]
    flash_attn: Annotated[bool, Field(default=True, description="Flash attention (-fa on|off).")]
    threads: Annotated[int | None, Field(default=None, gt=0, description="CPU threads (-t).")]
    batch_size: Annotated[int | None, Field(default=None, gt=0, description="Logical batch size (-b).")]
    ubatch_size: Annotated[int | None, Field(default=None, gt=0, description="Physical batch size (-ub).")]
    jinja: Annotated[
        bool, Field(default=True, description="Use the model's Jinja chat template (needed for tool calls).")
    ]


class ServeSpec(Strict):
    """The server's flags. Names follow vLLM 0.33; llama.cpp recipes map the common ones."""

    host: Annotated[
        str, Field(default="127.0.0.1", description="Address to listen on (0.0.0.0 to serve the LAN).")
    ]
    port: Annotated[int, Field(default=8000, gt=0, lt=65536, description="TCP port of the OpenAI API.")]
    served_model_name: Annotated[
        str | None, Field(default=None, description="Model name clients send; defaults to the recipe name.")
    ]
    health_timeout_s: Annotated[
        float,
        Field(
            default=1800.0,
            gt=0,
            description="How long `up` waits for /health; a 91 GiB EXL3 pack loads in ~12 min from cold NVMe.",
        ),
    ]
    max_model_len: Annotated[int, Field(gt=0, description="Context length (prompt + output) per sequence.")]
    gpu_memory_utilization: Annotated[
        float | None,
        Field(
            default=None,
            gt=0,
            le=1,
            description="Fraction of the whole unified pool vLLM may use (weights + KV + activations). "
            "Mutually exclusive with kv_cache_memory_bytes. vLLM's default is 0.92.",
        ),
    ]
    kv_cache_memory_bytes: Annotated[
        int | None,
        Field(
            default=None,
            gt=0,
            description="Explicit KV cache size in bytes; skips vLLM's memory profiling (reproducible pools "
            "on unified memory). Mutually exclusive with gpu_memory_utilization.",
        ),
    ]
    max_num_seqs: Annotated[int | None, Field(default=None, gt=0, description="Concurrent sequences.")]
    max_num_batched_tokens: Annotated[
        int | None, Field(default=None, gt=0, description="Per-step token budget (vLLM picks 2048 on GB10).")
    ]
    long_prefill_token_threshold: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description="Prompts longer than this are prefilled in chunks of at most this many tokens, so "
            "they do not starve running decodes (1024 recommended on Spark; 0 disables).",
        ),
    ]
    enable_prefix_caching: Annotated[
        bool | None,
        Field(default=None, description="Reuse the KV of shared prompt prefixes (vLLM default: on)."),
    ]
    kv_cache_dtype: Annotated[
        str,
        Field(
            default="auto",
            description="KV cache dtype: auto, bfloat16, float16, fp8 (= fp8_e4m3), fp8_e5m2, ... For "
            "llama.cpp: f16, q8_0, q4_0 ...",
        ),
    ]
    dtype: Annotated[
        Literal["auto", "float32", "bfloat16", "float16"] | None,
        Field(default=None, description="Activation / unquantized weight dtype (--dtype)."),
    ]
    quantization: Annotated[
        str | None,
        Field(default=None, description="--quantization; defaults to `exl3` for EXL3 packs."),
    ]
    load_format: Annotated[
        str | None, Field(default=None, description="--load-format (auto, fastsafetensors, ...).")
    ]
    enforce_eager: Annotated[
        bool, Field(default=False, description="No torch.compile and no CUDA graphs (slower, starts sooner).")
    ]
    trust_remote_code: Annotated[bool, Field(default=False, description="Run the model repo's Python code.")]
    cudagraph_capture_sizes: Annotated[
        list[Annotated[int, Field(gt=0)]] | None,
        Field(
            default=None,
            description="Batch sizes captured as CUDA graphs. Derived when speculating (so that k+1 and its "
            "multiples are captured); if given, it must contain k+1.",
        ),
    ]
    speculative: Annotated[Speculative | None, Field(default=None, description="Speculative decoding.")]
    tool_call_parser: Annotated[str | None, Field(default=None, description="--tool-call-parser.")]
    enable_auto_tool_choice: Annotated[
        bool | None,
        Field(
            default=None, description="--enable-auto-tool-choice (on by default when a tool parser is set)."
        ),
    ]
    reasoning_parser: Annotated[str | None, Field(default=None, description="--reasoning-parser.")]
    chat_template: Annotated[
        str | None, Field(default=None, description="--chat-template (path or template).")
    ]
    extra_args: Annotated[
        list[str],
        Field(
            default_factory=list,
            description="Further engine flags, appended verbatim after the planned ones.",
        ),
    ]
    llama_cpp: Annotated[
        LlamaCppOptions,
        Field(default_factory=LlamaCppOptions, description="llama-server options (llama.cpp recipes only)."),
    ]

    @model_validator(mode="after")
    def _consistent(self) -> ServeSpec:
        if self.gpu_memory_utilization is not None and self.kv_cache_memory_bytes is not None:
            raise ValueError(
                "gpu_memory_utilization and kv_cache_memory_bytes are mutually exclusive (set one; "
                "kv_cache_memory_bytes makes vLLM ignore the utilisation)"
            )
        if self.long_prefill_token_threshold and self.long_prefill_token_threshold > self.max_model_len:
            raise ValueError(
                f"long_prefill_token_threshold ({self.long_prefill_token_threshold}) must be <= "
                f"max_model_len ({self.max_model_len})"
            )
        if (
            self.max_num_seqs is not None
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs "
                f"({self.max_num_seqs})"
            )
        return self


class LoadSpec(Strict):
    """How shards get from NVMe into the server (see the Pre-warm section of the README)."""

    prewarm: Annotated[
        Literal["auto", "always", "never"],
        Field(
            default="auto",
            description="Read the shards into the page cache before launch: auto = only when the memory plan "
            "leaves room for the cached shards next to the server; always; never.",
        ),
    ]
    workers: Annotated[int, Field(default=8, gt=0, le=64, description="Parallel readers for the pre-warm.")]
    evict_after_load: Annotated[
        bool,
        Field(
            default=True,
            description="Drop the shards from the page cache once the server holds the weights (unified "
            "memory: cached pages count against the GPU's free memory).",
        ),
    ]


class MemorySpec(Strict):
    """Inputs to the memory plan; all sizes in bytes."""

    pool_bytes: Annotated[
        int | None,
        Field(
            default=None,
            gt=0,
            description="Memory the engine's device sees. Default: 121.69 GiB (what a DGX Spark's 128 GB "
            "unified pool reports) for cuda, the host's RAM for cpu.",
        ),
    ]
    weights_bytes: Annotated[
        int | None,
        Field(
            default=None,
            gt=0,
            description="Resident weight bytes after load (per node). Default: model.expected_bytes divided "
            "across tensor/pipeline ranks.",
        ),
    ]
    overhead_bytes: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description="Runtime overhead besides weights and KV (CUDA context, activations, CUDA graphs, "
            "sampler). Default 5 GiB on cuda (fits GMIX's measured 337,042 KV tokens at util 0.91), 2 GiB on cpu.",
        ),
    ]
    max_utilization: Annotated[
        float | None,
        Field(
            default=None,
            gt=0,
            le=1,
            description="Refuse gpu_memory_utilization above this (e.g. 0.85 for packs known to hit "
            "NV_ERR_NO_MEMORY above it).",
        ),
    ]
    min_free_bytes: Annotated[
        int,
        Field(
            default=6 * GiB,
            ge=0,
            description="Memory to leave to the OS, page cache and CPU side; the planner warns below this.",
        ),
    ]


class ClusterSpec(Strict):
    """Serving across Sparks linked by ConnectX-7 (one GPU per node)."""

    nodes: Annotated[int, Field(default=1, gt=0, le=16, description="Number of Sparks.")]
    tensor_parallel: Annotated[int, Field(default=1, gt=0, description="--tensor-parallel-size.")]
    pipeline_parallel: Annotated[int, Field(default=1, gt=0, description="--pipeline-parallel-size.")]
    executor: Annotated[
        Literal["ray", "mp", "uni"] | None,
        Field(
            default=None,
            description="--distributed-executor-backend; ray is required for more than one node here "
            "(start the Ray cluster first); uni runs the one worker inside the engine process (a faster "
            "start for single-process CPU serving).",
        ),
    ]
    head_address: Annotated[
        str | None,
        Field(
            default=None,
            description="Head node's ConnectX-7 address (VLLM_HOST_IP, MASTER_ADDR, RAY_NODE_IP_ADDRESS).",
        ),
    ]
    interface: Annotated[
        str | None,
        Field(
            default=None,
            description="ConnectX-7 netdev carrying NCCL/Gloo traffic (see `ibdev2netdev`), e.g. enp1s0f1np1.",
        ),
    ]
    ib_hca: Annotated[
        list[str],
        Field(default_factory=list, description="RoCE devices for NCCL_IB_HCA (both twins of the port)."),
    ]
    ib_gid_index: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description="NCCL_IB_GID_INDEX; per NIC and per node, read /sys/class/infiniband/<dev>/ports/1/gids.",
        ),
    ]

    @model_validator(mode="after")
    def _shape(self) -> ClusterSpec:
        ranks = self.tensor_parallel * self.pipeline_parallel
        if ranks != self.nodes:
            raise ValueError(
                f"tensor_parallel x pipeline_parallel ({ranks}) must equal nodes ({self.nodes}): a Spark has one GPU"
            )
        if self.nodes > 1 and self.executor != "ray":
            raise ValueError("more than one node needs executor: ray")
        return self


class MountSpec(Strict):
    source: Annotated[str, Field(description="Host path (~ is expanded).")]
    target: Annotated[str, Field(description="Path inside the container.")]
    read_only: Annotated[bool, Field(default=False, description="Mount read-only.")]


class ContainerSpecModel(Strict):
    """Docker settings (runtime: docker)."""

    image: Annotated[
        str | None, Field(default=None, description="Image to run (required for runtime docker).")
    ]
    name: Annotated[str | None, Field(default=None, description="Container name; default sparkctl-<recipe>.")]
    gpus: Annotated[bool, Field(default=True, description="Request all GPUs (--gpus all).")]
    network_host: Annotated[bool, Field(default=True, description="--network host (needed by Ray/NCCL).")]
    ipc_host: Annotated[bool, Field(default=True, description="--ipc host (PyTorch/NCCL shared memory).")]
    shm_size: Annotated[str | None, Field(default="16g", description="--shm-size.")]
    ulimits: Annotated[
        dict[str, int],
        Field(
            default_factory=lambda: {"memlock": -1, "stack": 67108864},
            description="name -> limit (soft = hard); -1 is unlimited.",
        ),
    ]
    mounts: Annotated[list[MountSpec], Field(default_factory=list, description="Extra bind mounts.")]
    devices: Annotated[
        list[str],
        Field(default_factory=list, description="Host devices to pass (e.g. /dev/infiniband for RDMA)."),
    ]
    memory_limit: Annotated[
        str | None,
        Field(
            default=None,
            description="cgroup memory cap (e.g. 112g): a runaway load kills the container, not the host.",
        ),
    ]
    hf_cache: Annotated[
        str | None,
        Field(
            default="~/.cache/huggingface",
            description="Host Hugging Face cache mounted at /root/.cache/huggingface (null: no mount).",
        ),
    ]

    @field_validator("shm_size", "memory_limit")
    @classmethod
    def _docker_size(cls, value: str | None) -> str | None:
        import re

        if value is not None and not re.fullmatch(
            r"\d+(\.\d+)?([bkmg]|[kmg]i?b)?", value, flags=re.IGNORECASE
        ):
            raise ValueError(f"{value!r} is not a Docker size (e.g. 16g, 512m, 112gb)")
        return value


class BenchSpec(Strict):
    """Defaults for `sparkctl bench` (TTFT = first content/reasoning chunk; decode = (N-1)/(t_last-t_first), N from usage)."""

    max_tokens: Annotated[int, Field(default=128, gt=0, description="Completion tokens per request.")]
    warmup: Annotated[int, Field(default=1, ge=0, description="Unmeasured warm-up requests.")]
    runs: Annotated[int, Field(default=3, gt=0, description="Measured requests per workload (median).")]
    concurrency: Annotated[
        list[Annotated[int, Field(gt=0)]],
        Field(default_factory=lambda: [1], description="Concurrent streams."),
    ]
    prompt_tokens: Annotated[
        list[Annotated[int, Field(gt=0)]],
        Field(default_factory=list, description="Extra long-prompt lengths to measure prefill at."),
    ]


class Recipe(Strict):
    """One servable model: what to fetch, how to serve it, and what it needs from the machine."""

    schema_version: Annotated[
        Literal[1], Field(alias="schema", description="Recipe schema version; this is version 1.")
    ]
    name: Annotated[
        str,
        Field(
            description="Recipe name (defaults to the file name without .yaml): lowercase letters, digits, . _ -"
        ),
    ]
    description: Annotated[str, Field(default="", description="One line shown by `sparkctl list`.")]
    notes: Annotated[
        list[str],
        Field(default_factory=list, description="Facts worth knowing (measured tok/s, traps, sources)."),
    ]
    runtime: Annotated[
        Literal["docker", "native"],
        Field(
            default="docker", description="docker: run the engine in container.image; native: on the host."
        ),
    ]
    model: Annotated[ModelSpec, Field(description="The weights.")]
    engine: Annotated[EngineSpec, Field(default_factory=EngineSpec, description="The inference engine.")]
    serve: Annotated[ServeSpec, Field(description="Server flags.")]
    env: Annotated[
        dict[str, Scalar],
        Field(
            default_factory=dict, description="Environment for the engine process (values become strings)."
        ),
    ]
    load: Annotated[LoadSpec, Field(default_factory=LoadSpec, description="Shard pre-warm and eviction.")]
    memory: Annotated[MemorySpec, Field(default_factory=MemorySpec, description="Memory plan inputs.")]
    cluster: Annotated[ClusterSpec, Field(default_factory=ClusterSpec, description="Multi-Spark serving.")]
    container: Annotated[
        ContainerSpecModel, Field(default_factory=ContainerSpecModel, description="Docker settings.")
    ]
    bench: Annotated[BenchSpec, Field(default_factory=BenchSpec, description="Benchmark defaults.")]

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        import re

        if not re.fullmatch(NAME_PATTERN, value):
            raise ValueError(
                f"recipe name {value!r} must be lowercase letters, digits, '.', '_' or '-' (it names the "
                "container and the state file); set `name:` or rename the file"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Recipe:
        if self.runtime == "docker" and not self.container.image:
            raise ValueError(
                "runtime docker needs container.image (the image to run: --set container.image=IMAGE)"
            )
        if self.engine.name == "llama.cpp" and self.model.format != "gguf":
            raise ValueError(f"engine llama.cpp serves gguf models, not {self.model.format}")
        if self.engine.name == "vllm" and self.model.format == "gguf":
            raise ValueError("gguf models are served with engine.name: llama.cpp")
        if self.model.prepare is not None and self.engine.name != "vllm":
            raise ValueError(
                "model.prepare makes packs loadable by vLLM; llama.cpp serves GGUF files as they are"
            )
        if self.model.prepare and self.model.prepare.chat_template and self.serve.chat_template:
            raise ValueError("set model.prepare.chat_template or serve.chat_template, not both")
        if self.engine.device == "cpu" and self.cluster.nodes > 1:
            raise ValueError("engine.device cpu runs on one node")
        return self

    def env_strings(self) -> dict[str, str]:
        """The env block as the strings a process sees (true -> 1, false -> 0)."""
        out: dict[str, str] = {}
        for key, value in self.env.items():
            if isinstance(value, bool):
                out[key] = "1" if value else "0"
            else:
                out[key] = str(value)
        return out


def recipe_json_schema() -> dict[str, Any]:
    """JSON Schema of a recipe file, with every field's description (for editors and docs)."""
    schema = Recipe.model_json_schema(by_alias=True, mode="validation")
    # `extends` is resolved by the loader before validation, so the model does not carry it
    schema["properties"]["extends"] = {
        "type": "string",
        "description": "Built-in recipe name or a path relative to this file; its fields are deep-merged under "
        "this recipe's (mappings merge, other values replace).",
    }
    schema["required"] = [k for k in schema.get("required", []) if k != "name"]
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
    }
