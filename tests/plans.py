"""The one Plan builder of the test suite: runtime, doctor and docker tests make Plans by hand (they test
what consumes a Plan, not the planner), all through `build_plan`, so a new Plan field is added here once."""

from __future__ import annotations

import sys
from typing import Any

from sparkctl.planner.types import LoadPolicy, ModelSource, Plan


def build_plan(**fields: Any) -> Plan:
    """A native Plan running `python -c ""` on 127.0.0.1:18099; any Plan field can be given instead."""
    name = fields.get("recipe_name", "t")
    defaults: dict[str, Any] = {
        "recipe_name": name,
        "recipe_hash": "0" * 64,
        "runtime": "native",
        "engine": "vllm",
        "argv": (sys.executable, "-c", ""),
        "env": {},
        "host": "127.0.0.1",
        "port": 18099,
        "served_model_name": name,
        "model": ModelSource(generate="tiny-llama"),
        "load": LoadPolicy(prewarm="never"),
        "memory": None,
        "health_timeout_s": 10.0,
    }
    defaults.update(fields)
    defaults["argv"] = tuple(defaults["argv"])
    return Plan(**defaults)
