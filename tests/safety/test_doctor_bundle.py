"""`doctor --bundle`: one archive with what a bug report needs, and not one planted secret in it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

# starts processes (tests/conftest.py, the process guard): not in make test-fast
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
HF = "hf_PlantedHubToken0123456789abcdef"
KEY = "sk-planted-api-key-" + "Q" * 20
ENV_SECRET = "planted-env-secret-value-42"
LOG_SECRET = "hf_AnotherTokenSeenInALogLine123456"


def test_bundle_holds_the_report_and_no_planted_secret(tmp_path: Path) -> None:
    state = tmp_path / "state"
    (state / "keys").mkdir(parents=True)
    (state / "keys" / "tiny.env").write_text(f"VLLM_API_KEY={KEY}\n")
    (state / "logs").mkdir()
    (state / "logs" / "tiny.log").write_text(
        f"INFO starting\nDEBUG headers: Authorization: Bearer {KEY}\nWARN token={LOG_SECRET}\nINFO ready\n"
    )
    (state / "servers").mkdir()
    (state / "servers" / "tiny.json").write_text(json.dumps({"recipe": "tiny", "extra": {"note": HF}}))
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: tiny\nenv:\n  MY_SERVICE_TOKEN: {ENV_SECRET}\n")
    env = {
        **os.environ,
        "SPARKCTL_STATE_DIR": str(state),
        "SPARKCTL_CACHE_DIR": str(tmp_path / "cache"),
        "HF_TOKEN": HF,
        "HF_HOME": str(tmp_path / "hf"),
    }
    out = tmp_path / "bundle.tar.gz"
    proc = subprocess.run(
        [sys.executable, "-m", "sparkctl", "doctor", str(recipe), "--bundle", str(out)],
        env=env, capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with tarfile.open(out) as tar:
        files = {m.name.removeprefix("sparkctl-bundle/"): tar.extractfile(m).read().decode() for m in tar}  # type: ignore[union-attr]
    assert {
        "host.json",
        "doctor.json",
        "recipe.json",
        "plan.json",
        "state/tiny.json",
        "logs/tiny.log",
    } <= set(files)
    assert "INFO ready" in files["logs/tiny.log"]  # the log is there, its secrets are not
    everything = "\n".join([*files.values(), proc.stdout, proc.stderr])
    for secret in (HF, KEY, ENV_SECRET, LOG_SECRET):
        assert secret not in everything, secret
    assert "[REDACTED]" in files["logs/tiny.log"] and "[REDACTED]" in files["recipe.json"]
