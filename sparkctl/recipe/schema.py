"""The recipe schema (`schema: 1`): one pydantic model per YAML block, every field documented.

The models check shape only: types, ranges and fields that exclude each other. Whether a recipe fits the
machine (memory, engine support for a flag) is the planner's job, because it depends on more than one
block. Every model forbids unknown keys, so a misspelt key is an error with a suggestion, never a
silently ignored setting that turns into a default.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

GiB = 1024**3

NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"

# Names that end up as words of a command line or a compose file. They are quoted wherever they are
# rendered, but a name that is not a name (`A;touch x`, `x=1:1 -v /:/host`) is a mistake or an attack:
# refused here, with the rule, before anything is planned.
ENV_KEY_PATTERN = r"[A-Za-z_][A-Za-z0-9_]*"  # POSIX shell variable names
# docker's --ulimit names (github.com/docker/go-units ulimit.go)
ULIMIT_NAMES = (
    "core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss",
    "rtprio", "rttime", "sigpending", "stack",
)  # fmt: skip
DEVICE_PATTERN = r"/dev(/[A-Za-z0-9_.+-]+)+"  # a host device node or directory, no ':' (docker's separator)
# A Docker image reference: [registry[:port]/]path[:tag][@digest]; never starting with '-' (a flag).
IMAGE_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._/-]*(:[A-Za-z0-9_][A-Za-z0-9._-]{0,127})?(@[a-z0-9]+:[a-f0-9]{32,})?"
CONTAINER_NAME_PATTERN = r"[a-zA-Z0-9][a-zA-Z0-9_.-]*"  # docker's own rule for --name
HOSTNAME_PATTERN = r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*"
NETDEV_PATTERN = r"[A-Za-z0-9_.:-]{1,15}"  # Linux interface names (IFNAMSIZ 16)


def check_host(value: str, what: str = "host") -> str:
    """An IP address or a DNS name: what a server binds to or a peer is reached at, nothing more."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        address = None
    # an IPv6 scope id (`fe80::1%eth0`) is free text to `ipaddress`; here it is an interface name
    scope = getattr(address, "scope_id", None)
    if address is not None and (scope is None or re.fullmatch(r"[A-Za-z0-9_.-]{1,15}", scope)):
        return value
    if address is not None or not re.fullmatch(HOSTNAME_PATTERN, value):
        raise ValueError(f"{what} {value!r} is not an IP address or a host name")
    return value


def _check_path_text(value: str, what: str) -> str:
    """A path docker can bind: no ':' or ',' (its -v / --mount separators), no control characters."""
    if not value or re.search(r"[:,\x00-\x1f\x7f]", value):
        raise ValueError(f"{what} {value!r} must be a path without ':', ',' or control characters")
    return value


Scalar = str | int | float | bool


