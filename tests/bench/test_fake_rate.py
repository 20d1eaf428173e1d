"""The benchmark of the bench (a fake server of known rate) and the bad-input paths it can fake.

The fixed-rate server is the one place a fake stands in for a server: it is how we know the true
rate. Servers that do not stream or that want a key are the other cases vLLM cannot be made into.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))

from bench_client import run  # noqa: E402
from fixed_rate_server import FixedRateServer  # noqa: E402

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow


def test_decode_rate_within_2_percent_of_a_known_rate() -> None:
    res = run(interval_s=0.005, tokens=120, requests=4)
    # the truth is what the server really sent (its own perf_counter stamps), nominally 200 tok/s
    assert res["median_true_tps"] == pytest.approx(200, rel=0.05)
    assert abs(res["median_error_pct"]) < 2.0, res["rows"]
    assert res["parse_us_per_chunk"] > 0 and res["chunk_delay_ms_median"] >= 0


def _bench(url: str, *args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", "bench", "--url", url, "-w", "suite", "--categories", "coding",
         "--runs", "1", "--warmup", "0", "--max-tokens", "4", "--out", str(tmp / "out"), *args],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip


def test_server_that_does_not_stream_is_one_line_exit_2(tmp_path: Path) -> None:
    with FixedRateServer(mode="plain") as srv:
        res = _bench(srv.url, tmp=tmp_path)
    assert res.returncode == 2, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "did not stream" in errors[0] and "Traceback" not in res.stderr
    assert not (tmp_path / "out").exists()  # nothing measured, nothing half-written


def test_api_key_required_then_given(tmp_path: Path) -> None:
    with FixedRateServer(mode="key", interval_s=0.001) as srv:
        res = _bench(srv.url, tmp=tmp_path)
        assert res.returncode == 2 and "requires an API key" in res.stderr and "--api-key" in res.stderr
        ok = _bench(srv.url, "--api-key", srv.key, "--json", "--no-html", tmp=tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert '"count_source": "usage"' in ok.stdout
