"""Our reference decoder on checkpoints made by exllamav3 1.6.5's own converter (tests/fixtures/exl3_real/):
every saved module's W = diag(suh) Hk W_hat Hn diag(svh) against exllamav3's own reconstruction
(LinearEXL3.get_weight_tensor), the layer metadata (K, codebook) as the converter's quantization_config.json
records it, and Qwen4Exp's packed n-gram table (the converter's own ``exl3_ngram_trellis`` file) decoded by
``sparkctl_exl3.ngram`` against exllamav3's decode of every row. Cheap (no engine), so it runs for every fixture,
the architectures vLLM's CPU build cannot run included; the vLLM comparison is
tests/plugin/test_exl3_real_fixtures.py. Also: the Glm5Next / Qwen4Exp source specs the fixtures are made from
still match transformers' own model classes (where transformers has them)."""

from __future__ import annotations

import importlib.util
import json

import exl3_real
import pytest
import torch
from sparkctl_exl3 import ngram
from sparkctl_exl3 import reference as ref
from sparkctl_exl3.vllm_plugin import forward

MAKE = exl3_real._make_fixtures()
NGRAM_FIXTURES = [f.name for f in MAKE.FIXTURES if f.source == "qwen4exp"]
HASHING = ("ngram_heads_vocab_sizes", "ngram_heads_offsets", "layer_multipliers")


def _linears(name: str) -> dict[str, dict[str, torch.Tensor]]:
    """The fixture's EXL3 linears: its stored trellis groups less an n-gram table's row shards (which are
    ``<prefix>.shard_<n>.trellis`` too, in ngram_embedding.safetensors, with no suh/svh)."""
    return {
        k: g for k, g in exl3_real.stored_layers(name).items() if ".ngram_embedding.shard_" not in k + "."
    }


def _is_mtp(key: str, name: str) -> bool:
    """An MTP layer's module (quantized at the converter's --mtp_bits): Qwen4Exp's ``mtp.*``, Glm5Next's layer
    num_hidden_layers (the DeepSeek-V3 layout)."""
    cfg = json.loads((exl3_real.path(name) / "model" / "config.json").read_text())
    text = cfg.get("text_config", cfg)
    n = text.get("num_hidden_layers")
    return key.startswith("mtp.") or (bool(text.get("num_nextn_predict_layers")) and f".layers.{n}." in key)


# the same bound the shared vectors are held to (kernels/README.md): exllamav3 reconstructs in fp16 with its own
# Hadamard order, ours in fp32 rounded once, so the two agree to ~5e-4 relative, never bit for bit
W_REL_TOL = 1e-3
# exllamav3's GEMM takes fp16 activations and accumulates in its own order; the plugin's CPU path is fp32 through
# the reference decoder (the bound kernels/bench/plugin_gpu_check.py holds the CUDA path to, per linear)
GEMM_REL_TOL = 5e-3


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("name", exl3_real.NAMES)
def test_reference_decoder_matches_exllamav3_dequantized_weights(name: str) -> None:
    if reason := exl3_real.missing_reason(name):
        pytest.skip(reason)
    refs = exl3_real.reference(name)
    layers = _linears(name)
    saved = sorted(k.removeprefix("dequant.") for k in refs if k.startswith("dequant."))
    assert saved, f"{name}: no dequantized weights saved"
    assert "lm_head" in saved and len(saved) >= 2, f"{name}: dequantized {saved}"
    worst = (0.0, "")
    for key in saved:
        g = layers[key]
        cb = ref.codebook_of(g)
        w = ref.weight(g["trellis"], g["suh"], g["svh"], cb)
        theirs = refs[f"dequant.{key}"]
        assert w.shape == theirs.shape, f"{name} {key}: {tuple(w.shape)} vs exllamav3 {tuple(theirs.shape)}"
        err = _rel(w, theirs)
        assert err <= W_REL_TOL, f"{name} {key} (K={ref.bits_of(g['trellis'])}, {cb}): rel err {err:.2e}"
        worst = max(worst, (err, key))
    print(f"\n{name}: {len(saved)} modules, worst rel err {worst[0]:.1e} ({worst[1]})")


