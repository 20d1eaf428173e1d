"""The arena-v2 grid definition, narrowing, the compare maths and the command's option checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkctl.bench import compare as cmp
from sparkctl.bench.client import BenchInputError
from sparkctl.bench.grids import ARENA_V2, get_grid
from sparkctl.bench.runner import parse_sweep
from sparkctl.cli import main


def test_arena_v2_is_the_published_profile() -> None:
    g = get_grid("arena-v2")
    assert g is ARENA_V2 and g.pp == 2048 and g.tg == 128 and g.runs == 3 and g.prefix_caching
    assert g.depths == (0, 4096, 8192, 16384, 32768, 65535, 100000) and g.concurrency == (1, 2, 5, 10)
    assert len(g.schedule) == 28 and len(set(g.schedule)) == 28
    assert set(g.schedule) == {(d, c) for d in g.depths for c in g.concurrency}
    assert g.schedule[:3] == ((8192, 5), (4096, 5), (8192, 10)) and g.schedule[-1] == (100000, 10)


def test_narrowed_grid_keeps_the_order_and_says_it_was_modified() -> None:
    g = get_grid("arena-v2", depths=(0, 4096), concurrency=(1, 2), pp=64, tg=8, runs=1)
    assert g.name == "arena-v2 (modified)" and g.pp == 64
    assert g.schedule == ((4096, 2), (0, 1), (0, 2), (4096, 1))
    with pytest.raises(Exception, match="unknown grid"):
        get_grid("arena-v9")


def test_parse_sweep() -> None:
    assert parse_sweep("serve.speculative.num_speculative_tokens=0,1,2,3") == (
        "serve.speculative.num_speculative_tokens",
        ("0", "1", "2", "3"),
    )
    with pytest.raises(BenchInputError):
        parse_sweep("serve.max_num_seqs")


def _record(decode: float, ttft: float, label: str = "default") -> dict:
    s = {"median": decode, "p90": decode, "p99": decode, "mean": decode, "std": 0, "min": decode, "max": decode,
         "spread": 0, "n": 1}  # fmt: skip
    t = dict(s, median=ttft)
    return {
        "label": label,
        "workloads": {"suite": {"per_category": {"coding": {"decode_tps": s, "ttft_s": t}}}},
    }


def test_compare_files_and_sweep_variants(tmp_path: Path) -> None:
    a = {"schema": "sparkctl-bench/1", "variants": [_record(100.0, 0.5)]}
    b = {"schema": "sparkctl-bench/1", "variants": [_record(120.0, 0.4)]}
    (tmp_path / "a.json").write_text(json.dumps(a))
    (tmp_path / "b.json").write_text(json.dumps(b))
    res = cmp.compare([tmp_path / "a.json", tmp_path / "b.json"])
    rows = {r["metric"]: r for r in res["rows"]}
    assert (
        rows["decode tok/s"]["others"][0]["pct"] == pytest.approx(20.0)
        and rows["decode tok/s"]["others"][0]["better"]
    )
    assert rows["TTFT ms"]["base"] == pytest.approx(500) and rows["TTFT ms"]["others"][0][
        "pct"
    ] == pytest.approx(-20.0)
    assert rows["TTFT ms"]["others"][0]["better"] is True  # lower latency is better
    sweep = {"schema": "sparkctl-bench/1", "variants": [_record(10.0, 1, "k=0"), _record(25.0, 1, "k=2")]}
    (tmp_path / "s.json").write_text(json.dumps(sweep))
    res = cmp.compare([tmp_path / "s.json"])
    assert res["files"] == ["s.json:k=0", "s.json:k=2"]
    assert next(r for r in res["rows"] if r["metric"] == "decode tok/s")["others"][0]["pct"] == pytest.approx(
        150.0
    )
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(BenchInputError, match="neither"):
        cmp.compare([tmp_path / "x.json"])


@pytest.mark.parametrize(
    "args, message",
    [
        (["bench", "tiny", "--url", "http://x"], "not both"),
        (["bench", "--url", "http://x", "-w", "nope"], "unknown workload"),
        (["bench", "--url", "http://x", "--slo", "ttft=3"], "--slo"),
        (["bench", "--url", "http://x", "--up"], "need a RECIPE"),
        (["bench", "compare", "/nonexistent.json"], "no such file"),
    ],
)
def test_bad_options_are_one_line_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
