"""Every FreeToken command line the planner renders parses with FreeToken's own argument parser.

FreeToken 0.2 (`make freetoken`) lives in its own venv (torch 2.14); its parser builds without a GPU, so
this runs here although FreeToken itself cannot serve without CUDA (doctor says so). Parsed values are
compared with the recipe, so a misspelt flag that swallowed the next argument would show up too.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sparkctl.planner import plan
from sparkctl.recipe import builtin_names, load_recipe

# starts processes (tests/conftest.py, process_guard): not in make test-fast
pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
FT_RECIPES = [n for n in builtin_names() if load_recipe(n).engine.name == "freetoken"]
EVERYTHING = (
    "serve.freetoken.moe_strategy=offload",
    "serve.freetoken.moe_cache_mem=6GiB",
    "serve.freetoken.moe_cpu_threads=8",
    "serve.freetoken.memory_ratio=0.85",
    "serve.freetoken.cuda_graph_max_bs=4",
    "serve.freetoken.cache_type=radix",
    "serve.max_num_seqs=4",
    "serve.tool_call_parser=qwen3_coder",
    "serve.reasoning_parser=qwen3",
)
VARIANTS = [(n, ()) for n in FT_RECIPES] + [(n, EVERYTHING) for n in FT_RECIPES]


BAD = ["--model-path", "x", "--max-num-seqs", "4"]  # vLLM's spelling: FreeToken must refuse it


def rendered(name: str, sets: tuple[str, ...]) -> list[str]:
    return list(plan(load_recipe(name, sets), check_memory=False).argv)


@pytest.fixture(scope="module")
def parsed(freetoken_python: Path) -> tuple[list[dict], str]:
    """Every variant's arguments (and BAD) through FreeToken's parser, in one FreeToken process."""
    argvs = [rendered(n, s)[2:] for n, s in VARIANTS] + [BAD]
    out = subprocess.run(
        [str(freetoken_python), str(HERE / "freetoken_parse.py")],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(results) == len(argvs)
    return results, out.stderr


def test_there_is_a_freetoken_recipe() -> None:
    assert FT_RECIPES


@pytest.mark.parametrize("i", range(len(VARIANTS)), ids=[f"{n}{'+all' if s else ''}" for n, s in VARIANTS])
def test_freetoken_parses_the_rendered_command(parsed: tuple[list[dict], str], i: int) -> None:
    name, sets = VARIANTS[i]
    recipe = load_recipe(name, sets)
    argv = rendered(name, sets)
    assert Path(argv[0]).name == "ft" and argv[1] == "serve"
    ns = parsed[0][i]
    assert "exit" not in ns, parsed[1][-3000:]
    s, ft = recipe.serve, recipe.engine.serve
    assert ns["model_path"] == recipe.model.repo
    assert ns["served_model_name"] == (s.served_model_name or recipe.name)
    assert ns["server_host"] == s.host and ns["server_port"] == s.port
    assert ns["max_seq_len_override"] == s.max_model_len
    assert ns["max_running_req"] == s.max_num_seqs
    assert ns["moe_strategy"] == ft.moe_strategy
    assert ns["dtype"] == s.dtype
    if ft.moe_cache_mem:
        assert ns["moe_cache_mem"] == 6 * 2**30
    if ft.memory_ratio is not None:
        assert ns["memory_ratio"] == ft.memory_ratio
    if ft.moe_cpu_threads is not None:
        assert ns["moe_cpu_threads"] == ft.moe_cpu_threads
    if ft.cuda_graph_max_bs is not None:
        assert ns["cuda_graph_max_bs"] == ft.cuda_graph_max_bs
    if ft.cache_type:
        assert ns["cache_type"] == ft.cache_type
    if s.tool_call_parser:
        assert ns["tool_call_parser"] == s.tool_call_parser
    if s.reasoning_parser:
        assert ns["reasoning_parser"] == s.reasoning_parser


def test_a_wrong_flag_is_caught_by_the_same_parser(parsed: tuple[list[dict], str]) -> None:
    """The check above can fail: FreeToken's parser rejects what it does not know."""
    assert parsed[0][-1] == {"exit": 2}
    assert "unrecognized arguments: --max-num-seqs" in parsed[1]
