"""recipes/README.md is generated from the schema; it must match what the generator prints now."""

from __future__ import annotations

from pathlib import Path

from sparkctl.recipe.reference import reference_markdown

DOC = Path(__file__).resolve().parents[2] / "recipes" / "README.md"


def test_recipe_reference_is_current() -> None:
    assert DOC.read_text() == reference_markdown(), (
        "recipes/README.md is stale: run `.venv/bin/python -m sparkctl.recipe.reference > recipes/README.md`"
    )


def test_reference_documents_every_block_and_field() -> None:
    text = reference_markdown()
    for block in ("model", "serve", "serve.speculative", "memory", "cluster", "container", "load", "bench"):
        assert f"## `{block}`" in text
    for field in (
        "gpu_memory_utilization",
        "kv_cache_memory_bytes",
        "long_prefill_token_threshold",
        "ib_gid_index",
    ):
        assert f"| `{field}` |" in text
    assert "(see description)" not in text
