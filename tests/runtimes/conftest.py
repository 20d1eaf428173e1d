"""Fixtures for runtime tests: every test gets its own state/cache directories and a Plan builder."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import pytest

from sparkctl.planner.types import LoadPolicy, ModelSource, Plan


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("SPARKCTL_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def make_plan() -> Callable[..., Plan]:
    """A native Plan running `python -c CODE` (a real process standing in for the engine's command line)."""

    def build(
        code: str = "", *, argv: Sequence[str] | None = None, name: str = "t", port: int = 18099, env=None
    ) -> Plan:
        return Plan(
            recipe_name=name,
            recipe_hash="0" * 64,
            runtime="native",
            engine="vllm",
            argv=tuple(argv) if argv is not None else (sys.executable, "-c", code),
            env=dict(env or {}),
            host="127.0.0.1",
            port=port,
            served_model_name=name,
            model=ModelSource(generate="tiny-llama"),
            load=LoadPolicy(prewarm="never"),
            memory=None,
            health_timeout_s=10.0,
        )

    return build
