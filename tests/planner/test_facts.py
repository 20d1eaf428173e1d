"""The planner is pure: a Recipe and the Facts gathered about this machine make the Plan, nothing else.
Every mount `up` starts a container with is in that plan, so `render` and `--dry-run` show it."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from sparkctl.planner import plan
from sparkctl.planner.build import make_plan
from sparkctl.planner.facts import Facts, gather_facts
from sparkctl.planner.render import render
from sparkctl.recipe import load_recipe


def test_a_plan_from_facts_alone_reads_nothing() -> None:
    """A GGUF directory that does not exist here: the facts say which files it holds, the plan follows."""
    recipe = load_recipe("tiny-gguf", ["model.gguf_file=null"])
    facts = Facts(
        model_dir="/nowhere/tiny-gguf",
        model_present=True,
        gguf_files=("m-00002-of-00002.gguf", "m-00001-of-00002.gguf"),
        host_memory_bytes=64 << 30,
        entrypoint=("/opt/llama/llama-server",),
        api_key_file="/keys/tiny-gguf.env",
    )
    p = make_plan(recipe, facts, check_memory=False)
    assert p.argv[0] == "/opt/llama/llama-server"
    assert p.argv[p.argv.index("--model") + 1] == "/nowhere/tiny-gguf/m-00001-of-00002.gguf"
    assert p.api_key_file == "/keys/tiny-gguf.env"
    assert p.memory is not None and p.memory.total_bytes == 64 << 30
    assert make_plan(recipe, facts, check_memory=False) == p  # same inputs, same plan


def _snapshot(root: Path) -> Path:
    """A hub-cache-like model: a snapshot dir whose files are relative links into ../../blobs."""
    blobs, snap = root / "blobs", root / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    (blobs / "sha1").write_text("{}")
    os.symlink("../../blobs/sha1", snap / "config.json")
    return snap


def test_link_target_mounts_are_in_the_plan_and_the_render(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path / "models--o--m")
    sets = ["runtime=docker", "container.image=img:1", "model.generate=null", f"model.path={snap}"]
    recipe = load_recipe("tiny", sets)
    facts = gather_facts(recipe, str(snap))
    blobs = str(tmp_path / "models--o--m" / "blobs")
    assert [(m.source, m.read_only) for m in facts.link_mounts] == [(blobs, True)]
    p = plan(recipe, model_path=str(snap), check_memory=False)
    assert p.container is not None and any(m.source == blobs for m in p.container.mounts)
    assert f"-v {blobs}:" in render(p, "shell")
    # what the docker runtime would still add at start: nothing, the plan has it all
    from sparkctl.planner.container import container_run
    from sparkctl.runtimes.docker import prepare_mounts

    assert prepare_mounts(container_run(dataclasses.replace(p))) == []
