"""sparkctl.plans called directly: the records `validate`, `show` and `prewarm RECIPE` render."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkctl import plans
from sparkctl.errors import UserError
from sparkctl.recipe.overrides import Overrides


def test_validation_records_one_per_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("schema: 1\nmodel: {generate: tiny-llama}\n")
    (tmp_path / "notes.txt").write_text("not a recipe")
    records = plans.validation_records(["tiny", str(tmp_path)])
    assert [(r["source"], r["ok"]) for r in records] == [("tiny", True), (str(tmp_path / "bad.yaml"), False)]
    assert records[0]["name"] == "tiny" and records[0]["memory"]["fits"] is True
    assert "serve" in records[1]["error"] and records[1]["memory"] is None
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no .yaml files"):
        plans.validation_records([str(tmp_path / "empty")])


def test_typed_overrides_reach_the_plan() -> None:
    _, plan = plans.load_and_plan("tiny", Overrides(sets=("serve.max_model_len=256",), port=8123))
    assert plan.port == 8123 and "8123" in plan.argv and "256" in plan.argv
    with pytest.raises(UserError, match="--runtime docker: runtime docker needs container.image"):
        plans.load_and_plan("tiny", Overrides(runtime="docker"))


def test_prewarm_stages_never_download() -> None:
    from sparkctl.up import locate_model

    with pytest.raises(UserError, match="not on this machine yet"):
        locate_model("tiny")  # a fresh cache: the generated model is not made by asking
