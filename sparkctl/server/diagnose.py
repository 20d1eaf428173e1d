"""Turn a failed start-up's log into a hint: the few causes that account for most failed launches.

Patterns are matched against the whole log (not only the tail shown to the user: vLLM's root cause,
such as a truncated shard, is often hundreds of lines above the last traceback), most specific first,
and every distinct cause found is reported with the log line that shows it; a server that ran out of
memory *because* the KV cache was too big should say both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Cause:
    name: str
    pattern: re.Pattern[str]
    hint: str


def _c(name: str, pattern: str, hint: str) -> Cause:
    return Cause(name, re.compile(pattern, re.IGNORECASE), hint)


CAUSES: tuple[Cause, ...] = (
    _c(
        "truncated weights",
        r"SafetensorError|not fully covered|Error while deserializing header|MetadataIncompleteBuffer|"
        r"(?:gguf|GGUF).*(?:truncated|unexpected end|failed to read)",
        "a weight file is truncated or corrupt (an interrupted download?): delete it and fetch the model "
        "again (`sparkctl up` re-downloads what is missing)",
    ),
    _c(
        "port in use",
        r"address already in use|errno 98\b",
        "another process holds the port: stop it, or pick another with --port",
    ),
    _c(
        "cuda out of memory",
        r"CUDA out of memory|torch\.OutOfMemoryError|cudaErrorMemoryAllocation",
        "the GPU ran out of memory: lower serve.gpu_memory_utilization or serve.max_model_len, "
        "or stop other GPU users",
    ),
    _c(
        "kv cache",
        r"No available memory for the cache blocks|is larger than the maximum number of tokens that can be "
        r"stored in KV cache|KV cache is needed, which is larger than the available KV cache memory|"
        r"VLLM_CPU_KVCACHE_SPACE",
        "the KV cache does not fit: lower serve.max_model_len, or give it more memory "
        "(serve.gpu_memory_utilization; on the CPU the VLLM_CPU_KVCACHE_SPACE env, in GiB)",
    ),
    _c(
        "host out of memory",
        r"(?<!CUDA )\bout of memory\b|Cannot allocate memory|MemoryError|oom-kill|OOMKilled",
        "the host ran out of memory while loading: close other programs, pre-warm less (load.prewarm: never), "
        "or choose a smaller model / context",
    ),
    _c(
        "unsupported head_dim",
        r"head[ _]?(?:dim|size)\W.*(?:not supported|unsupported)|(?:unsupported|not supported).*head[ _]?(?:dim|size)",
        "this attention backend does not support the model's head_dim (vLLM 0.32 on the CPU takes 32, 64, "
        "80, 96, 112, 128, 160, 192, 224, 256 or 512)",
    ),
    _c(
        "no gpu",
        r"No CUDA GPUs are available|Found no NVIDIA driver|CUDA driver version is insufficient|"
        r"libcuda\.so|cudaErrorNoDevice|NVIDIA-SMI has failed",
        "no usable NVIDIA GPU for this process: run `sparkctl doctor`; in Docker the NVIDIA container "
        "runtime must be installed",
    ),
    _c(
        "wrong gpu architecture",
        r"no kernel image is available for execution on the device|cudaErrorNoKernelImageForDevice",
        "the engine was not compiled for this GPU (sm_121 on a Spark): use the sparkctl image built from docker/",
    ),
    _c(
        "cuda error",
        r"CUDA error|cudaError\w*|CUBLAS_STATUS_\w+|NCCL error",
        "a CUDA error stopped the engine: see the lines above; `sparkctl doctor` checks driver and runtime",
    ),
    _c(
        "gated model",
        r"GatedRepoError|Access to model .* is restricted|401 Client Error",
        "the model is gated: accept its licence on the hub and set HF_TOKEN",
    ),
    _c(
        "engine not installed",
        r"No module named '?vllm'?(?!\.)|No module named vllm\b",
        "vLLM is not installed in this Python: make install-vllm (CPU) or use the docker runtime",
    ),
    _c(
        "unknown quantization",
        r"Unknown quantization method|quantization method .* is not supported|exl3.* not (?:found|registered)",
        "the engine lacks this quantization: EXL3 needs the sparkctl_exl3 vLLM plugin (pip install -e . "
        "in the engine's environment)",
    ),
    _c(
        "context too long",
        r"max_model_len.*(?:greater|larger) than|User-specified max_model_len",
        "serve.max_model_len exceeds what the model supports: lower it",
    ),
    _c(
        "remote code",
        r"trust_remote_code|requires you to execute the configuration file",
        "the model needs its own Python code: set serve.trust_remote_code: true if you trust the repo",
    ),
)


@dataclass(frozen=True)
class Finding:
    cause: Cause
    line: str  # the first log line that matched


def find_causes(lines: Iterable[str]) -> list[Finding]:
    """Each cause whose pattern occurs in `lines`, with its first matching line, in CAUSES order.

    One pass over the lines (a log can be hundreds of thousands of them); every pattern is about one
    line, so nothing is missed by not joining them.
    """
    first: dict[str, str] = {}
    for line in lines:
        for cause in CAUSES:
            if cause.name not in first and cause.pattern.search(line):
                first[cause.name] = line
        if len(first) == len(CAUSES):
            break
    return [Finding(c, first[c.name]) for c in CAUSES if c.name in first]


def diagnose(lines: Iterable[str]) -> list[Cause]:
    """Distinct causes whose pattern occurs in `lines`, in CAUSES order (most specific first)."""
    return [f.cause for f in find_causes(lines)]


def _excerpt(line: str, width: int = 160) -> str:
    line = " ".join(line.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def hint_for(lines: Iterable[str], *, fallback: str) -> str:
    """One hint line: the causes found (each with the log line that shows it), or `fallback`."""
    found = find_causes(lines)
    if not found:
        return fallback
    return "; ".join(f"{f.cause.name}: {f.cause.hint} (log: {_excerpt(f.line)})" for f in found[:2])