class Strict(BaseModel):
    """Base: unknown keys are errors, values are not coerced across types (a string is not a number),
    and no float is inf or nan (`.inf` seconds would overflow every timer and file it reaches)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True, allow_inf_nan=False)


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


_NO_PREPARE = (
    "model.prepare makes packs loadable by vLLM; llama.cpp and FreeToken serve GGUF files as they are"
)


class EngineBase(Strict):
    """Which inference engine serves the model, and the versions it was validated with. One subclass per
    engine (below), told apart by `name`; each engine's own options are its `serve` (`EngineSpec`), and
    each says which models and devices it refuses (`model_problem`, `device_problem`)."""

    def model_problem(self, model: Any) -> str | None:
        """Why this engine cannot serve `model` (its format, a prepare step), or None."""
        return None

    def device_problem(self) -> str | None:
        """Why this engine cannot run on `device`, or None."""
        return None

    name: Annotated[
        Literal["vllm", "llama.cpp", "freetoken"],
        Field(
            default="vllm",
            description="vllm, llama.cpp (llama-server) or freetoken (FreeToken's `ft serve`: MoE experts "
            "offloaded to host RAM; NVIDIA GPUs only).",
        ),
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
            "`<python> -m vllm.entrypoints.openai.api_server` natively, sparkctl's own `llama-server` build "
            "(`make llama-server`) or the one on PATH for llama.cpp, FreeToken's venv (`make freetoken`) "
            "or `ft` on PATH for freetoken.",
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
    def _pins_agree(self) -> EngineBase:
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


LLAMACPP_LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
LLAMACPP_SPEC_TYPES = (
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
)


class LlamaCppSpeculative(Strict):
    """llama-server speculative decoding (--spec-type ...); vLLM recipes use serve.speculative instead."""

    type: Annotated[
        Literal[LLAMACPP_SPEC_TYPES],  # type: ignore[valid-type]
        Field(
            description="--spec-type: draft-mtp drafts with the model's own multi-token-prediction head (the "
            "GGUF must carry it, or draft_model names the MTP sidecar); draft-simple with a small draft "
            "model; ngram-* need no second model."
        ),
    ]
    draft_model: Annotated[
        str | None,
        Field(default=None, description="--spec-draft-model: the draft (or MTP sidecar) GGUF file."),
    ]
    draft_max: Annotated[
        int | None,
        Field(default=None, gt=0, le=64, description="--spec-draft-n-max: tokens drafted per step."),
    ]
    draft_min: Annotated[
        int | None, Field(default=None, ge=0, le=64, description="--spec-draft-n-min: fewest tokens drafted.")
    ]

    @model_validator(mode="after")
    def _range(self) -> LlamaCppSpeculative:
        if self.draft_max is not None and self.draft_min is not None and self.draft_min > self.draft_max:
            raise ValueError(f"draft_min ({self.draft_min}) must be <= draft_max ({self.draft_max})")
        return self


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
    kv_unified: Annotated[
        bool,
        Field(
            default=False,
            description="One KV pool shared by all slots (--kv-unified, each slot capped at max_model_len by "
            "--kv-unified-per-slot) instead of max_num_seqs separate max_model_len streams. Same memory; "
            "shared prefixes are reused across slots, but every decode step attends over the whole pool.",
        ),
    ]
    cpu_moe: Annotated[
        bool,
        Field(default=False, description="Keep every layer's MoE expert weights in host RAM (--cpu-moe)."),
    ]
    n_cpu_moe: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description="Keep the expert weights of the first N layers in host RAM (--n-cpu-moe N); the rest "
            "follow n_gpu_layers. The knob that fits a big MoE next to its KV cache.",
        ),
    ]
    override_tensor: Annotated[
        list[str],
        Field(
            default_factory=list,
            description="Tensor placement rules, `<name regex>=<buffer type>` (e.g. `blk\\.[0-9]\\.ffn_.*_exps=CPU`), "
            "joined into one --override-tensor in order; the first match wins.",
        ),
    ]
    load_mode: Annotated[
        Literal[LLAMACPP_LOAD_MODES] | None,  # type: ignore[valid-type]
        Field(
            default=None,
            description="How weights are read (--load-mode): auto (mmap unless a device cannot), none, mmap, "
            "mlock, mmap+mlock, dio (direct I/O: no page-cache copy, which unified memory would otherwise "
            "count twice).",
        ),
    ]
    metrics: Annotated[
        bool, Field(default=False, description="Serve Prometheus metrics at /metrics (--metrics).")
    ]
    speculative: Annotated[
        LlamaCppSpeculative | None,
        Field(default=None, description="Speculative decoding with llama-server's own drafters (MTP, ...)."),
    ]

    @field_validator("override_tensor")
    @classmethod
    def _rules(cls, value: list[str]) -> list[str]:
        for rule in value:
            pattern, sep, buft = rule.rpartition("=")
            if not sep or not pattern or not buft or "," in rule:
                raise ValueError(
                    f"override_tensor rule {rule!r} must be one `<tensor name regex>=<buffer type>`"
                )
        return value

    @model_validator(mode="after")
    def _moe(self) -> LlamaCppOptions:
        if self.cpu_moe and self.n_cpu_moe is not None:
            raise ValueError("set cpu_moe (all layers) or n_cpu_moe (the first N layers), not both")
        return self


FREETOKEN_MOE_STRATEGIES = ("auto", "fused", "offload", "cpu", "hybrid")


class FreeTokenOptions(Strict):
    """FreeToken (`ft serve`) options without a vLLM counterpart; names follow its CLI."""

    moe_strategy: Annotated[
        Literal[FREETOKEN_MOE_STRATEGIES],  # type: ignore[valid-type]
        Field(
            default="auto",
            description="--moe-strategy: where routed experts run. auto = resident `fused` experts on "
            "unified-memory GPUs (GB10), `offload` (experts in host RAM, an LRU slot cache on the GPU) "
            "elsewhere; cpu and hybrid run some experts on the CPU.",
        ),
    ]
    moe_cache_mem: Annotated[
        str | None,
        Field(
            default=None,
            pattern=r"^\d+(\.\d+)?\s*([KkMmGg](i?[Bb])?|[Bb])$",
            description="--moe-cache-mem: GPU memory for the expert slot cache (e.g. 6GiB, 800MiB).",
        ),
    ]
    moe_cache_rate: Annotated[
        float | None,
        Field(
            default=None, ge=0, le=1, description="--moe-cache-rate: fraction of all experts kept on the GPU."
        ),
    ]
    moe_cpu_threads: Annotated[
        int | None,
        Field(default=None, ge=0, description="--moe-cpu-threads for the cpu/hybrid strategies (0 = auto)."),
    ]
    memory_ratio: Annotated[
        float | None,
        Field(
            default=None,
            gt=0,
            le=1,
            description="--memory-ratio: fraction of free GPU memory for weights + expert cache + KV.",
        ),
    ]
    cuda_graph_max_bs: Annotated[
        int | None, Field(default=None, gt=0, description="--cuda-graph-max-bs (unset: tuned from memory).")
    ]
    cache_type: Annotated[
        Literal["naive", "radix"] | None,
        Field(default=None, description="--cache-type: KV prefix reuse (radix) or none (naive)."),
    ]

    @model_validator(mode="after")
    def _one_cache_size(self) -> FreeTokenOptions:
        if self.moe_cache_mem is not None and self.moe_cache_rate is not None:
            raise ValueError("set moe_cache_mem or moe_cache_rate, not both (FreeToken takes one)")
        return self


class VllmEngine(EngineBase):
    """vLLM: its flags are the serve block's; it has no section of its own."""

    name: Annotated[Literal["vllm"], Field(default="vllm", description="vllm (the default).")]

    def model_problem(self, model: Any) -> str | None:
        if model.format == "gguf":
            return "gguf models are served with engine.name: llama.cpp or freetoken"
        return None


