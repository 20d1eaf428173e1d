"""Every llama-server flag a built-in recipe renders is accepted by the pinned llama-server.

Two checks against the real binary (`make llama-server`, build LLAMA_CPP_BUILD), the way
tests/planner/test_vllm_parser.py holds vLLM's commands against vLLM's own parser:
- each flag name, and each value of a flag with a fixed set, appears in its `--help`;
- llama-server's own argument parser takes the whole command line: run with the model swapped for a
  file that does not exist (and hub downloads swapped for it too: no network), it must get past
  argument parsing to the model load and fail there, not on an argument.
Recipes are rendered as they are and with every llama.cpp field this schema adds switched on.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sparkctl.planner import engine_bins, plan
from sparkctl.recipe import builtin_names, load_recipe

LLAMA_RECIPES = [n for n in builtin_names() if load_recipe(n).engine.name == "llama.cpp"]
EVERYTHING = (
    "serve.llama_cpp.kv_unified=true",
    "serve.llama_cpp.n_cpu_moe=4",
    r"serve.llama_cpp.override_tensor=['blk\.(1|2)\.ffn_.*_exps=CPU']",
    "serve.llama_cpp.load_mode=mmap+mlock",
    "serve.llama_cpp.metrics=true",
    "serve.llama_cpp.speculative={type: draft-mtp, draft_max: 3, draft_min: 1}",
    "serve.llama_cpp.batch_size=512",
    "serve.llama_cpp.ubatch_size=256",
    "serve.kv_cache_dtype=q8_0",
)
VARIANTS = [(n, ()) for n in LLAMA_RECIPES] + [(n, EVERYTHING) for n in LLAMA_RECIPES]
# flags with a closed set of values -> the help line that lists them
ENUMS = ("--flash-attn", "--load-mode", "--spec-type", "--cache-type-k", "--cache-type-v")


@pytest.fixture(scope="module")
def help_text(llama_server: Path) -> str:
    out = subprocess.run([str(llama_server), "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


def names_of(line: str) -> str:
    """The option-name column of a help line: "-c,    --ctx-size N    size of ..." -> "-c, --ctx-size N"
    (aliases are padded into columns, so they are closed up before splitting at the description's gap)."""
    return re.split(r"\s{3,}", re.sub(r",\s+", ", ", line.strip()), maxsplit=1)[0]


@pytest.fixture(scope="module")
def help_flags(help_text: str) -> set[str]:
    """Option names from the name column of each help line (before the description's wide gap)."""
    flags: set[str] = set()
    for line in help_text.splitlines():
        names = names_of(line)
        if names.startswith("-"):
            flags.update(re.findall(r"(?<![\w-])(--?[A-Za-z][\w.-]*)", names))
    assert {"--ctx-size", "--parallel", "--n-cpu-moe", "--override-tensor", "--metrics"} <= flags
    return flags


@pytest.mark.slow
def test_it_is_the_pinned_build(llama_server: Path) -> None:
    info = engine_bins.probe_llama_server(str(llama_server))
    assert info.build == engine_bins.LLAMA_CPP_BUILD, info


def rendered(name: str, sets: tuple[str, ...]) -> list[str]:
    return list(plan(load_recipe(name, sets), check_memory=False).argv)[1:]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "sets"), VARIANTS, ids=[f"{n}{'+all' if s else ''}" for n, s in VARIANTS])
def test_every_flag_is_in_its_help(
    help_text: str, help_flags: set[str], name: str, sets: tuple[str, ...]
) -> None:
    args = rendered(name, sets)
    flags = [a for a in args if a.startswith("--")]
    assert flags and [f for f in flags if f not in help_flags] == []
    for flag in ENUMS:
        if flag in args:
            val = args[args.index(flag) + 1]
            line = next(x for x in help_text.splitlines() if re.search(rf"{flag}(?![\w-])", names_of(x)))
            listed = line + " " + help_text.split(line, 1)[1][:600]
            assert re.search(rf"(?<![\w-]){re.escape(val)}(?![\w-])", listed), (flag, val)


def _offline(args: list[str], model: str) -> list[str]:
    """Swap the model (local or hub) for `model`, so nothing is downloaded and nothing real loads."""
    out: list[str] = []
    skip = False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("--model", "--hf-repo", "--hf-file", "--spec-draft-model"):
            skip = True
            if a in ("--model", "--hf-repo"):
                out += ["--model", model]
            continue
        out.append(a)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("name", "sets"), VARIANTS, ids=[f"{n}{'+all' if s else ''}" for n, s in VARIANTS])
def test_llama_servers_parser_takes_the_command(
    llama_server: Path, tmp_path: Path, name: str, sets: tuple[str, ...]
) -> None:
    from sparkctl.server.ports import free_port

    missing = tmp_path / "absent.gguf"
    args = _offline(rendered(name, sets), str(missing))
    args[args.index("--port") + 1] = str(free_port())
    out = subprocess.run([str(llama_server), *args], capture_output=True, text=True, timeout=60)
    log = out.stdout + out.stderr
    assert "invalid argument" not in log and "error while handling" not in log, log[-2000:]
    assert out.returncode != 0  # the model does not exist ...
    assert f"failed to open GGUF file '{missing}'" in log, log[
        -2000:
    ]  # ... that, not an argument, stopped it
