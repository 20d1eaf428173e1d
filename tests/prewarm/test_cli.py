"""`python -m prewarm` and `sparkctl prewarm` as a user runs them: exit codes, reports, Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ctrl_c import sigint_default
from prewarm_testlib import MiB, as_nobody, prewarm_cmd, write_shard

from prewarm import model_files, residency

REPO = Path(__file__).resolve().parents[2]


def run(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=REPO, **kw)  # type: ignore[call-overload]


def sparkctl(*args: str) -> list[str]:
    return [sys.executable, "-m", "sparkctl", *args]


@pytest.mark.slow
def test_json_report_and_plain_progress(model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "reports" / "warm.json"
    r = run(prewarm_cmd(str(model_dir), "--cold", "--json", "--report", str(out), "-w", "4", "--chunk", "1M"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["mode"] == "cold" and data["workers"] == 4 and data["chunk_bytes"] == MiB
    assert data["residency_before"] < 0.05 and data["residency_after"] > 0.99
    assert data["fit"]["fits"] is True
    assert json.loads(out.read_text()) == data  # the file is the same report, written whole
    assert not list(out.parent.glob(".*.tmp"))
    # stderr is not a TTY here: plain progress lines, not a rich bar
    assert "GiB/s ETA" in r.stderr and "files 4/4" in r.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == sorted(
        ["config.json", "model.safetensors.index.json"]
        + [f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    )


@pytest.mark.slow
def test_evict_and_status(model_dir: Path) -> None:
    files = model_files(model_dir)
    for f in files:
        f.read_bytes()
    r = run(prewarm_cmd(str(model_dir), "--evict", "--json"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["residency_before"] > 0.99 and data["residency_after"] < 0.01
    r = run(prewarm_cmd(str(model_dir), "--status", "--json"))
    assert json.loads(r.stdout)["residency"] < 0.01
    assert residency(files) < 0.01


@pytest.mark.slow
def test_table_output(model_dir: Path) -> None:
    r = run(prewarm_cmd(str(model_dir), "--no-progress"))
    assert r.returncode == 0, r.stderr
    assert "prewarm warm" in r.stdout and "GiB/s" in r.stdout and "residency" in r.stdout
    assert r.stderr.strip() == "" or "note:" in r.stderr


@pytest.mark.slow
def test_report_inside_the_model_directory_is_refused(model_dir: Path) -> None:
    r = run(prewarm_cmd(str(model_dir), "--report", str(model_dir / "report.json")))
    assert r.returncode == 2
    assert "will not write into the model directory" in r.stderr and "Traceback" not in r.stderr
    assert not (model_dir / "report.json").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing", "no such file or directory"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "no model files"),
        (lambda d: write_shard(d / "t.safetensors", MiB // 2, declared=MiB), "truncated"),
    ],
)
def test_bad_input_exits_2_without_traceback(disk_dir: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    target = make(disk_dir)
    for cmd in (prewarm_cmd(str(target)), sparkctl("prewarm", str(target))):
        r = run(cmd)
        assert r.returncode == 2, (cmd, r.stderr)
        assert message in r.stderr and r.stderr.startswith("error:") and "Traceback" not in r.stderr


@pytest.mark.slow
def test_fit_check_refuses_then_force_proceeds(model_dir: Path) -> None:
    r = run(prewarm_cmd(str(model_dir), "--cold", "--headroom", "1000T"))
    assert r.returncode == 1
    assert "would leave less than" in r.stderr and "--force" in r.stderr and "Traceback" not in r.stderr
    r = run(prewarm_cmd(str(model_dir), "--cold", "--headroom", "1000T", "--force", "--json"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["fit"]["fits"] is False


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_with_a_partial_report(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", 32 * MiB)
    # 8 MiB/s over 32 MiB: about 4 s of reading, so SIGINT lands mid-read.
    proc = subprocess.Popen(
        prewarm_cmd(str(shard), "--json", "--chunk", "1M", "--limit-rate", "8M", "-w", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=sigint_default,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()  # the first plain progress line: reading has begun
    assert "GiB/s" in line
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    data = json.loads(out)
    assert data["interrupted"] is True
    assert 0 < data["bytes_read"] < 32 * MiB
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_changed_file_exits_1(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", 32 * MiB)
    proc = subprocess.Popen(
        prewarm_cmd(str(shard), "--json", "--chunk", "1M", "--limit-rate", "8M", "-w", "2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    assert proc.stderr is not None
    assert "GiB/s" in proc.stderr.readline()
    with open(shard, "ab") as fh:
        fh.write(b"\0" * 4096)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert json.loads(out)["files"][0]["changed"] is True
    assert "changed during the read" in err


@pytest.mark.slow
def test_sparkctl_prewarm_path_and_recipe_file(model_dir: Path, tmp_path: Path) -> None:
    r = run(sparkctl("prewarm", str(model_dir), "--json", "--no-progress"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["bytes_read"] == sum(f.stat().st_size for f in model_files(model_dir))
    # a recipe naming a local model directory resolves through load_recipe + plan + local_model_path
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(
        f"schema: 1\nextends: tiny\nmodel:\n  generate: null\n  path: {model_dir}\nload:\n  workers: 3\n"
    )
    r = run(sparkctl("prewarm", str(recipe), "--json", "--no-progress"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["workers"] == 3 and len(data["files"]) == 4


@pytest.mark.slow
def test_sparkctl_prewarm_recipe_without_local_model(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "SPARKCTL_CACHE_DIR": str(tmp_path / "cache"),
        "HF_HOME": str(tmp_path / "hf"),
        "HF_HUB_OFFLINE": "1",
    }
    for name in ("tiny", "glm-5.3-flash"):
        r = subprocess.run(
            sparkctl("prewarm", name), capture_output=True, text=True, env=env, timeout=60, cwd=REPO
        )
        assert r.returncode == 2, r.stderr
        assert "is not on this machine yet" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run(
        sparkctl("prewarm", "no-such-recipe"), capture_output=True, text=True, env=env, timeout=60, cwd=REPO
    )
    assert r.returncode == 2 and "unknown recipe" in r.stderr


def test_progress_line_format() -> None:
    import io

    from prewarm.progress import ProgressView
    from prewarm.warm import Progress

    buf = io.StringIO()
    with ProgressView("warming", 4 << 30, 8, stream=buf, plain=True) as view:
        view.update(Progress(1 << 30, 4 << 30, 2.0, 2, 8))
        time.sleep(0)
    first = buf.getvalue().splitlines()[0]
    assert first == "warming: 1.00/4.00 GiB  25.0 % 0.50 GiB/s ETA 6.0 s files 2/8"


@pytest.mark.slow
def test_unreadable_shard_in_evict_and_status_is_one_line(disk_dir: Path) -> None:
    shard = write_shard(disk_dir / "model.safetensors", MiB)
    shard.chmod(0)
    if os.geteuid() != 0:
        for mode in ("--evict", "--status"):
            r = run(prewarm_cmd(str(shard), mode))
            assert r.returncode == 2 and "Permission denied" in r.stderr and "Traceback" not in r.stderr
        return
    # root reads anything: run the command's code in a forked child that dropped to nobody
    from prewarm.cli import Options, execute

    for mode in ("evict", "status"):
        out = as_nobody(
            lambda mode=mode: execute([str(shard)], Options(mode=mode, progress=False, json_out=True))
        )
        assert out.startswith("BadInput") and "Permission denied" in out, (mode, out)


@pytest.mark.slow
def test_report_path_that_is_a_directory(model_dir: Path, tmp_path: Path) -> None:
    r = run(prewarm_cmd(str(model_dir), "--status", "--report", str(tmp_path)))
    assert r.returncode == 2 and "is a directory" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_an_unwritable_report_path_is_refused_before_reading(model_dir: Path, tmp_path: Path) -> None:
    """Exit 2 with the path the user gave (not a temp file's name), and no shard read in vain."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for report, why in [
        (a_file / "r.json", f"{a_file} is not a directory"),
        (a_file / "sub" / "r.json", f"{a_file} is not a directory"),
        (Path("/proc/r.json"), "cannot create a file in /proc"),
    ]:
        r = run(prewarm_cmd(str(model_dir), "--evict", "--report", str(report)))
        assert r.returncode == 2, (report, r.stderr)
        assert r.stderr.startswith(f"error: {report}: {why}"), r.stderr
        assert ".tmp" not in r.stderr and "Traceback" not in r.stderr
        assert '"mode"' not in r.stdout and "evict" not in r.stdout  # stopped before doing anything


def test_rich_progress_on_a_terminal() -> None:
    import io

    from prewarm.progress import ProgressView
    from prewarm.warm import Progress

    buf = io.StringIO()
    with ProgressView("warming", 4 << 30, 8, stream=buf, plain=False) as view:
        view.update(Progress(2 << 30, 4 << 30, 1.0, 4, 8))
    text = buf.getvalue()
    assert "warming" in text and "files 4/8" in text and "2.0/4.0 GiB" in text


@pytest.mark.slow
def test_conflicting_modes_are_refused(model_dir: Path) -> None:
    for cmd in (
        prewarm_cmd(str(model_dir), "--evict", "--cold"),
        sparkctl("prewarm", str(model_dir), "--status", "--measure-disk"),
    ):
        r = run(cmd)
        assert r.returncode == 2 and "choose one of" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_the_summary_gives_a_small_model_s_size_in_mib(model_dir: Path) -> None:
    r = run(prewarm_cmd(str(model_dir), "--no-progress"))
    assert r.returncode == 0, r.stderr
    assert "16.0 MiB" in r.stdout and "0.00 GiB" not in r.stdout, r.stdout  # four 4 MiB shards