@pytest.mark.parametrize("name", exl3_real.NAMES)
def test_layer_rates_and_codebooks_are_as_the_converter_recorded(name: str) -> None:
    if reason := exl3_real.missing_reason(name):
        pytest.skip(reason)
    meta = exl3_real.meta(name)
    layers = _linears(name)
    qcfg = json.loads((exl3_real.path(name) / "model" / "config.json").read_text())["quantization_config"]
    assert qcfg["quant_method"] == "exl3" and qcfg["codebook"] == meta["codebook"]
    recorded = json.loads((exl3_real.path(name) / "model" / "quantization_config.json").read_text())
    storage = recorded["tensor_storage"]
    assert layers, f"{name}: no EXL3 module in the checkpoint"
    for key, g in layers.items():
        cb = ref.codebook_of(g)
        assert cb == meta["codebook"], f"{name} {key}: codebook {cb}, converter ran with {meta['codebook']}"
        k = ref.check_layer(g["trellis"], g["suh"], g["svh"], cb)
        if key not in storage and _is_mtp(key, name):
            # the converter's tensor_storage lists the text model only (seen with Glm5Next's layer N); its MTP
            # modules carry the run's mtp_bits
            assert float(recorded["mtp_bits"]) == k, (
                f"{name} {key}: K={k}, converter's mtp_bits {recorded['mtp_bits']}"
            )
            continue
        assert storage[key]["quant_format"] == "exl3" and float(storage[key]["bits_per_weight"]) == k
    mtp = [k for k in layers if _is_mtp(k, name)]
    rates = [ref.bits_of(layers[k]["trellis"]) for k in layers if k != "lm_head" and k not in mtp]
    mean = sum(rates) / len(rates)
    # the converter's allocation gives these uniform tiny models --bits everywhere (make_fixtures.py --dry-run
    # prints its strategy); a little slack in case a layer is promoted
    assert abs(mean - meta["bits"]) <= 0.25, f"{name}: mean K {mean:.2f} far from --bits {meta['bits']}"
    assert ref.bits_of(layers["lm_head"]["trellis"]) == meta["head_bits"]
    if meta.get("mtp_bits"):  # the MTP layer is there, quantized at --mtp_bits
        assert mtp, f"{name}: no MTP module among the EXL3 layers"
        off = {
            k: ref.bits_of(layers[k]["trellis"])
            for k in mtp
            if ref.bits_of(layers[k]["trellis"]) != meta["mtp_bits"]
        }
        assert not off, f"{name}: MTP modules not at --mtp_bits {meta['mtp_bits']}: {off}"


@pytest.mark.parametrize("name", exl3_real.NAMES)
def test_plugin_linear_matches_exllamav3_gemm(name: str) -> None:
    """The plugin's EXL3 linear forward (vllm_plugin.forward.exl3_linear on the shard finish_shard makes of the
    stored tensors, CPU path) against exllamav3's own LinearEXL3.forward on the same fp16 rows, for every saved
    module: the layer-level check of the architectures whose vLLM model cannot run on the CPU (Glm5Next, Qwen4Exp:
    their KDA / MLA / indexer / mHC / n-gram projections, MTP included), and of the others alike."""
    if reason := exl3_real.missing_reason(name):
        pytest.skip(reason)
    refs = exl3_real.reference(name)
    layers = _linears(name)
    keys = sorted(
        k.removeprefix("gemm.").removesuffix(".x") for k in refs if k.startswith("gemm.") and k.endswith(".x")
    )
    if not keys:
        pytest.skip(
            f"{name}: made before the GEMM outputs were saved (make_fixtures.py --only {name} remakes it)"
        )
    worst = (0.0, "")
    for key in keys:
        shard = forward.finish_shard(key, {n: t for n, t in layers[key].items() if n != "bias"})
        x, theirs = refs[f"gemm.{key}.x"], refs[f"gemm.{key}.y"]
        ours = forward.exl3_linear(x.float(), shard, theirs.shape[-1], torch.float32)
        err = _rel(ours, theirs)
        assert err <= GEMM_REL_TOL, f"{name} {key} (K={shard.bits}, {shard.codebook}): rel err {err:.2e}"
        worst = max(worst, (err, key))
    print(f"\n{name}: {len(keys)} linears, worst rel err {worst[0]:.1e} ({worst[1]})")


