"""What the planner renders for llama.cpp and FreeToken recipes: the context each slot really gets, the
MoE placement, drafting, load-mode and metrics flags, and the settings those engines cannot take."""

from __future__ import annotations

import pytest

from sparkctl.errors import UserError
from sparkctl.planner import plan
from sparkctl.recipe import load_recipe


def argv(name: str, *sets: str) -> list[str]:
    return list(plan(load_recipe(name, sets), check_memory=False).argv)


def value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


@pytest.mark.parametrize(("seqs", "length"), [(1, 32768), (2, 512), (4, 2048)])
def test_ctx_size_is_max_model_len_per_slot(seqs: int, length: int) -> None:
    """llama-server divides -c among its -np slots: -c 2048 -np 4 gave each sequence 512 tokens."""
    a = argv("tiny-gguf", f"serve.max_num_seqs={seqs}", f"serve.max_model_len={length}")
    assert value(a, "--ctx-size") == str(length * seqs)
    assert value(a, "--parallel") == str(seqs)
    assert "--kv-unified" not in a


def test_unified_kv_keeps_the_per_sequence_cap() -> None:
    a = argv("tiny-gguf-moe")
    assert value(a, "--ctx-size") == "1024" and value(a, "--parallel") == "2"
    assert "--kv-unified" in a and value(a, "--kv-unified-per-slot") == "512"


def test_no_max_num_seqs_means_one_slot_not_llama_servers_auto_four() -> None:
    a = argv("tiny-gguf", "serve.max_num_seqs=null")
    assert value(a, "--parallel") == "1" and value(a, "--ctx-size") == "512"


def test_memory_plan_counts_every_slot() -> None:
    p = plan(load_recipe("tiny-gguf", ("serve.max_num_seqs=4",)), check_memory=False)
    assert p.memory.kv_cache_bytes == 4 * 512 * 1024  # 2 layers x 2 kv heads x 64 x (k+v) x f16


def test_moe_offload_flags() -> None:
    a = argv("tiny-gguf-moe")
    assert value(a, "--n-cpu-moe") == "1"
    assert value(a, "--override-tensor") == r"blk\.1\.ffn_(up|gate|down)_exps\.weight=CPU"
    a = argv(
        "tiny-gguf-moe",
        "serve.llama_cpp.n_cpu_moe=null",
        "serve.llama_cpp.cpu_moe=true",
        "serve.llama_cpp.override_tensor=['a=CPU', 'b\\.c=CUDA0']",
    )
    assert "--cpu-moe" in a and "--n-cpu-moe" not in a
    assert value(a, "--override-tensor") == r"a=CPU,b\.c=CUDA0"


def test_spec_load_mode_and_metrics() -> None:
    a = argv(
        "ornith-1.5-35b-a3b-iq3s",
        "serve.llama_cpp.speculative={type: draft-mtp, draft_max: 3, draft_min: 1}",
        "serve.llama_cpp.load_mode=dio",
        "serve.llama_cpp.metrics=true",
    )
    assert value(a, "--spec-type") == "draft-mtp"
    assert value(a, "--spec-draft-n-max") == "3" and value(a, "--spec-draft-n-min") == "1"
    assert value(a, "--load-mode") == "dio" and "--metrics" in a
    assert value(a, "--n-gpu-layers") == "99"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("serve.llama_cpp.cpu_moe=true",), "set cpu_moe (all layers) or n_cpu_moe"),
        (
            ("serve.llama_cpp.override_tensor=['no-buffer-type']",),
            "must be one `<tensor name regex>=<buffer type>`",
        ),
        (("serve.llama_cpp.override_tensor=['a=CPU,b=CPU']",), "must be one"),
        (("serve.llama_cpp.load_mode=mmapp",), "load_mode"),
        (("serve.llama_cpp.speculative={type: mtp}",), "draft-mtp"),
        (("serve.llama_cpp.speculative={type: draft-mtp, draft_max: 2, draft_min: 3}",), "draft_min (3)"),
    ],
)
def test_bad_llamacpp_fields_are_refused(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        load_recipe("tiny-gguf-moe", sets)


def test_vllm_settings_are_refused_for_llamacpp() -> None:
    with pytest.raises(UserError, match="serve.gpu_memory_utilization is a vLLM setting; llama-server"):
        plan(load_recipe("tiny-gguf", ("serve.gpu_memory_utilization=0.8",)), check_memory=False)


def test_freetoken_command() -> None:
    a = argv("ornith-1.5-35b-a3b-freetoken")
    assert a[1] == "serve"
    assert value(a, "--model-path") == "vcruz305/Ornith-1.5-35B-A3B-GGUF"
    assert value(a, "--served-model-name") == "ornith-1.5-35b-a3b-freetoken"
    assert value(a, "--max-seq-len-override") == "32768" and value(a, "--max-running-requests") == "1"
    assert value(a, "--moe-strategy") == "auto"
    a = argv(
        "ornith-1.5-35b-a3b-freetoken",
        "serve.freetoken.moe_strategy=offload",
        "serve.freetoken.moe_cache_mem=6GiB",
        "serve.freetoken.memory_ratio=0.8",
    )
    assert value(a, "--moe-strategy") == "offload" and value(a, "--moe-cache-mem") == "6GiB"
    assert value(a, "--memory-ratio") == "0.8"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (("engine.device=cpu",), "NVIDIA GPUs only"),
        (("serve.freetoken.moe_cache_mem=6GiB", "serve.freetoken.moe_cache_rate=0.5"), "not both"),
        (("serve.freetoken.moe_cache_mem=lots",), "moe_cache_mem"),
    ],
)
def test_bad_freetoken_fields_are_refused(sets: tuple[str, ...], message: str) -> None:
    with pytest.raises(UserError, match=message):
        load_recipe("ornith-1.5-35b-a3b-freetoken", sets)


def test_freetoken_refuses_what_it_cannot_do() -> None:
    with pytest.raises(UserError, match="FreeToken picks its KV dtype"):
        plan(load_recipe("ornith-1.5-35b-a3b-freetoken", ("serve.kv_cache_dtype=fp8",)), check_memory=False)
    with pytest.raises(UserError, match="kv_cache_memory_bytes is a vLLM setting; FreeToken"):
        plan(
            load_recipe("ornith-1.5-35b-a3b-freetoken", ("serve.kv_cache_memory_bytes=1000000",)),
            check_memory=False,
        )
