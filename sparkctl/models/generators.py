"""Named generators of small local models, referenced by recipes as `model.generate: <name>`.

Tests and the embedded recipes never download a model; they make one. Each entry is
"module:function" with the signature `fn(out_dir: Path) -> None`, writing a complete Hugging Face
style model directory (config.json, *.safetensors, tokenizer files). The caller writes into a temp
directory and renames it into place, so a half-made model is never reused.
"""

from __future__ import annotations

GENERATORS: dict[str, str] = {
    # a random-weight Llama (head_dim 64, as vLLM's CPU attention requires) + a tokenizer trained locally
    "tiny-llama": "sparkctl.models.tiny:make_tiny_llama",
    # GGUF files for llama.cpp: tiny-llama converted, and a tiny Qwen3-MoE (sparkctl/models/tiny_gguf.py)
    "tiny-gguf-llama": "sparkctl.models.tiny_gguf:make_tiny_gguf_llama",
    "tiny-gguf-qwen3moe": "sparkctl.models.tiny_gguf:make_tiny_gguf_qwen3moe",
    # EXL3 checkpoints from the plugin's writer (sparkctl_exl3.checkpoint), and their dequantized twins
    "tiny-exl3-dense": "sparkctl.models.tiny_exl3:make_tiny_dense",
    "tiny-exl3-dense-twin": "sparkctl.models.tiny_exl3:make_tiny_dense_twin",
    "tiny-exl3-moe": "sparkctl.models.tiny_exl3:make_tiny_moe",
    "tiny-exl3-moe-twin": "sparkctl.models.tiny_exl3:make_tiny_moe_twin",
}
