"""Pieces every runtime shares, so the docker and native runtimes record a server the same way."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sparkctl.planner.types import Plan
from sparkctl.runtimes.base import ServerState


def started_state(plan: Plan, runtime: str, log_path: Path, **found_by: Any) -> ServerState:
    """The state `start` returns: the plan's identity and address, stamped now, plus what finds the
    server again in this runtime (`pid`, or `container_id` / `container_name`, and `extra`)."""
    return ServerState(
        recipe=plan.recipe_name,
        runtime=runtime,
        recipe_hash=plan.recipe_hash,
        base_url=plan.base_url,
        port=plan.port,
        served_model_name=plan.served_model_name,
        started_at=time.time(),
        log_path=str(log_path),
        **found_by,
    )