class LlamaCppEngine(EngineBase):
    """llama.cpp's llama-server, with its own options in `engine.serve` (or, as before, `serve.llama_cpp`)."""

    def model_problem(self, model: Any) -> str | None:
        if model.format != "gguf":
            return f"engine llama.cpp serves gguf models, not {model.format}"
        return _NO_PREPARE if model.prepare is not None else None

    name: Annotated[Literal["llama.cpp"], Field(description="llama.cpp (llama-server).")]
    serve: Annotated[
        LlamaCppOptions,
        Field(
            default_factory=LlamaCppOptions,
            description="llama-server options; `serve.llama_cpp` is read here too (the form recipes used so far).",
        ),
    ]


class FreeTokenEngine(EngineBase):
    """FreeToken (`ft serve`): MoE experts offloaded to host RAM; NVIDIA GPUs only."""

    def model_problem(self, model: Any) -> str | None:
        if model.prepare is not None:
            return _NO_PREPARE
        if model.format == "exl3":
            return "engine freetoken serves gguf and safetensors models, not exl3"
        return None

    def device_problem(self) -> str | None:
        if self.device != "cuda":
            return "engine freetoken runs on NVIDIA GPUs only (engine.device: cuda)"
        return None

    name: Annotated[Literal["freetoken"], Field(description="freetoken (FreeToken's `ft serve`).")]
    serve: Annotated[
        FreeTokenOptions,
        Field(
            default_factory=FreeTokenOptions,
            description="FreeToken options; `serve.freetoken` is read here too (the form recipes used so far).",
        ),
    ]


# The engine block: one model per engine, picked by `name` (a discriminated union), so an engine's own
# options exist only on a recipe of that engine. Adding an engine: an adapter (sparkctl/planner/adapters)
# and a class here.
EngineSpec = VllmEngine | LlamaCppEngine | FreeTokenEngine
# the engine-specific serve sections recipes wrote under `serve:` before, and whose they are
LEGACY_SERVE_SECTIONS = {"llama_cpp": "llama.cpp", "freetoken": "freetoken"}


