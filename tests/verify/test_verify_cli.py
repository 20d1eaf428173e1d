"""`sparkctl verify` from the outside: the table, --json, the kept record, exit 1 naming the failing module, exit 2
for bad input, and the doctor line. No engine here (test_verify_engine.py starts a real server)."""

from __future__ import annotations

import json
from pathlib import Path

import exl3_real
import pytest
from sparkctl_proc import run_sparkctl
from verify_packs import fixture_copy, set_storage

pytestmark = pytest.mark.slow  # starts local processes (tests/conftest.py)

FIXTURE = "qwen3moe-4.0-mcg"


@pytest.fixture
def fixture_dir() -> Path:
    reason = exl3_real.missing_reason(FIXTURE)
    if reason:
        pytest.skip(reason)
    return exl3_real.path(FIXTURE) / "model"


def test_table_and_kept_record(tmp_path: Path, fixture_dir: Path) -> None:
    r = run_sparkctl(tmp_path, "verify", str(fixture_dir))
    assert r.returncode == 0, r.stderr
    for row in (
        "files vs index",
        "EXL3 modules: shape, K, codebook",
        "routed experts K=4",
        "MoE forward (routed)",
    ):
        assert row in r.stdout
    assert "PASS" in r.stdout and "FAIL" not in r.stdout
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("read ") and " s; PASS; kept in " in last  # bytes read and how long it took
    kept = Path(last.rsplit("kept in ", 1)[1])
    assert kept == tmp_path / "state" / "verify" / f"{FIXTURE}.json"
    assert json.loads(kept.read_text())["ok"] is True
    # a second run compares every tensor it reads with the first's digests
    j = run_sparkctl(tmp_path, "verify", str(fixture_dir), "--json")
    assert j.returncode == 0, j.stderr
    rec = json.loads(j.stdout)
    assert rec["ok"] is True and rec["mode"] == "quick" and "digests" not in rec
    drift = next(c for c in rec["checks"] if c["what"] == "unchanged since last verify")
    assert drift["verdict"] == "pass" and drift["checked"] > 0
    assert rec["bytes_read"] < rec["pack_bytes"] and rec["seconds"] > 0


def test_failure_exits_1_naming_the_module(tmp_path: Path) -> None:
    model = fixture_copy(FIXTURE, tmp_path / "packs")
    module = "model.layers.0.self_attn.v_proj"
    set_storage(model, module, bits_per_weight=2)
    r = run_sparkctl(tmp_path, "verify", str(model))
    assert r.returncode == 1
    assert "FAIL" in r.stdout
    (line, *_rest) = r.stderr.strip().splitlines()
    assert line.startswith(
        f"error: verify {FIXTURE}: EXL3 modules: shape, K, codebook: {module}: trellis holds K=4"
    )
    j = run_sparkctl(tmp_path, "verify", str(model), "--json")
    assert j.returncode == 1
    rec = json.loads(j.stdout)
    assert rec["ok"] is False
    (bad,) = [f for c in rec["checks"] for f in c["failures"]]
    assert bad["module"] == module


@pytest.mark.parametrize(
    ("arg", "says"),
    [
        ("no-such-recipe", "no-such-recipe"),
        ("tests", "not a model directory"),
        ("tiny-gguf", "not EXL3"),
    ],
)
def test_bad_input_exits_2_in_one_line(tmp_path: Path, arg: str, says: str) -> None:
    r = run_sparkctl(tmp_path, "verify", arg)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("error: ") and says in r.stderr.splitlines()[0]
    assert "Traceback" not in r.stderr


