"""Each engine's own options are its part of the schema (`engine.serve`, a discriminated union on
`engine.name`); the form recipes were written in (`serve.llama_cpp`, `serve.freetoken`) is still read."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl.errors import UserError
from sparkctl.recipe import load_recipe
from sparkctl.recipe.schema import FreeTokenEngine, LlamaCppEngine, VllmEngine


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(
        "schema: 1\nname: r\nruntime: native\nmodel: {generate: tiny-gguf, format: gguf}\n" + body
    )
    return path


def test_old_and_new_forms_read_the_same(tmp_path: Path) -> None:
    old = load_recipe(
        str(
            _write(
                tmp_path, "engine: {name: llama.cpp}\nserve: {max_model_len: 256, llama_cpp: {threads: 3}}\n"
            )
        )
    )
    new = load_recipe(
        str(_write(tmp_path, "engine: {name: llama.cpp, serve: {threads: 3}}\nserve: {max_model_len: 256}\n"))
    )
    assert isinstance(old.engine, LlamaCppEngine) and old.engine.serve.threads == 3
    assert old.model_dump() == new.model_dump()


def test_each_engine_has_only_its_own_section(tmp_path: Path) -> None:
    assert isinstance(load_recipe("tiny").engine, VllmEngine)
    assert isinstance(load_recipe("ornith-1.5-35b-a3b-freetoken").engine, FreeTokenEngine)
    # inherited from its llama.cpp parent, `serve.llama_cpp` means nothing to FreeToken and is dropped
    assert not hasattr(load_recipe("ornith-1.5-35b-a3b-freetoken").engine.serve, "n_gpu_layers")
    bad = _write(
        tmp_path, "engine: {name: llama.cpp, serve: {moe_strategy: auto}}\nserve: {max_model_len: 256}\n"
    )
    with pytest.raises(UserError, match=r"r.yaml:5:\d+: unknown key 'moe_strategy' in engine.serve"):
        load_recipe(str(bad))


def test_an_error_in_the_old_form_points_at_it(tmp_path: Path) -> None:
    bad = _write(
        tmp_path, "engine: {name: llama.cpp}\nserve:\n  max_model_len: 256\n  llama_cpp: {load_mode: mmapp}\n"
    )
    with pytest.raises(UserError, match=r"r.yaml:8:\d+: serve.llama_cpp.load_mode"):
        load_recipe(str(bad))
