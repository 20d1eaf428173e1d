"""A model and setting the engine is known to compute wrongly is refused at plan time, in one line.

vLLM 0.26 through 0.34 compute GLM-4-MoE with shared experts wrongly in float16 (engine check, kernels/PERF.md:
top-1 0.61 against exllamav3; bf16 and fp32 exact). The facts carry the model's own config.json, so the planner
sees the architecture without reading anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sparkctl.cli import main
from sparkctl.errors import UserError
from sparkctl.planner.build import make_plan
from sparkctl.planner.facts import Facts
from sparkctl.recipe import load_recipe

GLM = Path(__file__).resolve().parents[1] / "fixtures" / "exl3_real" / "glm4moe-3.0-mul1" / "model"


def _facts(config: dict) -> Facts:
    return Facts(model_dir="/m", model_present=True, model_config=config, host_memory_bytes=64 << 30)


def test_glm4moe_in_float16_is_refused() -> None:
    config = json.loads((GLM / "config.json").read_text())
    recipe = load_recipe("tiny", ["serve.dtype=float16"])
    with pytest.raises(UserError, match="GLM-4-MoE with shared experts wrongly in float16") as e:
        make_plan(recipe, _facts(config), check_memory=False)
    assert "serve.dtype=bfloat16" in (e.value.hint or "")


def test_glm4moe_at_auto_follows_the_checkpoint_dtype() -> None:
    config = json.loads((GLM / "config.json").read_text())
    recipe = load_recipe("tiny", ["serve.dtype=auto"])
    make_plan(recipe, _facts(config), check_memory=False)  # bf16 checkpoint: fine
    with pytest.raises(UserError, match="float16"):
        make_plan(recipe, _facts({**config, "torch_dtype": "float16"}), check_memory=False)


@pytest.mark.parametrize(
    "change",
    [{"routed_scaling_factor": 1.0}, {"n_shared_experts": 0}, {"architectures": ["Qwen3MoeForCausalLM"]}],
)
def test_what_vllm_computes_rightly_in_float16_plans(change: dict) -> None:
    config = {**json.loads((GLM / "config.json").read_text()), **change}
    p = make_plan(load_recipe("tiny", ["serve.dtype=float16"]), _facts(config), check_memory=False)
    assert p.argv[p.argv.index("--dtype") + 1] == "float16"


def test_the_cli_says_it_in_one_line() -> None:
    """Through the console script's entry point (its error boundary): exit 2, one error line, no traceback."""
    with CliRunner().isolation() as (out, err, _), pytest.raises(SystemExit) as e:
        main(["show", "tiny", "--model-path", str(GLM), "--set", "serve.dtype=float16"])
    text = err.getvalue().decode() if err is not None else out.getvalue().decode()
    assert e.value.code == 2, text
    lines = [ln for ln in text.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "GLM-4-MoE" in lines[0] and "Traceback" not in text