def test_doctor_says_when_a_pack_was_never_verified(tmp_path: Path) -> None:
    never = run_sparkctl(tmp_path, "doctor", "tiny-exl3-moe", "--json")
    (line,) = [c for c in json.loads(never.stdout)["checks"] if c["name"] == "verified"]
    assert line["status"] == "warn" and "never verified" in line["detail"]
    assert line["hint"].startswith("sparkctl verify tiny-exl3-moe")
    v = run_sparkctl(tmp_path, "verify", "tiny-exl3-moe", timeout=300)  # makes the tiny pack, no network
    assert v.returncode == 0, v.stderr
    after = run_sparkctl(tmp_path, "doctor", "tiny-exl3-moe", "--json")
    (line,) = [c for c in json.loads(after.stdout)["checks"] if c["name"] == "verified"]
    assert line["status"] == "pass" and "passed the quick verify" in line["detail"]
    # a recipe that is no EXL3 pack has no such line
    other = run_sparkctl(tmp_path, "doctor", "tiny", "--json")
    assert "verified" not in [c["name"] for c in json.loads(other.stdout)["checks"]]


def test_bench_says_which_verification_its_numbers_were_taken_under(
    tmp_path: Path, fixture_dir: Path
) -> None:
    from sparkctl.bench.report import render_html, verification_line
    from sparkctl.bench.runner import _verification
    from sparkctl.verify import records
    from sparkctl.verify.run import verify

    assert _verification("my-pack") is None
    assert verification_line(None, "my-pack") == "pack never verified (sparkctl verify my-pack)"
    records.save(verify(fixture_dir, name="my-pack", device="cpu"))
    v = _verification("my-pack")
    assert v is not None and v["ok"] and v["layers"] == ["kernels", "pack"]
    line = verification_line(v, "my-pack")
    assert line.startswith("pack passed quick verify (kernels+pack) of 20")
    record = {"target": {"recipe": "my-pack"}, "verification": v, "variants": [], "host": {}, "server": {}}
    assert line in render_html(record)


def test_device_script_runs_on_the_cpu_path(tmp_path: Path) -> None:
    """bench/verify_gpu.py (the lead runs it on an H100) goes through the same loop here with --device cpu."""
    import subprocess
    import sys

    from sparkctl_proc import REPO, sparkctl_env

    out = tmp_path / "verify_gpu.json"
    r = subprocess.run(
        [
            sys.executable,
            "bench/verify_gpu.py",
            "--device",
            "cpu",
            "--quick-only",
            "--only",
            "llama-2.5-mul1",
            "tiny-exl3",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=sparkctl_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] is True and [x["pack"] for x in report["results"]] == ["llama-2.5-mul1", "tiny-exl3"]
    assert all(x["ok"] for x in report["results"])
    no_gpu = subprocess.run(
        [sys.executable, "bench/verify_gpu.py", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    import torch

    if not torch.cuda.is_available():
        assert no_gpu.returncode == 2 and "no CUDA device" in no_gpu.stderr


def test_device_script_checks_a_named_pack_and_only_that(tmp_path: Path) -> None:
    """`--pack NAME=DIR --no-builtin` (how the real-dimension checkpoint is checked on the GPU): the named pack
    alone, a wrong K planted in it fails the script naming the module, and a --pack without a config is one line,
    exit 2."""
    import subprocess
    import sys

    from sparkctl_proc import REPO, sparkctl_env

    good = fixture_copy("llama-2.5-mul1", tmp_path / "good")
    bad = fixture_copy("llama-2.5-mul1", tmp_path / "bad")
    set_storage(bad, "model.layers.0.self_attn.q_proj", bits_per_weight=3)

    def script(*args: str) -> tuple[subprocess.CompletedProcess, Path]:
        out = tmp_path / f"report-{len(list(tmp_path.glob('report-*')))}.json"
        r = subprocess.run(
            [sys.executable, "bench/verify_gpu.py", "--device", "cpu", "--quick-only", "--no-builtin", *args,
             "--out", str(out)],
            cwd=REPO, env=sparkctl_env(tmp_path), capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        return r, out

    r, out = script("--pack", f"mine={good}")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["pack"] for x in json.loads(out.read_text())["results"]] == ["mine"]
    r, out = script("--pack", f"mine={bad}")
    assert r.returncode == 1 and "FAIL" in r.stdout and "model.layers.0.self_attn.q_proj" in r.stdout, (
        r.stdout[-2000:]
    )
    r, _ = script("--pack", f"nothing={tmp_path}")
    assert r.returncode == 2 and "--pack takes NAME=DIR" in r.stderr and "Traceback" not in r.stderr
