"""Qwen4Exp through the plugin: a tiny Qwen3.8-Flash-Next-shaped pack, prepared, loads with its n-gram table packed.

The pack (``sparkctl_exl3.tiny_qwen4exp``: our writer, exllamav3's layout) ships the index without
``ngram_embedding.safetensors`` and a config without the EXL3 declaration, as the published pack does; the prepare
stage fixes both in an overlay. vLLM's CPU build cannot construct the whole Qwen4Exp model here: its module imports
the vision tower (``vllm/model_executor/models/qwen3_vl.py``), whose transformers image processor needs
torchvision, which this CPU venv does not have (the PyPI build is CUDA-only: ``operator torchvision::nms does not
exist`` against torch+cpu). So the pieces vLLM's Qwen4Exp builds are driven directly, vLLM's own classes inside our
construction hook: its n-gram embedding module (hashing, vocab-parallel table, ``load_weights``, forward) and its
``ParallelLMHead`` as the model module makes it.
"""

from __future__ import annotations

import importlib.util
import logging
import types
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm  # builds vLLM layers (tests/plugin/conftest.py, vllm_env)


@pytest.fixture(scope="module")
def pack(tmp_path_factory: pytest.TempPathFactory):
    """(pack dir, overlay dir, expected table, prepare plan): written and prepared once."""
    from sparkctl_exl3 import tiny_qwen4exp

    from sparkctl.models.source import PrepareSteps
    from sparkctl.prepare.apply import apply
    from sparkctl.prepare.plan import plan_prepare

    root = tmp_path_factory.mktemp("qwen4exp")
    table = tiny_qwen4exp.write_pack(root / "pack")
    plan = plan_prepare(PrepareSteps(index=True, config=True, overlay=str(root / "overlay")), root / "pack")
    apply(plan)
    return root / "pack", root / "overlay", table, plan


@pytest.fixture(scope="module")
def exl3_config(pack, vllm_env):
    import json

    from sparkctl_exl3.vllm_plugin.config import EXL3Config
    from vllm.model_executor.models.utils import WeightsMapper

    _, overlay, _, _ = pack
    cfg = EXL3Config.from_config(json.loads((overlay / "config.json").read_text())["quantization_config"])
    cfg.maybe_update_config(str(overlay))
    # the renames vLLM's Qwen4ExpForConditionalGeneration applies (Qwen3-VL's mapper)
    cfg.apply_vllm_mapper(
        WeightsMapper(
            orig_to_new_prefix={
                "model.visual.": "visual.",
                "lm_head.": "language_model.lm_head.",
                "model.language_model.": "language_model.model.",
            }
        )
    )
    return cfg


def _text_config(overlay: Path):
    from transformers import Qwen4ExpConfig

    return Qwen4ExpConfig.from_pretrained(str(overlay)).text_config


def _weights(overlay: Path, prefix: str):
    """The overlay's tensors under a checkpoint prefix, through vLLM's own safetensors iterator and the index."""
    import json

    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    index = json.loads((overlay / "model.safetensors.index.json").read_text())
    files = sorted({str(overlay / f) for f in index["weight_map"].values()})
    for name, tensor in safetensors_weights_iterator(files, use_tqdm_on_load=False):
        if name.startswith(prefix + "."):
            yield name[len(prefix) + 1 :], tensor


def _build_ngram(exl3_config, overlay: Path):
    from sparkctl_exl3.vllm_plugin.qwen4_exp import exl3_construction
    from vllm.models.qwen4_exp.nvidia import ngram_embedding
    from vllm.models.qwen4_exp.nvidia.ngram_embedding import Qwen4ExpNGramEmbedding

    text = _text_config(overlay)
    with exl3_construction(exl3_config, ngram_embedding):
        return Qwen4ExpNGramEmbedding(
            text,
            int(text.ple_embed_dim),
            0,
            64,
            data_parallel_rank=0,
            prefix="language_model.model.layers.1.ple.ple_embedding",
            quant_config=exl3_config,
            params_dtype=torch.bfloat16,
        )


@pytest.fixture(scope="module")
def loaded_ngram(pack, exl3_config):
    _, overlay, _, _ = pack
    module = _build_ngram(exl3_config, overlay)
    module.load_weights(_weights(overlay, "model.language_model.layers.1.ple.ple_embedding"))
    return module


