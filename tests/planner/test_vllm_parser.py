"""Every vLLM command line the planner renders is accepted by vLLM's own argument parser.

The installed vLLM is the CPU build 0.32 (the Spark image runs 0.33; DEVELOPERS.md: same serving flags
apart from the removed partial-prefill flags, which the planner refuses). Parsing only: no model is
loaded. Parsed values are compared with the recipe, so a misspelt flag that swallowed the next
argument would show up too.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from sparkctl.planner import plan
from sparkctl.recipe import builtin_names, load_recipe

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None, reason="vLLM is not installed (make install-vllm)"
    ),
]

VLLM_RECIPES = [n for n in builtin_names() if load_recipe(n).engine.name == "vllm"]


@pytest.fixture(scope="module")
def parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def engine_args(name: str) -> tuple[object, list[str]]:
    recipe = load_recipe(name)
    argv = list(plan(recipe, check_memory=False).argv)
    if argv[:2] == ["vllm", "serve"]:
        return recipe, ["--model", argv[2], *argv[3:]]  # `vllm serve MODEL` == api_server --model MODEL
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    return recipe, argv[3:]


@pytest.mark.parametrize("name", VLLM_RECIPES)
def test_vllm_parses_the_rendered_command(parser, name: str) -> None:
    recipe, args = engine_args(name)
    ns = parser.parse_args(args)
    s = recipe.serve
    assert ns.max_model_len == s.max_model_len
    assert ns.port == s.port and ns.host == s.host
    assert ns.served_model_name == [s.served_model_name or recipe.name]
    if s.gpu_memory_utilization is not None:
        assert ns.gpu_memory_utilization == s.gpu_memory_utilization
    assert ns.kv_cache_memory_bytes == s.kv_cache_memory_bytes
    assert ns.kv_cache_dtype == s.kv_cache_dtype
    if s.long_prefill_token_threshold is not None:
        assert ns.long_prefill_token_threshold == s.long_prefill_token_threshold
    if s.max_num_seqs is not None:
        assert ns.max_num_seqs == s.max_num_seqs
    if s.speculative is not None:
        spec = ns.speculative_config
        spec = json.loads(spec) if isinstance(spec, str) else spec
        assert spec["method"] == s.speculative.method
        assert spec["num_speculative_tokens"] == s.speculative.num_speculative_tokens
        assert s.speculative.num_speculative_tokens + 1 in ns.cudagraph_capture_sizes
    assert ns.enforce_eager == s.enforce_eager
    assert ns.tensor_parallel_size == recipe.cluster.tensor_parallel
    if recipe.cluster.executor:
        assert ns.distributed_executor_backend == recipe.cluster.executor
