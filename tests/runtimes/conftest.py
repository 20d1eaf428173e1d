"""Fixtures for runtime tests: a Plan builder (state and cache directories are per test: tests/conftest.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import pytest
from plans import build_plan

from sparkctl.planner.types import Plan


@pytest.fixture
def make_plan() -> Callable[..., Plan]:
    """A native Plan running `python -c CODE` (a real process standing in for the engine's command line)."""

    def build(
        code: str = "", *, argv: Sequence[str] | None = None, name: str = "t", port: int = 18099, env=None
    ) -> Plan:
        return build_plan(
            recipe_name=name,
            argv=argv if argv is not None else (sys.executable, "-c", code),
            env=dict(env or {}),
            port=port,
        )

    return build
