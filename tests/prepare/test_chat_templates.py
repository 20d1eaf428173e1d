"""sparkctl's GLM-5.3-Flash template, rendered by transformers' chat-template renderer (what vLLM uses):
thinking on by default and switchable off, GLM's tool-call format, and served to vLLM via the overlay."""

from __future__ import annotations

import pytest

from sparkctl.planner import plan
from sparkctl.prepare.chat_templates import shipped_templates, template_text
from sparkctl.recipe import load_recipe

TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]


def _render(messages: list[dict], **kwargs: object) -> str:
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        [messages],
        chat_template=template_text("glm-5.3-flash-thinking"),
        add_generation_prompt=True,
        **kwargs,
    )
    return rendered[0]


def test_thinking_is_on_by_default_and_can_be_switched_off() -> None:
    hello = [{"role": "user", "content": "Hi"}]
    assert _render(hello) == "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think>"
    assert _render(hello, enable_thinking=True).endswith("<|assistant|>\n<think>")
    assert _render(hello, enable_thinking=False) == "[gMASK]<sop><|user|>\nHi<|assistant|>\n<think></think>\n"


def test_history_and_tools_in_glm_format() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {
            "role": "assistant",
            "content": "<think>Call the tool.</think>Checking.",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {"name": "weather", "arguments": {"city": "Paris", "days": 2}},
                }
            ],
        },
        {"role": "tool", "content": "sunny"},
        {"role": "tool", "content": "22C"},
    ]
    text = _render(messages, tools=TOOLS)
    assert text.startswith("[gMASK]<sop><|system|>\n# Tools\n")
    assert '{"name": "weather", "parameters": {"type": "object"}}' in text
    assert "<|system|>\nBe brief.<|user|>\nWeather in Paris?" in text
    # earlier reasoning is dropped; the call is in GLM's arg_key/arg_value form (what the glm47 parser reads)
    assert (
        "<|assistant|>\n<think></think>\nChecking."
        "<tool_call>weather<arg_key>city</arg_key><arg_value>Paris</arg_value>"
        "<arg_key>days</arg_key><arg_value>2</arg_value></tool_call>"
    ) in text
    assert "Call the tool." not in text
    assert text.endswith(
        "<|observation|>\n<tool_response>sunny</tool_response>\n<tool_response>22C</tool_response>"
        "<|assistant|>\n<think>"
    )


@pytest.mark.slow
def test_vllm_glm_parser_honours_the_switch() -> None:
    # vLLM ignores enable_thinking for templates it takes for GLM-5.3's stock one (no switch); ours has one
    glm = pytest.importorskip("vllm.parser.glm47_moe")

    class Tok:
        chat_template = template_text("glm-5.3-flash-thinking")

    assert glm._glm53_always_thinks(Tok()) is False


@pytest.mark.parametrize("name", ["glm-5.3-flash", "glm-5.3-flash-k2k3", "glm-5.3-flash-4bpw-2x"])
def test_glm_recipes_serve_the_template_from_the_overlay(name: str) -> None:
    p = plan(load_recipe(name), check_memory=False)
    assert p.model.prepare is not None and p.model.prepare.chat_template in shipped_templates()
    i = p.argv.index("--chat-template")
    assert p.argv[i + 1] == f"/models/{name}/chat_template.jinja"
    mounts = {m.target: m for m in p.container.mounts}
    assert mounts[f"/models/{name}"].source == p.model.prepare.overlay and mounts[f"/models/{name}"].read_only
