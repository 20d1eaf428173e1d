"""Recipe -> Plan: the engine command line, environment, container settings and memory plan.

`plan(recipe, *, model_path=None)` is the entry point (see build.py); `render` turns a Plan into a
shell command, JSON or a docker-compose file.
"""

from __future__ import annotations

from sparkctl.planner.build import plan
from sparkctl.planner.types import ContainerSpec, LoadPolicy, MemoryPlan, ModelSource, Mount, Plan

__all__ = ["ContainerSpec", "LoadPolicy", "MemoryPlan", "ModelSource", "Mount", "Plan", "plan"]
