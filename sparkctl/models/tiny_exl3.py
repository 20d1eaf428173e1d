"""The `tiny-exl3-*` generators: EXL3 checkpoints from the plugin's writer, with sparkctl's tiny tokenizer.

The writer (`sparkctl_exl3.checkpoint`) ships with the vLLM plugin and must not depend on the CLI, so the
pairing happens here: the tokenizer `tiny-llama` uses is written first, then the writer fills in config,
weights and quantization_config with that tokenizer's ids. Every tiny model thus speaks the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkctl.models import tiny


def _write(spec_name: str, out_dir: Path, *, twin: bool) -> None:
    from sparkctl_exl3 import checkpoint
    from tokenizers import Tokenizer

    out_dir = Path(out_dir)
    tiny.write_tokenizer(out_dir)
    tok = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    ids = {
        "bos_token_id": tok.token_to_id(tiny.BOS),
        "eos_token_id": tok.token_to_id(tiny.EOS),
        "pad_token_id": tok.token_to_id(tiny.PAD),
    }
    spec: Any = getattr(checkpoint, spec_name)
    checkpoint.write_model(
        spec,
        out_dir,
        vocab=tok.get_vocab_size(),
        token_ids=ids,
        eos_token_ids=[ids["eos_token_id"], tok.token_to_id(tiny.TURN_END)],
        twin=twin,
    )


def make_tiny_dense(out_dir: Path) -> None:
    """A random-weight Llama stored as EXL3 (mixed K 2..6 and 2.5, all three codebooks, quantized lm_head)."""
    _write("DENSE", out_dir, twin=False)


def make_tiny_dense_twin(out_dir: Path) -> None:
    """The same Llama with every EXL3 layer dequantized to a plain fp32 weight; serves without quantization."""
    _write("DENSE", out_dir, twin=True)


def make_tiny_moe(out_dir: Path) -> None:
    """A random-weight Mixtral-style MoE (4 experts, top-2) stored as EXL3, experts as per-expert linears."""
    _write("MOE", out_dir, twin=False)


def make_tiny_moe_twin(out_dir: Path) -> None:
    """The same MoE model with every EXL3 layer dequantized to a plain fp32 weight."""
    _write("MOE", out_dir, twin=True)