class ServeSpec(Strict):
    """The server's flags. Names follow vLLM 0.33; llama.cpp recipes map the common ones."""

    host: Annotated[
        str, Field(default="127.0.0.1", description="Address to listen on (0.0.0.0 to serve the LAN).")
    ]
    port: Annotated[int, Field(default=8000, gt=0, lt=65536, description="TCP port of the OpenAI API.")]
    api_key_file: Annotated[
        str | None,
        Field(
            default=None,
            description="A file holding the API key clients must send (Bearer token). Given to the engine "
            "through its environment, never on its command line; see also `up --api-key`.",
        ),
    ]
    no_auth: Annotated[
        bool,
        Field(
            default=False,
            description="Serve a non-loopback host without an API key (`up --no-auth`). Refused otherwise: "
            "anyone on the network could use the server.",
        ),
    ]
    served_model_name: Annotated[
        str | None, Field(default=None, description="Model name clients send; defaults to the recipe name.")
    ]
    health_timeout_s: Annotated[
        float,
        Field(
            default=1800.0,
            gt=0,
            le=7 * 86400,
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

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        return check_host(value, "serve.host")

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


class WatchdogSpec(Strict):
    """Stop the server cleanly before unified memory runs out and the host wedges (a known Spark failure)."""

    floor_bytes: Annotated[
        int,
        Field(
            gt=0,
            description="Stop the server when the host's MemAvailable falls below this many bytes (e.g. "
            "4294967296 for 4 GiB).",
        ),
    ]
    interval_s: Annotated[
        float, Field(default=2.0, gt=0, le=3600, description="Seconds between two MemAvailable samples.")
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
    watchdog: Annotated[
        WatchdogSpec | None,
        Field(
            default=None,
            description="While serving, sample MemAvailable and stop the server (logged) below a floor.",
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
            description="--distributed-executor-backend. Over several nodes: ray (`up --nodes` starts a "
            "Ray head and worker container) or mp (vLLM's own --nnodes/--node-rank, the workers "
            "--headless); uni runs the one worker inside the engine process (a faster start for "
            "single-process CPU serving).",
        ),
    ]
    hosts: Annotated[
        list[str],
        Field(
            default_factory=list,
            description="The nodes as SSH addresses ([user@]host[:port]), head first; `up --nodes` "
            "overrides. `localhost` is this machine.",
        ),
    ]
    ray_port: Annotated[
        int, Field(default=6379, gt=0, lt=65536, description="Port of the Ray head (GCS) on the head node.")
    ]
    master_port: Annotated[
        int,
        Field(default=29501, gt=0, lt=65536, description="torch.distributed rendezvous port (executor mp)."),
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
            description="ConnectX-7 netdev carrying NCCL/Gloo traffic (see `ibdev2netdev`), e.g. enp1s0f1np1; "
            "null: `up --nodes` picks the Up one on each node.",
        ),
    ]
    ib_hca: Annotated[
        list[str],
        Field(
            default_factory=list,
            description="RoCE devices for NCCL_IB_HCA (both twins of the port); empty: `up --nodes` picks "
            "the twins behind the interface on each node.",
        ),
    ]
    ib_gid_index: Annotated[
        int | None,
        Field(
            default=None,
            ge=0,
            description="NCCL_IB_GID_INDEX; per NIC and per node, read /sys/class/infiniband/<dev>/ports/1/gids. "
            "null: `up --nodes` picks a non-zero RoCE v2 GID on each node.",
        ),
    ]

    @field_validator("head_address")
    @classmethod
    def _head(cls, value: str | None) -> str | None:
        return None if value is None else check_host(value, "cluster.head_address")

    @field_validator("interface")
    @classmethod
    def _netdev(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(NETDEV_PATTERN, value):
            raise ValueError(f"{value!r} is not a network interface name (e.g. enp1s0f1np1)")
        return value

    @field_validator("ib_hca")
    @classmethod
    def _hcas(cls, value: list[str]) -> list[str]:
        for name in value:
            if not re.fullmatch(NETDEV_PATTERN, name):
                raise ValueError(f"{name!r} is not an RDMA device name (e.g. rocep1s0f1)")
        return value

    @model_validator(mode="after")
    def _shape(self) -> ClusterSpec:
        ranks = self.tensor_parallel * self.pipeline_parallel
        if ranks != self.nodes:
            raise ValueError(
                f"tensor_parallel x pipeline_parallel ({ranks}) must equal nodes ({self.nodes}): a Spark has one GPU"
            )
        if self.nodes > 1 and self.executor not in ("ray", "mp"):
            raise ValueError("more than one node needs executor: ray or mp")
        if self.hosts and len(self.hosts) != self.nodes:
            raise ValueError(f"hosts lists {len(self.hosts)} nodes, nodes is {self.nodes}")
        return self


class MountSpec(Strict):
    source: Annotated[str, Field(description="Host path (~ is expanded).")]
    target: Annotated[str, Field(description="Path inside the container.")]
    read_only: Annotated[bool, Field(default=False, description="Mount read-only.")]

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return _check_path_text(value, "mount source")

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        _check_path_text(value, "mount target")
        if not value.startswith("/"):
            raise ValueError(f"mount target {value!r} must be an absolute path inside the container")
        return value


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

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(IMAGE_PATTERN, value):
            raise ValueError(f"{value!r} is not a Docker image reference (e.g. sparkctl/vllm:0.33-sm121)")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(CONTAINER_NAME_PATTERN, value):
            raise ValueError(f"container name {value!r} must be letters, digits, '_', '.' or '-'")
        return value

    @field_validator("ulimits")
    @classmethod
    def _ulimits(cls, value: dict[str, int]) -> dict[str, int]:
        for name in value:
            if name not in ULIMIT_NAMES:
                raise ValueError(f"unknown ulimit {name!r}; valid: {', '.join(ULIMIT_NAMES)}")
        return value

    @field_validator("devices")
    @classmethod
    def _devices(cls, value: list[str]) -> list[str]:
        for dev in value:
            if not re.fullmatch(DEVICE_PATTERN, dev) or "/../" in dev + "/":
                raise ValueError(f"device {dev!r} must be a path under /dev (e.g. /dev/infiniband)")
        return value

    @field_validator("shm_size", "memory_limit")
    @classmethod
    def _docker_size(cls, value: str | None) -> str | None:
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

    @model_validator(mode="before")
    @classmethod
    def _engine_sections(cls, data: Any) -> Any:
        """`engine.name` defaults to vllm; `serve.llama_cpp` / `serve.freetoken` (the form recipes were
        written in) become the engine's own `engine.serve` when it is that engine's, and are dropped when
        not (a recipe that extends one of another engine inherits them, meaning nothing)."""
        if not isinstance(data, dict):
            return data
        engine = data.get("engine")
        engine = dict(engine) if isinstance(engine, dict) else ({} if engine is None else engine)
        if not isinstance(engine, dict):
            return data
        engine.setdefault("name", "vllm")
        serve = data.get("serve")
        if isinstance(serve, dict):
            serve = dict(serve)
            for key, owner in LEGACY_SERVE_SECTIONS.items():
                old = serve.pop(key, None)
                if engine.get("name") == owner and isinstance(old, dict):
                    own = engine.get("serve")
                    engine["serve"] = {**old, **own} if isinstance(own, dict) else old
            data = {**data, "serve": serve}
        return {**data, "engine": engine}

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
    engine: Annotated[
        EngineSpec,
        Field(default_factory=VllmEngine, discriminator="name", description="The inference engine."),
    ]
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

    @field_validator("env")
    @classmethod
    def _env_keys(cls, value: dict[str, Scalar]) -> dict[str, Scalar]:
        for key in value:
            if not re.fullmatch(ENV_KEY_PATTERN, key):
                raise ValueError(
                    f"environment variable name {key!r} must be letters, digits and '_', not starting "
                    "with a digit"
                )
        return value

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
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
        problem = self.engine.model_problem(self.model)
        if problem is not None:
            raise ValueError(problem)
        if self.model.prepare and self.model.prepare.chat_template and self.serve.chat_template:
            raise ValueError("set model.prepare.chat_template or serve.chat_template, not both")
        if problem := self.engine.device_problem():
            raise ValueError(problem)
        if self.engine.device == "cpu" and self.cluster.nodes > 1 and self.cluster.executor != "mp":
            raise ValueError(
                "engine.device cpu runs across nodes only with cluster.executor: mp (vLLM's CPU build has "
                "no Ray device)"
            )
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
