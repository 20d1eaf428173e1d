"""`up` is a list of stages over one context: what a request runs is a subset of that list, a runtime
without a capability skips (or refuses) what needs it, and a request a runtime cannot honour is refused
before any stage does work."""

from __future__ import annotations

import pytest

from sparkctl.errors import UserError
from sparkctl.recipe.overrides import Overrides
from sparkctl.runtimes.base import LOCAL_MODEL, MULTI_NODE
from sparkctl.runtimes.registry import get_runtime
from sparkctl.up import STAGE_NAMES, STAGES, UpOptions, run_up, stages_for


def test_the_stage_list() -> None:
    assert STAGE_NAMES == (
        "validate", "plan", "dry-run", "reconcile", "doctor", "ready", "fetch", "prepare", "prewarm",
        "launch", "health", "smoke", "persist",
    )  # fmt: skip
    # everything from reconcile on holds the recipe's start lock; nothing before it starts anything
    assert [s.name for s in STAGES if s.locked] == list(STAGE_NAMES[3:])


def test_requests_run_subsets() -> None:
    assert "smoke" not in stages_for(UpOptions("tiny", smoke=False))  # --no-smoke, bench --up
    assert stages_for(UpOptions("tiny", restart=True)) == STAGE_NAMES  # its reconcile stops the old one


def test_a_dry_run_stops_after_the_plan() -> None:
    result = run_up(UpOptions("tiny", dry_run=True))
    assert result.dry_run and result.stages == ["validate", "plan", "dry-run"]
    assert result.to_json()["stages"] == ["validate", "plan", "dry-run"]


def test_the_cluster_runtime_skips_the_local_model_stages() -> None:
    cluster, native = get_runtime("cluster"), get_runtime("native")
    assert MULTI_NODE in cluster.capabilities and LOCAL_MODEL not in cluster.capabilities
    assert LOCAL_MODEL in native.capabilities and MULTI_NODE not in native.capabilities
    skipped = [s.name for s in STAGES if s.needs is not None and s.needs not in cluster.capabilities]
    assert skipped == ["doctor", "fetch", "prepare", "prewarm"]


def test_persist_across_nodes_is_refused_before_any_work() -> None:
    opts = UpOptions("tiny", overrides=Overrides(), persist=True, nodes="localhost,10.0.0.2")
    with pytest.raises(UserError, match="the cluster runtime cannot do --persist"):
        run_up(opts)