@pytest.mark.parametrize("name", NGRAM_FIXTURES)
def test_ngram_table_decodes_as_exllamav3_decodes_it(name: str) -> None:
    """The converter's packed n-gram table through our reader and decoder (what the plugin's lookup op is held
    to bit for bit) against exllamav3's NgramTableReader.dequant of the rows it saved (every 16th and the head edges); and the hashing parameters the
    converter copied are the ones the source model was made with (transformers' rule, as vLLM hashes)."""
    if reason := exl3_real.missing_reason(name):
        pytest.skip(reason)
    model = exl3_real.path(name) / "model"
    table = ngram.load_table(model / "ngram_embedding.safetensors")
    refs = exl3_real.reference(name)
    theirs = refs["ngram.rows"]
    # the rows exllamav3 decoded: a sample (every 16th, the head edges) or, in fixtures made before, all of them
    ids = refs.get("ngram.row_ids", torch.arange(table.num_rows))
    assert int(ids.max()) == table.num_rows - 1  # the sample reaches the table's end
    # rows past the last head (the converter pads the table to whole shards of 16-row tiles) are never looked up:
    # a lookup's row is offset + hash mod the head's size. exllamav3's decode of them differs from ours (seen in
    # qwen4exp-3.0-mul1: rows 32880.. of 32896), so only the rows a lookup can reach are held to it
    end = int(table.head_offsets[-1] + table.head_vocab_sizes[-1])
    real = ids < end
    assert int(real.sum()) >= len(ids) - 16
    ids, theirs = ids[real], theirs[real]
    ours = table.dequantize_all()[ids]
    assert ours.shape == theirs.shape == (len(ids), ngram.ROW_DIM)
    assert ngram.bits_of(table.shards[0].shape[1]) == exl3_real.meta(name)["ngram_table"]["K"]
    exact = float((ours == theirs).float().mean())
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=1e-3, atol=1e-4)
    assert exact >= 0.999, f"{name}: only {exact:.2%} of the n-gram values bit-equal to exllamav3's"
    text = json.loads((model / "config.json").read_text())["text_config"]
    layer = int(ngram.find_prefix(model / "ngram_embedding.safetensors").split(".layers.")[1].split(".")[0])
    want = MAKE.ngram_hashing(text, layer)
    assert table.head_vocab_sizes.tolist() == want["ngram_heads_vocab_sizes"]
    assert table.head_offsets.tolist() == want["ngram_heads_offsets"]
    assert table.layer_multipliers.tolist() == want["layer_multipliers"]
    print(f"\n{name}: {table.num_rows} n-gram rows, {exact:.2%} bit-equal")


@pytest.mark.slow
@pytest.mark.parametrize("kind", MAKE.SPEC_SOURCES)
def test_source_spec_matches_transformers(kind: str, tmp_path) -> None:  # noqa: ANN001
    """sources/<kind>.json (what make_fixtures.py writes the Glm5Next / Qwen4Exp sources from, on a device without
    transformers) is still what transformers' own classes make at the config's sizes, and a source written from
    it loads back into transformers with no tensor missing (the vision tower aside for the text-only Qwen4Exp)
    or mismatched, and runs to finite logits with a real spread."""
    arch = {"glm5next": "glm5_next", "qwen4exp": "qwen4_exp"}[kind]
    if importlib.util.find_spec(f"transformers.models.{arch}") is None:
        pytest.skip(f"transformers here has no {arch} model (5.19 has)")
    committed = json.loads((MAKE.SPEC_DIR / f"{kind}.json").read_text())
    assert MAKE.hf_spec(kind) == committed, f"sources/{kind}.json is stale: make_fixtures.py --write-specs"
    src = MAKE.write_source(kind, tmp_path / kind)
    if kind == "glm5next":
        from transformers.models.glm5_next.modeling_glm5_next import Glm5NextForConditionalGeneration as cls
    else:
        from transformers.models.qwen4_exp.modeling_qwen4_exp import Qwen4ExpForConditionalGeneration as cls
    model, info = cls.from_pretrained(str(src), output_loading_info=True, dtype=torch.float32)
    missing = [k for k in info["missing_keys"] if not (kind == "qwen4exp" and k.startswith("model.visual."))]
    assert not missing and not info["mismatched_keys"], (
        f"{kind}: missing {missing[:5]}, {info['mismatched_keys']}"
    )
    # what transformers leaves out on load is the MTP layer, and only that (its names as transformers renames them)
    n = json.loads((src / "config.json").read_text())["text_config"]["num_hidden_layers"]
    mtp = (f"model.language_model.layers.{n}.", "mtp.")
    assert any(k.startswith(mtp) for k in committed), f"{kind}: no MTP layer in the spec"
    # and the k-pool pair of a shared-indexer DSA layer, which transformers does not build but exllamav3's
    # MLAttention reads on every DSA layer
    text = json.loads((src / "config.json").read_text())["text_config"]
    kpool = {
        f"model.language_model.layers.{i}.self_attn.indexer.index_kpool_compress_{leaf}"
        for i, t in enumerate(text.get("indexer_types", []))
        if t == "shared"
        for leaf in ("ape", "gate")
    }
    extra = [k for k in info["unexpected_keys"] if not k.startswith(mtp) and k not in kpool]
    assert not extra, f"{kind}: transformers did not take {extra[:5]}"
    rows = MAKE.prompt_ids(src)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([rows[-1]])).logits[0]
    assert torch.isfinite(logits).all() and float(logits.std()) > 1.0, (
        f"{kind}: logits std {float(logits.std())}"
    )
    if kind == "qwen4exp":  # the hashing buffers written into the source are the ones transformers computes
        fresh = type(model)(
            model.config
        ).state_dict()  # computed from config.json, not loaded from the source
        hf = {k.rsplit(".", 1)[1]: v.tolist() for k, v in fresh.items() if k.endswith(HASHING)}
        assert hf == MAKE.ngram_hashing(json.loads((src / "config.json").read_text())["text_config"], 1)
