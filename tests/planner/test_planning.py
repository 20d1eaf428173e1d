"""The planner: engine flags, derived capture sizes, memory arithmetic, refusals, docker/native models."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest

from sparkctl.errors import UserError
from sparkctl.planner import plan
from sparkctl.planner.adapters.vllm import capture_sizes
from sparkctl.planner.memory import SPARK_POOL_BYTES, GiB, host_memory_bytes, kv_bytes_per_token
from sparkctl.recipe import builtin_names, load_recipe


def flag(argv: tuple[str, ...], name: str) -> str:
    """The value after `name` in argv (fails the test when absent)."""
    assert name in argv, f"{name} not in {shlex.join(argv)}"
    return argv[argv.index(name) + 1]


# ---- vLLM flags


def test_glm_command_uses_the_vllm_033_flags() -> None:
    p = plan(load_recipe("glm-5.3-flash"))
    argv = p.argv
    # served from the prepare overlay (its chat template), mounted where the engine looks
    assert argv[:3] == ("vllm", "serve", "/models/glm-5.3-flash")
    assert flag(argv, "--long-prefill-token-threshold") == "1024"
    assert "--enable-prefix-caching" in argv
    assert flag(argv, "--kv-cache-dtype") == "fp8"
    assert flag(argv, "--quantization") == "exl3"
    assert json.loads(flag(argv, "--speculative-config")) == {"method": "mtp", "num_speculative_tokens": 2}
    i = argv.index("--cudagraph-capture-sizes")
    assert argv[i + 1 : i + 9] == ("1", "2", "3", "4", "5", "6", "8", "12")
    assert p.env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"


@pytest.mark.parametrize("name", builtin_names())
def test_no_builtin_recipe_passes_a_removed_flag(name: str) -> None:
    argv = plan(load_recipe(name), check_memory=False).argv
    assert "--max-num-partial-prefills" not in argv
    assert "--max-long-partial-prefills" not in argv


def test_removed_flag_in_extra_args_is_refused() -> None:
    with pytest.raises(UserError, match=r"--max-num-partial-prefills is removed in vLLM 0.33 \(vllm#49244\)"):
        plan(load_recipe("tiny", ["serve.extra_args=[--max-num-partial-prefills, '2']"]))
    with pytest.raises(UserError, match="removed in vLLM 0.33"):
        plan(load_recipe("tiny", ["serve.extra_args=[--max-num-partial-prefills=2]"]))


def test_derived_capture_sizes_cover_every_verify_batch() -> None:
    recipe = load_recipe("qwen3.8-flash-next")  # MTP k=3, max_num_seqs 4, no explicit list
    sizes = capture_sizes(recipe)
    for seqs in range(1, 5):
        assert 4 * seqs in sizes  # (k+1) x sequences
    assert sizes == [1, 2, 4, 8, 12, 16]
    p = plan(recipe)
    i = p.argv.index("--cudagraph-capture-sizes")
    assert list(p.argv[i + 1 : i + 1 + len(sizes)]) == [str(s) for s in sizes]


def test_capture_sizes_follow_the_draft_depth() -> None:
    recipe = load_recipe(
        "tiny", ["serve.enforce_eager=false", "serve.speculative={method: ngram, num_speculative_tokens: 4}"]
    )
    assert capture_sizes(recipe) == [1, 2, 4, 5, 8, 10, 15, 16, 20]  # k+1 = 5, 4 sequences


def test_no_capture_sizes_without_speculation_or_when_eager() -> None:
    assert capture_sizes(load_recipe("tiny")) is None
    eager = load_recipe("qwen3.8-flash-next", ["serve.enforce_eager=true"])
    assert capture_sizes(eager) is None


def test_explicit_capture_sizes_must_include_k_plus_1() -> None:
    recipe = load_recipe("glm-5.3-flash", ["serve.cudagraph_capture_sizes=[1, 2, 4, 8]"])
    with pytest.raises(UserError, match=r"must include k\+1 = 3"):
        plan(recipe)


def test_speculative_extra_keys_reach_the_json() -> None:
    recipe = load_recipe(
        "glm-5.3-flash",
        [
            "serve.speculative={method: dflash, num_speculative_tokens: 4, model: /d, extra: {draft_tensor_parallel_size: 1}}"
        ],
    )
    spec = json.loads(flag(plan(recipe).argv, "--speculative-config"))
    assert spec == {
        "method": "dflash",
        "num_speculative_tokens": 4,
        "model": "/d",
        "draft_tensor_parallel_size": 1,
    }


def test_tool_parser_turns_on_auto_tool_choice_unless_disabled() -> None:
    assert "--enable-auto-tool-choice" in plan(load_recipe("glm-5.3-flash")).argv
    off = plan(load_recipe("glm-5.3-flash", ["serve.enable_auto_tool_choice=false"]))
    assert "--enable-auto-tool-choice" not in off.argv
    assert flag(off.argv, "--tool-call-parser") == "glm47"


def test_prefix_caching_can_be_turned_off_explicitly() -> None:
    p = plan(load_recipe("glm-5.3-flash", ["serve.enable_prefix_caching=false"]))
    assert "--no-enable-prefix-caching" in p.argv and "--enable-prefix-caching" not in p.argv


def test_acceptance_cliff_is_flagged() -> None:
    p = plan(load_recipe("qwen3.8-flash-next"))
    assert any("draft-acceptance cliff at 163,840" in w for w in p.warnings)
    below = plan(load_recipe("qwen3.8-flash-next", ["serve.max_model_len=131072"]))
    assert not any("cliff" in w for w in below.warnings)


def test_recipe_hash_tracks_the_resolved_recipe() -> None:
    a = plan(load_recipe("tiny")).recipe_hash
    assert a == plan(load_recipe("tiny")).recipe_hash
    assert a != plan(load_recipe("tiny", ["serve.port=8001"])).recipe_hash
    assert len(a) == 64


# ---- models in argv: native, docker, hub


def test_tiny_native_argv_names_the_generated_model_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKCTL_CACHE_DIR", str(tmp_path))
    p = plan(load_recipe("tiny"))
    assert p.runtime == "native" and p.container is None
    assert p.argv[:3] == (sys.executable, "-m", "vllm.entrypoints.openai.api_server")
    assert flag(p.argv, "--model") == str(tmp_path / "models" / "tiny-llama")
    assert "--enforce-eager" in p.argv
    assert flag(p.argv, "--dtype") == "float32"
    assert p.model.generate == "tiny-llama"
    assert (p.host, p.port, p.served_model_name) == ("127.0.0.1", 8000, "tiny")


def test_native_model_path_is_used_as_is(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"\0" * 4096)
    p = plan(load_recipe("tiny"), model_path=str(tmp_path))
    assert flag(p.argv, "--model") == str(tmp_path)
    assert p.memory.weights_bytes == 4096  # sized from the files on disk


def test_docker_model_path_is_mounted_read_only_and_named_inside(tmp_path: Path) -> None:
    p = plan(load_recipe("glm-5.3-flash"), model_path=str(tmp_path))
    assert p.argv[2] == "/models/glm-5.3-flash"
    assert "--revision" not in p.argv  # a local snapshot is already the pinned revision
    mounts = {m.target: m for m in p.container.mounts}
    assert mounts["/models/glm-5.3-flash"].source == str(tmp_path)
    assert mounts["/models/glm-5.3-flash"].read_only is True
    assert mounts["/root/.cache/huggingface"].read_only is False


def test_docker_container_settings() -> None:
    p = plan(load_recipe("glm-5.3-flash"))
    c = p.container
    assert (c.image, c.name, c.gpus, c.network_host, c.ipc_host, c.shm_size) == (
        "sparkctl/vllm-exl3:0.33.0-sm121",
        "sparkctl-glm-5.3-flash",
        True,
        True,
        True,
        "16g",
    )
    assert c.ulimits == {"memlock": (-1, -1), "stack": (67108864, 67108864)}
    assert c.labels == {"io.sparkctl.recipe": "glm-5.3-flash", "io.sparkctl.recipe-hash": p.recipe_hash}
    assert p.model.repo == "vcruz305/GLM-5.3-Flash-EXL3-K2"
    assert p.model.expected_shards == 120


def test_two_spark_recipe_uses_ray_tp2_and_the_cx7_env() -> None:
    p = plan(load_recipe("glm-5.3-flash-4bpw-2x", ["cluster.head_address=192.168.100.10"]))
    assert flag(p.argv, "--tensor-parallel-size") == "2"
    assert flag(p.argv, "--distributed-executor-backend") == "ray"
    for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "UCX_NET_DEVICES", "TP_SOCKET_IFNAME"):
        assert p.env[var] == "enp1s0f1np1"
    assert p.env["NCCL_IB_HCA"] == "rocep1s0f1,roceP2p1s0f1"
    assert p.env["RAY_memory_monitor_refresh_ms"] == "0"
    assert p.env["NCCL_IB_DISABLE"] == "0"
    assert p.env["VLLM_HOST_IP"] == p.env["MASTER_ADDR"] == "192.168.100.10"
    assert p.container.devices == ("/dev/infiniband",)
    assert any("--nodes HEAD,WORKER" in n for n in p.notes)
    assert not any("head_address" in w for w in p.warnings)
    unset = plan(load_recipe("glm-5.3-flash-4bpw-2x"))
    assert any("cluster.head_address not set" in w for w in unset.warnings)


def test_cluster_shape_is_validated() -> None:
    with pytest.raises(UserError, match="must equal nodes"):
        load_recipe("glm-5.3-flash", ["cluster.nodes=2", "cluster.executor=ray"])
    with pytest.raises(UserError, match="more than one node needs executor: ray"):
        load_recipe("glm-5.3-flash", ["cluster.nodes=2", "cluster.tensor_parallel=2"])


# ---- llama.cpp


def test_gguf_recipe_renders_llama_server_from_the_hub() -> None:
    p = plan(load_recipe("ornith-1.5-35b-a3b-iq3s"))
    assert p.engine == "llama.cpp"
    assert p.argv[0] == "llama-server"
    assert flag(p.argv, "--hf-repo") == "vcruz305/Ornith-1.5-35B-A3B-GGUF:IQ3_S"
    assert flag(p.argv, "--ctx-size") == "32768"
    assert flag(p.argv, "--n-gpu-layers") == "99"
    assert flag(p.argv, "--flash-attn") == "on"
    assert flag(p.argv, "--alias") == "ornith-1.5-35b-a3b-iq3s"


def test_gguf_model_path_picks_the_first_shard(tmp_path: Path) -> None:
    for f in ("m-IQ3_S-00002-of-00003.gguf", "m-IQ3_S-00001-of-00003.gguf", "m-Q8_0.gguf"):
        (tmp_path / f).write_bytes(b"GGUF")
    p = plan(load_recipe("ornith-1.5-35b-a3b-iq3s"), model_path=str(tmp_path))
    assert flag(p.argv, "--model") == str(tmp_path / "m-IQ3_S-00001-of-00003.gguf")
    assert "--hf-repo" not in p.argv


def test_gguf_model_path_without_a_matching_file_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "m-Q8_0.gguf").write_bytes(b"GGUF")
    with pytest.raises(UserError, match="no .gguf file found"):
        plan(load_recipe("ornith-1.5-35b-a3b-iq3s"), model_path=str(tmp_path))


def test_vllm_only_settings_are_refused_for_llama_cpp() -> None:
    with pytest.raises(UserError, match="serve.gpu_memory_utilization is a vLLM setting"):
        plan(load_recipe("qwen3.8-27b-gguf", ["serve.gpu_memory_utilization=0.5"]))


def test_engine_and_format_must_agree() -> None:
    with pytest.raises(UserError, match="engine llama.cpp serves gguf models, not safetensors"):
        load_recipe("tiny", ["engine.name=llama.cpp"])


# ---- memory


def test_glm_mla_kv_matches_the_published_sizing() -> None:
    # vllm-exl3 0.3.1: 1.51 GiB of fp8 MLA KV per 64K tokens over 43 layers
    recipe = load_recipe("glm-5.3-flash")
    per_token = kv_bytes_per_token(recipe)
    assert per_token == 43 * 576
    assert round(per_token * 65536 / GiB, 2) == 1.51
    assert round(per_token * 262144 / GiB, 2) == 6.05


def test_glm_memory_plan_numbers() -> None:
    m = plan(load_recipe("glm-5.3-flash")).memory
    assert m.total_bytes == SPARK_POOL_BYTES
    assert m.budget_bytes == int(0.91 * SPARK_POOL_BYTES)
    assert m.kv_cache_bytes == m.budget_bytes - m.weights_bytes - m.runtime_overhead_bytes
    assert m.max_context_tokens == m.kv_cache_bytes // (43 * 576)
    assert m.max_context_tokens >= 65536
    assert m.fits


def test_k2k3_capacity_is_close_to_the_measured_kv_pool() -> None:
    # GMIX measured 337,042 KV tokens at 64k and utilisation 0.91; the default overhead is calibrated on it
    m = plan(load_recipe("glm-5.3-flash-k2k3")).memory
    assert abs(m.max_context_tokens - 337_042) / 337_042 < 0.02


def test_context_that_does_not_fit_is_refused_with_the_numbers() -> None:
    recipe = load_recipe("glm-5.3-flash-k2k3", ["serve.max_model_len=1048576"])
    with pytest.raises(UserError) as info:
        plan(recipe)
    msg = str(info.value)
    assert msg.startswith(
        "recipe glm-5.3-flash-k2k3 does not fit in memory: the KV cache (7.72 GiB) holds 334,586"
    )
    assert "fewer than max_model_len 1,048,576 (needs 24.19 GiB)" in msg
    assert "serve.max_model_len" in info.value.hint


def test_weights_larger_than_the_budget_are_refused() -> None:
    with pytest.raises(
        UserError,
        match=r"no room for a KV cache: weights 92.31 GiB \+ overhead 5.00 GiB exceed the engine budget 85.18 GiB",
    ):
        plan(load_recipe("glm-5.3-flash", ["serve.gpu_memory_utilization=0.7"]))


def test_explicit_kv_bytes_beyond_the_pool_are_refused() -> None:
    recipe = load_recipe(
        "glm-5.3-flash", ["serve.gpu_memory_utilization=null", f"serve.kv_cache_memory_bytes={40 * GiB}"]
    )
    with pytest.raises(UserError, match=r"the plan needs 137.31 GiB but the pool is 121.69 GiB"):
        plan(recipe)
    ok = plan(
        load_recipe(
            "glm-5.3-flash", ["serve.gpu_memory_utilization=null", f"serve.kv_cache_memory_bytes={3 * GiB}"]
        )
    )
    assert flag(ok.argv, "--kv-cache-memory-bytes") == str(3 * GiB)
    assert "--gpu-memory-utilization" not in ok.argv
    assert ok.memory.budget_bytes == ok.memory.weights_bytes + 3 * GiB + ok.memory.runtime_overhead_bytes


def test_utilisation_above_the_recipe_limit_is_refused() -> None:
    with pytest.raises(UserError, match="gpu_memory_utilization 0.9 is above this recipe's limit 0.85"):
        plan(load_recipe("qwen3.8-flash-next", ["serve.gpu_memory_utilization=0.9"]))


def test_tight_plan_warns_instead_of_refusing() -> None:
    p = plan(load_recipe("glm-5.3-flash", ["serve.gpu_memory_utilization=0.97"]))
    assert p.memory.fits
    assert any("left outside the engine" in w for w in p.warnings)


def test_check_memory_false_returns_an_unfit_plan() -> None:
    p = plan(load_recipe("glm-5.3-flash", ["serve.gpu_memory_utilization=0.7"]), check_memory=False)
    assert p.memory.fits is False
    assert any(w.startswith("does not fit: no room for a KV cache") for w in p.warnings)


def test_tiny_plans_against_host_ram_on_a_machine_without_a_gpu() -> None:
    m = plan(load_recipe("tiny")).memory
    assert m.total_bytes == host_memory_bytes() > 0
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 64 * 4  # layers x (K,V) x heads x head_dim x float32
    assert m.kv_cache_bytes == 256 * 1024**2
    assert m.budget_bytes == m.weights_bytes + m.kv_cache_bytes + m.runtime_overhead_bytes
    assert m.fits
    assert any("this host's RAM" in n for n in m.notes)


def test_tiny_does_not_fit_a_tiny_pool() -> None:
    with pytest.raises(UserError, match="the plan needs 2.25 GiB but the pool is 1.00 GiB"):
        plan(load_recipe("tiny", [f"memory.pool_bytes={GiB}"]))


def test_gqa_kv_heads_split_across_tensor_parallel_ranks() -> None:
    base = ["engine.device=cuda", "model.kv={layers: 10, kv_heads: 8, head_dim: 128}", "serve.dtype=bfloat16"]
    one = load_recipe("tiny", base)
    assert kv_bytes_per_token(one) == 10 * 2 * 8 * 128 * 2
    two = load_recipe("tiny", [*base, "cluster.nodes=2", "cluster.tensor_parallel=2", "cluster.executor=ray"])
    assert kv_bytes_per_token(two) == 10 * 2 * 4 * 128 * 2
    fp8 = load_recipe("tiny", [*base, "serve.kv_cache_dtype=fp8"])
    assert kv_bytes_per_token(fp8) == 10 * 2 * 8 * 128


def test_relative_model_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    p = plan(load_recipe("glm-5.3-flash"), model_path="weights")
    mount = next(m for m in p.container.mounts if m.target == "/models/glm-5.3-flash")
    assert mount.source == str(tmp_path / "weights")
    native = plan(load_recipe("tiny", ["model.generate=null", "model.path=weights"]))
    assert flag(native.argv, "--model") == str(tmp_path / "weights")
    assert native.model.path == str(tmp_path / "weights")


def test_kv_dtype_typos() -> None:
    p = plan(load_recipe("glm-5.3-flash", ["serve.kv_cache_dtype=fp8_e4m"]))
    assert any(
        "'fp8_e4m' is not a vLLM 0.33 built-in KV dtype (did you mean 'fp8_e4m3'?)" in w for w in p.warnings
    )
    assert not any("kv_cache_dtype" in w for w in plan(load_recipe("glm-5.3-flash")).warnings)
    with pytest.raises(UserError, match="'q8' is not a llama-server cache type; did you mean 'q8_0'"):
        plan(load_recipe("qwen3.8-27b-gguf", ["serve.kv_cache_dtype=q8"]))
    ok = plan(load_recipe("qwen3.8-27b-gguf", ["serve.kv_cache_dtype=q8_0"]))
    assert flag(ok.argv, "--cache-type-k") == flag(ok.argv, "--cache-type-v") == "q8_0"


# ---- KV geometry from a local model's config.json


def write_config(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # GQA: layers x (K, V) x kv heads x head_dim x 2 bytes (bf16)
        (
            {
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "hidden_size": 4096,
            },
            32 * 2 * 8 * 128 * 2,
        ),
        # MHA without num_key_value_heads, explicit head_dim
        (
            {"num_hidden_layers": 4, "num_attention_heads": 2, "head_dim": 64, "hidden_size": 128},
            4 * 2 * 2 * 64 * 2,
        ),
        # MLA: one kv_lora_rank + rope latent per layer
        (
            {"num_hidden_layers": 43, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 64},
            43 * 576 * 2,
        ),
        # hybrid: only full-attention layers keep a KV cache
        (
            {
                "num_hidden_layers": 8,
                "layer_types": ["linear_attention"] * 3
                + ["full_attention"]
                + ["linear_attention"] * 3
                + ["full_attention"],
                "num_attention_heads": 16,
                "num_key_value_heads": 2,
                "head_dim": 256,
            },
            2 * 2 * 2 * 256 * 2,
        ),
        (
            {
                "num_hidden_layers": 48,
                "full_attention_interval": 4,
                "num_attention_heads": 16,
                "num_key_value_heads": 2,
                "head_dim": 256,
            },
            12 * 2 * 2 * 256 * 2,
        ),
        # multimodal: the language model's config is nested
        (
            {
                "architectures": ["X"],
                "text_config": {"num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256},
            },
            2 * 2 * 4 * 64 * 2,
        ),
    ],
)
def test_kv_geometry_is_read_from_config_json(tmp_path: Path, config: dict, expected: int) -> None:
    model = write_config(tmp_path / "m", config)
    recipe = load_recipe("qwen3.8-flash-next")  # no model.kv in the recipe
    m = plan(recipe, model_path=str(model), check_memory=False).memory
    assert m.kv_bytes_per_token == expected
    assert any("kv geometry from the model's config.json" in n for n in m.notes)


def test_recipe_geometry_wins_over_config_json(tmp_path: Path) -> None:
    model = write_config(
        tmp_path / "m", {"num_hidden_layers": 1, "num_attention_heads": 1, "hidden_size": 64}
    )
    m = plan(load_recipe("glm-5.3-flash"), model_path=str(model)).memory
    assert m.kv_bytes_per_token == 43 * 576


@pytest.mark.parametrize("text", ["not json", "[]", '{"num_hidden_layers": "x"}', '{"num_hidden_layers": 2}'])
def test_unreadable_config_json_leaves_capacity_unchecked(tmp_path: Path, text: str) -> None:
    (tmp_path / "config.json").write_text(text)
    m = plan(load_recipe("qwen3.8-flash-next"), model_path=str(tmp_path)).memory
    assert m.kv_bytes_per_token == 0
    assert any("context capacity not checked" in n for n in m.notes)


def test_config_geometry_can_refuse_a_context_that_does_not_fit(tmp_path: Path) -> None:
    # a dense 64-layer MHA at bf16 costs 64 x 2 x 64 x 128 x 2 = 2 MiB per token: 262k tokens need 512 GiB
    model = write_config(
        tmp_path / "m",
        {"num_hidden_layers": 64, "num_attention_heads": 64, "head_dim": 128, "hidden_size": 8192},
    )
    with pytest.raises(UserError, match="fewer than max_model_len 262,144"):
        plan(load_recipe("qwen3.8-flash-next"), model_path=str(model))


def test_sizes_in_the_memory_plan_read_well_for_tiny_models_too() -> None:
    from sparkctl.planner.memory import GiB, gib

    assert gib(1_970_848) == "1.9 MiB"  # the tiny Llama's weights, not "0.00 GiB"
    assert gib(256 * 2**20) == "0.25 GiB"
    assert gib(91 * GiB) == "91.00 GiB"
    assert gib(0) == "0.00 GiB"
