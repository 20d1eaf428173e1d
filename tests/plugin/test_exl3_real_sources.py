"""The source models make_fixtures.py hands to exllamav3's converter (tests/fixtures/exl3_real/): each loads in
Hugging Face transformers as the architecture it claims, and its logits have the spread the fixtures rely on
(a top-1 that is not a coin toss between near-ties), so a change to the script is caught here, not after a
device run."""

from __future__ import annotations

import json
from pathlib import Path

import exl3_real
import pytest
import torch

MAKE = exl3_real._make_fixtures()
# the spec sources (Glm5Next, Qwen4Exp) are multimodal / checkpoint-layout models transformers does not load as
# AutoModelForCausalLM from these names; the tests below hold their specs to what exllamav3's converter reads
WRITTEN = [k for k in MAKE.SOURCES if k not in MAKE.SPEC_SOURCES]


def _spec(kind: str) -> dict[str, list]:
    return json.loads((MAKE.SPEC_DIR / f"{kind}.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("kind", WRITTEN)
def test_source_model_loads_and_has_spread_logits(tmp_path: Path, kind: str) -> None:
    transformers = pytest.importorskip("transformers")
    src = MAKE.write_source(kind, tmp_path / kind)
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    arch = {"llama": "LlamaForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM", "glm4moe": "Glm4MoeForCausalLM"}
    assert type(model).__name__ == arch[kind]
    rows = MAKE.prompt_ids(src)
    assert len(rows) == len(MAKE.PROMPTS) + 1 and all(r[0] == model.config.bos_token_id for r in rows)
    gaps = []
    with torch.no_grad():
        for ids in rows:
            logits = model(torch.tensor([ids])).logits[0]
            assert torch.isfinite(logits).all() and logits.std() > 3.0
            top2 = logits.topk(2, -1).values
            gaps.append(top2[:, 0] - top2[:, 1])
    gap = torch.cat(gaps)
    assert gap.median() > 0.5, f"{kind}: median top-1 gap {gap.median():.3f}: near-uniform logits"
    # a few near-ties are expected; far fewer than the 2% of positions the fixture test may disagree on
    assert (gap < 0.01).float().mean() < 0.02


def test_glm5next_every_dsa_layer_and_the_mtp_carry_what_mla_attention_loads() -> None:
    """exllamav3's MLAttention.load_local reads the k-pool compression pair on every DSA layer (a shared-indexer
    one too), and Glm5NextMTP builds the MTP layer as DSA with a full indexer: a KDA-shaped MTP layer or a
    shared layer without the pair stopped the H200 conversion mid-model."""
    spec = _spec("glm5next")
    text = MAKE.new_arch_config(
        "glm5next", {"vocab": 640, **dict.fromkeys(("bos_token_id", "eos_token_id"), 0), "pad_token_id": 2}
    )["text_config"]
    n = text["num_hidden_layers"]
    dsa = [i for i, t in enumerate(text["layer_types"]) if t == "deepseek_sparse_attention"]
    assert "shared" in [text["indexer_types"][i] for i in dsa]
    p = "model.language_model.layers."
    ape, gate = [text["index_kpool"], text["index_head_dim"]], [text["index_head_dim"], text["hidden_size"]]
    for i in [*dsa, n]:
        assert spec[f"{p}{i}.self_attn.indexer.index_kpool_compress_ape"][0] == ape
        assert spec[f"{p}{i}.self_attn.indexer.index_kpool_compress_gate"][0] == gate
    for leaf in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "indexer.wq_b", "indexer.wk"):
        assert f"{p}{n}.self_attn.{leaf}.weight" in spec
    assert not [
        k for k in spec if k.startswith(f"{p}{n}.self_attn.") and k.endswith(("A_log", "conv1d.weight"))
    ]


def test_qwen4exp_ngram_heads_hold_the_converters_bias_stripes() -> None:
    """exllamav3's compute_head_bias reads 8192-row stripes inside every n-gram head (conversion/ngram.py); the
    first spec's 211..229-row heads ran the last stripe past the table (IndexError on the H200). The shards the
    spec stores hold the padded table exactly."""
    spec = _spec("qwen4exp")
    text = MAKE.new_arch_config(
        "qwen4exp", {"vocab": 640, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    )["text_config"]
    layer = text["ple_layer_ids"][0] - 1
    hashing = MAKE.ngram_hashing(text, layer)
    assert min(hashing["ngram_heads_vocab_sizes"]) >= 8192
    shards = sorted(k for k in spec if ".ngram_embedding.shard_" in k)
    assert len(shards) == text["split_ngram_parts"]
    rows = [spec[k][0][0] for k in shards]
    assert len(set(rows)) == 1
    sizes = hashing["ngram_heads_vocab_sizes"]
    assert sum(sizes) <= sum(rows) < sum(sizes) + text["make_ngram_vocab_size_divisible_by"]


def test_qwen4exp_gdn_gates_stored_as_the_gate_ops_take_them() -> None:
    """exllamav3's gated_delta_net_fused_op_2/_3 take dt_bias in bf16 only (A_log in bf16 or fp32), as Qwen4Exp's
    HF class saves both (no fp32-kept modules): the fp32 dt_bias of the first spec stopped the H200 conversion at
    layer 0 ("dt_bias is incorrect datatype, must be kBFloat16")."""
    spec = _spec("qwen4exp")
    gates = {k: v[1] for k, v in spec.items() if k.endswith((".linear_attn.dt_bias", ".linear_attn.A_log"))}
    assert len(gates) == 2 * 3
    assert set(gates.values()) == {"bf16"}


def test_glm5next_calibration_rows_keep_the_shared_indexer_dense() -> None:
    """The converter captures each layer in its own forward with fresh params, so a shared-indexer DSA layer that
    goes sparse finds no top-k selection (AssertionError on the H200): exllamav3 goes sparse once a row exceeds
    index_topk, so every Glm5Next calibration row stays within it."""
    text = MAKE.new_arch_config(
        "glm5next", {"vocab": 640, **dict.fromkeys(("bos_token_id", "eos_token_id"), 0), "pad_token_id": 2}
    )["text_config"]
    rows, cols = MAKE.calibration("glm5next")
    assert cols <= text["index_topk"]
    assert rows * cols >= MAKE.CAL_ROWS * MAKE.CAL_COLS
    assert MAKE.calibration("qwen4exp") == (MAKE.CAL_ROWS, MAKE.CAL_COLS)