def test_prepare_lists_the_ngram_file_and_declares_exl3(pack) -> None:
    import json

    src, overlay, _, plan = pack
    shipped = json.loads((src / "model.safetensors.index.json").read_text())
    assert "ngram_embedding.safetensors" not in shipped["weight_map"].values()
    index = json.loads((overlay / "model.safetensors.index.json").read_text())
    assert "ngram_embedding.safetensors" in index["weight_map"].values()
    qc = json.loads((overlay / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "exl3" and qc["ngram_embedding"]["bits"] == 5
    assert "quantization_config" not in json.loads((src / "config.json").read_text())  # the pack is untouched
    assert any("ngram_embedding" in line for line in plan.steps)


def test_scan_counts_the_table_apart_from_exl3_modules(exl3_config) -> None:
    index = exl3_config.index
    prefix = "model.language_model.layers.1.ple.ple_embedding.ngram_embedding"
    assert not any("ngram_embedding" in m for m in index.exl3)
    info = index.ngram[prefix]
    assert (info.shard_rows, info.words, info.heads, info.dim) == ((448, 448), 51, 4, 160)
    assert "lm_head" in index.exl3 and "model.visual.blocks.0.attn.qkv" in index.plain


def test_table_loads_packed_and_lookups_decode_bit_for_bit(pack, loaded_ngram, caplog) -> None:
    from sparkctl_exl3.vllm_plugin.ple import EXL3NgramEmbeddingMethod, check_ngram_hashing

    _, _, table, _ = pack
    emb = loaded_ngram.ngram_embedding
    method = emb.embedding_method
    assert isinstance(method, EXL3NgramEmbeddingMethod)
    with caplog.at_level(logging.INFO, logger="sparkctl_exl3.vllm_plugin"):
        method.process_weights_after_loading(emb)
    check_ngram_hashing(loaded_ngram)  # the pack's head layout is the one vLLM computes
    # the table's parameter is the packed rows: 896 x 51 int16 (102 bytes a row, not 160 x 2)
    assert emb.weight.dtype == torch.int16 and tuple(emb.weight.shape) == (896, 51)
    assert emb.weight.numel() * emb.weight.element_size() == table.resident_bytes == 896 * 102
    assert torch.equal(emb.weight, torch.cat(table.shards))
    assert any("kept packed" in r.getMessage() and "resident" in r.getMessage() for r in caplog.records)
    # vLLM's forward: its own n-gram ids (CPU path), our lookup, its flatten and dequantize
    ids = torch.tensor([5, 9, 2, 300, 7, 7, 11, 2, 40], dtype=torch.int64)
    qsl = torch.tensor([0, 4, 9], dtype=torch.int32)
    context = torch.full((2, 2), 2, dtype=torch.int64)
    hidden = torch.zeros(ids.shape[0], 256, dtype=torch.bfloat16)
    rows = loaded_ngram.compute_ngram_ids(ids, qsl, context)
    assert rows.shape == (9, 4)
    got = loaded_ngram(hidden, ids, qsl, context)
    want = table.dequantize_all()[rows].reshape(9, 640)
    assert got.shape == (9, 640)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))


def test_wrong_hashing_is_refused_in_one_line(pack, exl3_config) -> None:
    from sparkctl_exl3.vllm_plugin.forward import Exl3LoadError
    from sparkctl_exl3.vllm_plugin.ple import check_ngram_hashing

    _, overlay, _, _ = pack
    module = _build_ngram(exl3_config, overlay)
    weights = dict(_weights(overlay, "model.language_model.layers.1.ple.ple_embedding"))
    weights["ngram_embedding.head_offsets"] = weights["ngram_embedding.head_offsets"] + 1
    module.load_weights(iter(weights.items()))
    with pytest.raises(Exl3LoadError, match=r"head_offsets .* differ from the ngram_heads_offsets") as err:
        check_ngram_hashing(module)
    assert "\n" not in str(err.value)


