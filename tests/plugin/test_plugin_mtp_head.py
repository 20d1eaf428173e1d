"""Which quantization method an MTP layer's head gets from the exl3 plugin.

vLLM's MTP drafts (Glm4MoeMTP, DeepSeek-style MTP) build a ParallelLMHead inside each MTP layer
(``shared_head.head``, vLLM prefix ``model.layers.<N>.head``) that checkpoints do not store: after loading,
vLLM's proposer always replaces it with the target's lm_head. As an EXL3 layer it refused to finish loading
without its trellis, so ``sparkctl up`` of an EXL3 model with ``speculative: {method: mtp}`` failed at engine
start; it must get a plain placeholder, while a missing top-level ``lm_head`` is still an EXL3 layer that
names what the checkpoint lacks. The end-to-end serve is tests/plugin/test_exl3_real_mtp.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm  # builds vLLM layers (tests/plugin/conftest.py, vllm_env)


def test_unstored_mtp_head_is_a_plain_placeholder(vllm_env: object, tiny_models: dict[str, Path]) -> None:
    from sparkctl_exl3.vllm_plugin.config import EXL3Config
    from sparkctl_exl3.vllm_plugin.linear import EXL3LinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    cfg = EXL3Config.from_config({"quant_method": "exl3", "bits": 4.0, "head_bits": 6})
    cfg.maybe_update_config(str(tiny_models["dense"]))
    assert cfg.index is not None and "lm_head" in cfg.index.exl3 and not cfg.tie_word_embeddings
    mtp_head = ParallelLMHead(640, 128, quant_config=cfg, prefix="model.layers.2.head")
    assert isinstance(mtp_head.quant_method, UnquantizedEmbeddingMethod)
    head = ParallelLMHead(640, 128, quant_config=cfg, prefix="lm_head")
    assert isinstance(head.quant_method, EXL3LinearMethod)
    # a checkpoint that lacks its own lm_head still gets the EXL3 method, which names the missing tensors
    cfg.index.exl3.discard("lm_head")
    lost = ParallelLMHead(640, 128, quant_config=cfg, prefix="lm_head")
    assert isinstance(lost.quant_method, EXL3LinearMethod)


def test_an_mtp_head_the_checkpoint_stores_keeps_its_storage(
    vllm_env: object, tiny_models: dict[str, Path]
) -> None:
    from sparkctl_exl3.vllm_plugin.config import EXL3Config
    from sparkctl_exl3.vllm_plugin.linear import EXL3LinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    cfg = EXL3Config.from_config({"quant_method": "exl3", "bits": 4.0, "head_bits": 6})
    cfg.maybe_update_config(str(tiny_models["dense"]))
    cfg.index.exl3.add("model.layers.2.head")
    stored = ParallelLMHead(640, 128, quant_config=cfg, prefix="model.layers.2.head")
    assert isinstance(stored.quant_method, EXL3LinearMethod)
