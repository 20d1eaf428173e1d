"""The bench core assembles a run from what `bench run` was asked: the command line over the recipe's
`bench:` block over the defaults, each bad value refused in one line (the command only parses)."""

from __future__ import annotations

import pytest

from sparkctl.bench.config import BenchRequest, bench_options, ints, slo
from sparkctl.errors import UserError


def test_the_command_line_wins_over_the_recipe_and_the_recipe_over_the_defaults() -> None:
    cfg = bench_options(BenchRequest(recipe="tiny")).config
    assert (cfg.max_tokens, cfg.runs, cfg.warmup) == (32, 2, 1)  # tiny's bench: block, default warm-up
    cfg = bench_options(BenchRequest(recipe="tiny", max_tokens=7, levels="1,3", slo=("ttft_ms=250",))).config
    assert (cfg.max_tokens, cfg.runs, cfg.concurrency, cfg.slo) == (7, 2, (1, 3), {"ttft_ms": 250.0})
    cfg = bench_options(BenchRequest(url="http://127.0.0.1:1", grid="arena-v2", workloads="suite")).config
    assert cfg.workloads == ("suite", "grid") and cfg.grid is not None


@pytest.mark.parametrize(
    ("req", "message"),
    [
        (BenchRequest(recipe="tiny", url="http://x"), "not both"),
        (BenchRequest(url="http://x", bring_up=True), "need a RECIPE"),
        (BenchRequest(url="http://x", workloads="suite,nope"), "unknown workload(s): nope"),
        (BenchRequest(url="http://x", categories="nope"), "unknown category"),
        (BenchRequest(url="http://x", levels="0,1"), "at least 1"),
    ],
)
def test_bad_requests_are_one_line(req: BenchRequest, message: str) -> None:
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bench_options(req)


def test_value_parsers() -> None:
    assert ints("1, 2,4", "--x") == (1, 2, 4) and ints(None, "--x") is None
    with pytest.raises(UserError, match="comma-separated integers"):
        ints("a", "--x")
    with pytest.raises(UserError, match="is not KEY=MS"):
        slo(("latency=3",))
