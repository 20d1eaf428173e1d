"""A full disk (ENOSPC) or a read-only state directory (EROFS) under `up`: one line with the path, exit 1,
nothing half-written and nothing left running (issue 27).

The state directory is a small tmpfs mounted in a private mount namespace (`unshare -rm`), so the test
needs no root and leaves no mount behind; it is skipped where user namespaces are not allowed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from sparkctl.server.ports import free_port

REPO = Path(__file__).resolve().parents[2]

# Mount a tmpfs of SIZE at STATE, optionally fill it leaving FREE bytes, or make it read-only; then exec.
_PRELUDE = textwrap.dedent(
    """
    set -e
    state="$1"; size="$2"; free="$3"; mode="$4"; shift 4
    mount -t tmpfs -o size="$size" tmpfs "$state"
    if [ "$free" != "-" ]; then
        dd if=/dev/zero of="$state/.fill" bs=4096 2>/dev/null || true
        truncate -s "-$free" "$state/.fill"
    fi
    if [ "$mode" = ro ]; then mount -o remount,ro "$state"; fi
    rc=0
    "$@" || rc=$?
    echo "--- state dir:"; find "$state" -mindepth 1 -not -name .fill | sort
    exit $rc
    """
)


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not _can_unshare(), reason="needs `unshare -rm` (user + mount namespaces)"),
]


def _recipe(tmp_path: Path, marker: str) -> Path:
    code = f"import time  # {marker}\ntime.sleep(600)\n"
    path = tmp_path / "disk.yaml"
    path.write_text(
        f"schema: 1\nextends: {REPO / 'recipes' / 'tiny.yaml'}\nname: disk\n"
        f"engine:\n  entrypoint: {json.dumps([sys.executable, '-c', code])}\nserve:\n  health_timeout_s: 60\n"
    )
    return path


def _up_on_tmpfs(
    tmp_path: Path, *, free: int | None, readonly: bool = False
) -> tuple[subprocess.CompletedProcess[str], str]:
    marker = f"disk-{os.getpid()}-{time.monotonic_ns()}"
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "SPARKCTL_STATE_DIR": str(state), "SPARKCTL_CACHE_DIR": str(tmp_path / "cache")}
    argv = [
        sys.executable,
        "-m",
        "sparkctl",
        "up",
        str(_recipe(tmp_path, marker)),
        "--port",
        str(free_port()),
    ]
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _PRELUDE, "sh", str(state), "256k", "-" if free is None else str(free),
         "ro" if readonly else "rw", *argv],
        env=env, capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    return proc, marker


def _left_running(marker: str) -> list[int]:
    time.sleep(0.2)
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if marker in " ".join(p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


def _one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def test_a_read_only_state_dir_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    proc, marker = _up_on_tmpfs(tmp_path, free=None, readonly=True)
    assert "--- state dir:" in proc.stdout, proc.stderr
    line = _one_error(proc.stderr)
    assert "Read-only file system" in line and str(tmp_path / "state") in line
    assert "hint: set SPARKCTL_STATE_DIR to a writable directory" in proc.stderr
    assert _left_running(marker) == []


def test_a_full_disk_at_the_log_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    proc, marker = _up_on_tmpfs(tmp_path, free=0)
    line = _one_error(proc.stderr)
    assert "No space left on device" in line and "disk.log" in line, line
    assert _left_running(marker) == []


def test_a_full_disk_at_the_state_file_stops_the_server_and_leaves_no_half_file(tmp_path: Path) -> None:
    """Room for the lock and the log's first page, not for the state file: the launched server is stopped."""
    proc, marker = _up_on_tmpfs(tmp_path, free=2 * 4096)
    line = _one_error(proc.stderr)
    assert "No space left on device" in line and "servers/disk.json" in line, line
    listing = proc.stdout.split("--- state dir:", 1)[1]
    assert ".tmp" not in listing and "disk.json" not in listing, listing  # no temp file, no half record
    assert _left_running(marker) == []


def test_a_full_disk_while_the_model_is_made_is_one_line_and_leaves_no_half_model(tmp_path: Path) -> None:
    """The fetch stage of `tiny` generates the model into the cache: a full cache disk there."""
    marker = f"gen-{os.getpid()}-{time.monotonic_ns()}"
    cache = tmp_path / "cache"
    cache.mkdir()
    env = {**os.environ, "SPARKCTL_STATE_DIR": str(tmp_path / "state"), "SPARKCTL_CACHE_DIR": str(cache)}
    argv = [
        sys.executable,
        "-m",
        "sparkctl",
        "up",
        str(_recipe(tmp_path, marker)),
        "--port",
        str(free_port()),
    ]
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _PRELUDE, "sh", str(cache), "256k", "-", "rw", *argv],
        env=env, capture_output=True, text=True, timeout=180, cwd=REPO,
    )  # fmt: skip
    line = _one_error(proc.stderr)
    assert "No space left on device" in line, line
    listing = proc.stdout.split("--- state dir:", 1)[1].split()
    assert [p for p in listing if "tiny-llama" in p or ".tmp" in p] == [], listing
    assert _left_running(marker) == []


_REPORT_PRELUDE = textwrap.dedent(
    """
    set -e
    dir="$1"; shift
    mount -t tmpfs -o size=256k tmpfs "$dir"
    echo '{"old": true}' > "$dir/report.json"
    dd if=/dev/zero of="$dir/.fill" bs=4096 2>/dev/null || true
    rc=0
    "$@" || rc=$?
    echo "--- dir:"; find "$dir" -mindepth 1 -not -name .fill | sort
    echo "--- report:"; cat "$dir/report.json"
    exit $rc
    """
)


def test_a_full_disk_at_the_prewarm_report_is_one_line_and_keeps_the_old_report(tmp_path: Path) -> None:
    """`prewarm --report FILE` on a full filesystem: the shards are read, the report cannot be written."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "w.bin").write_bytes(b"\1" * 65536)
    out = tmp_path / "out"
    out.mkdir()
    argv = [sys.executable, "-m", "sparkctl", "prewarm", str(model), "--report", str(out / "report.json")]
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _REPORT_PRELUDE, "sh", str(out), *argv],
        env={**os.environ, "SPARKCTL_STATE_DIR": str(tmp_path / "state")},
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = _one_error(proc.stderr)
    assert "No space left on device" in line and "report.json" in line, line
    listing, report = proc.stdout.split("--- dir:", 1)[1].split("--- report:")
    assert ".tmp" not in listing, listing
    assert json.loads(report) == {"old": True}  # the previous report is untouched