def test_lm_head_gets_the_exl3_config_where_vllm_passes_none(pack, exl3_config) -> None:
    from sparkctl_exl3 import reference
    from sparkctl_exl3.vllm_plugin.linear import EXL3LinearMethod
    from sparkctl_exl3.vllm_plugin.qwen4_exp import exl3_construction
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    _, overlay, _, _ = pack
    namespace = types.ModuleType("qwen4_exp_model")  # where vLLM's model file looks ParallelLMHead up
    namespace.ParallelLMHead = ParallelLMHead
    with exl3_construction(exl3_config, namespace):
        head = namespace.ParallelLMHead(
            512, 256, prefix="language_model.lm_head"
        )  # as vLLM's Qwen4Exp calls it
    assert namespace.ParallelLMHead is ParallelLMHead  # restored
    assert isinstance(head, ParallelLMHead) and isinstance(head.quant_method, EXL3LinearMethod)
    stored = dict(_weights(overlay, "lm_head"))
    for name, tensor in stored.items():
        getattr(head, name).weight_loader(getattr(head, name), tensor)
    head.quant_method.process_weights_after_loading(head)
    x = torch.randn(3, 256)
    want = reference.matmul(x, stored["trellis"], stored["suh"], stored["svh"], "mul1")
    torch.testing.assert_close(head.quant_method.apply(head, x), want, rtol=1e-3, atol=1e-3)
    plain = ParallelLMHead(512, 256, prefix="other_lm_head")  # outside the hook vLLM's code is untouched
    assert not isinstance(plain.quant_method, EXL3LinearMethod)


def test_split_vision_qkv_is_skipped_for_the_fused_copy(pack, exl3_config) -> None:
    from sparkctl_exl3.vllm_plugin.qwen4_exp import skip_split_vision_qkv

    _, overlay, _, _ = pack
    weights = [
        (f"model.{n}", t) for n, t in _weights(overlay, "model")
    ]  # checkpoint names, as load_weights gets
    names = [n for n, _ in skip_split_vision_qkv(iter(weights), exl3_config)]
    assert "model.visual.blocks.0.attn.qkv.weight" in names
    assert sum(".attn.q." in n for n, _ in weights) == 4  # trellis, suh, svh, mul1 of the split q
    assert not [n for n in names if n.startswith("model.visual.blocks.0.attn.") and ".qkv." not in n]
    assert "model.language_model.embed_tokens.weight" in names


#: where the stand-in below looks ParallelLMHead up, as vLLM's model modules do (set by the test)
ParallelLMHead = None


class _Qwen4ExpLike(torch.nn.Module):
    """The construction pattern of vLLM's Qwen4Exp classes (which cannot be imported on this CPU build): keyword
    ``vllm_config`` and ``prefix``, an lm_head made from the module-level ``ParallelLMHead`` without quant_config."""

    def __init__(self, *, vllm_config, prefix: str = "model") -> None:
        super().__init__()
        self.lm_head = ParallelLMHead(512, 256, prefix="language_model.lm_head")
        self.seen: list[str] = []

    def load_weights(self, weights) -> set[str]:
        self.seen = [n for n, _ in weights]
        return set(self.seen)


def test_model_class_keeps_vllms_signature_and_hooks_construction(pack, exl3_config) -> None:
    import inspect

    from sparkctl_exl3.vllm_plugin.linear import EXL3LinearMethod
    from sparkctl_exl3.vllm_plugin.qwen4_exp import exl3_model_class
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead as VllmHead

    global ParallelLMHead
    ParallelLMHead = VllmHead
    cls = exl3_model_class(_Qwen4ExpLike)
    params = inspect.signature(cls.__init__).parameters
    assert "vllm_config" in params and params["prefix"].default == "model"  # vLLM's loader requires both
    model = cls(vllm_config=types.SimpleNamespace(quant_config=exl3_config, speculative_config=None))
    assert isinstance(model.lm_head.quant_method, EXL3LinearMethod) and ParallelLMHead is VllmHead
    _, overlay, _, _ = pack
    model.load_weights((f"model.{n}", t) for n, t in _weights(overlay, "model"))
    assert "model.visual.blocks.0.attn.qkv.weight" in model.seen
    assert not any(".attn.q." in n for n in model.seen)


def test_register_points_vllm_at_our_qwen4exp_classes(vllm_env) -> None:
    from vllm import ModelRegistry

    for arch in ("Qwen4ExpForConditionalGeneration", "Qwen4ExpForCausalLM", "Qwen4ExpMTP"):
        entry = ModelRegistry.models[arch]
        assert getattr(entry, "module_name", "") == "sparkctl_exl3.vllm_plugin.qwen4_exp_models", arch
    if importlib.util.find_spec("torchvision") is None:
        pytest.skip(
            "vLLM's Qwen4Exp module cannot be imported on this CPU build: qwen3_vl -> transformers' Qwen2-VL "
            "image processor needs torchvision"
        )
    from sparkctl_exl3.vllm_plugin import qwen4_exp_models

    assert qwen4_exp_models.Qwen4ExpMTP.__mro__[1].__name__ == "Qwen4ExpMTP"
