"""Doctor: the checks' logic on given facts, the probes on fake and real hosts, and the command."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
from plans import build_plan

from prewarm.fit import MemoryStatus
from sparkctl import doctor
from sparkctl.doctor import (
    CHECK_NAMES,
    DiskFacts,
    DockerFacts,
    Gpu,
    Needs,
    NvidiaFacts,
    check_arch,
    check_disk,
    check_docker,
    check_driver,
    check_gpu,
    check_hf_token,
    check_memory,
    check_nvidia_runtime,
    needs_of,
    run_checks,
)
from sparkctl.errors import UserError
from sparkctl.planner.types import ContainerSpec, LoadPolicy, MemoryPlan, ModelSource, Plan

REPO = Path(__file__).resolve().parents[2]
GiB = 1 << 30
SPARK_NEEDS = Needs(gpu=True, docker=True, gpu_container=True, recipe="glm-5.3-flash")
CPU_NEEDS = Needs(recipe="tiny")
GENERAL = Needs()
GB10 = NvidiaFacts((Gpu("NVIDIA GB10", "12.1", "[N/A]"),), "580.95.05", "13.0", "nvidia-smi")
H200 = NvidiaFacts((Gpu("NVIDIA H200", "9.0", "143771 MiB"),), "575.57.08", "12.9", "nvidia-smi")
NO_GPU = NvidiaFacts(error="no nvidia-smi on PATH and no /proc/driver/nvidia (no NVIDIA driver loaded)")


def make_plan(
    *,
    runtime: str = "docker",
    gpus: bool = True,
    memory: MemoryPlan | None = None,
    model: ModelSource | None = None,
    device: str = "cuda",
) -> Plan:
    container = (
        ContainerSpec(image="sparkctl/vllm:test", name="t", gpus=gpus) if runtime == "docker" else None
    )
    return build_plan(
        recipe_name="r",
        runtime=runtime,
        argv=("vllm", "serve", "m"),
        port=8000,
        served_model_name="m",
        model=model or ModelSource(repo="org/m", expected_bytes=10 * GiB),
        load=LoadPolicy(),
        memory=memory,
        health_timeout_s=60,
        container=container,
        device=device,
    )


def memory_plan(budget: float, total: float = 121.7, fits: bool = True) -> MemoryPlan:
    return MemoryPlan(
        int(total * GiB),
        int(budget * GiB),
        0,
        0,
        0,
        0,
        0,
        fits,
        ("does not fit: weights exceed the pool",) if not fits else (),
    )


# ------------------------------------------------------------------------------------ pure check logic


def test_arch() -> None:
    assert check_arch("aarch64", SPARK_NEEDS).status == "pass"
    assert check_arch("x86_64", SPARK_NEEDS).status == "warn"
    assert check_arch("x86_64", GENERAL).status == "warn"
    assert check_arch("x86_64", CPU_NEEDS).status == "pass"
    assert check_arch("riscv64", GENERAL).status == "warn"


def test_gpu() -> None:
    ok = check_gpu(GB10, SPARK_NEEDS)
    assert ok.status == "pass" and "12.1" in ok.detail
    other = check_gpu(H200, SPARK_NEEDS)
    assert other.status == "warn" and "not a GB10" in other.detail and other.hint
    missing = check_gpu(NO_GPU, SPARK_NEEDS)
    assert missing.status == "fail" and "needs a CUDA GPU" in missing.detail and missing.hint
    assert check_gpu(NO_GPU, GENERAL).status == "warn"
    assert check_gpu(NO_GPU, CPU_NEEDS).status == "pass"
    unknown_cc = NvidiaFacts((Gpu("NVIDIA GB10", None),), "580.95.05", None, "/proc/driver/nvidia")
    assert check_gpu(unknown_cc, SPARK_NEEDS).status == "warn"


def test_driver() -> None:
    assert check_driver(GB10, SPARK_NEEDS).status == "pass"
    old = check_driver(H200, SPARK_NEEDS)
    assert old.status == "fail" and "CUDA 13" in old.detail and "580" in (old.hint or "")
    assert check_driver(H200, GENERAL).status == "warn"
    assert check_driver(NO_GPU, SPARK_NEEDS).status == "fail"
    assert check_driver(NO_GPU, CPU_NEEDS).status == "pass"
    no_libcuda = NvidiaFacts((Gpu("NVIDIA GB10", "12.1"),), "580.95.05", None, "nvidia-smi")
    assert check_driver(no_libcuda, SPARK_NEEDS).status == "warn"


def test_docker_and_nvidia_runtime() -> None:
    up = DockerFacts("/usr/bin/docker", True, "28.1.1", "1.49", ("nvidia", "runc"), "runc")
    down = DockerFacts(None, error="no Docker daemon: /var/run/docker.sock does not exist")
    no_nv = DockerFacts("/usr/bin/docker", True, "28.1.1", "1.49", ("runc",), "runc")
    cdi = DockerFacts("/usr/bin/docker", True, "28.1.1", "1.49", ("runc",), "runc", ("/etc/cdi/nvidia.yaml",))
    assert check_docker(up, SPARK_NEEDS).status == "pass"
    failed = check_docker(down, SPARK_NEEDS)
    assert failed.status == "fail" and "docker.sock" in failed.detail and "no docker client" in failed.detail
    assert check_docker(down, GENERAL).status == "warn"
    assert check_docker(down, CPU_NEEDS).status == "pass"  # a native recipe does not need docker
    assert check_nvidia_runtime(up, SPARK_NEEDS).status == "pass"
    assert check_nvidia_runtime(cdi, SPARK_NEEDS).status == "pass"
    missing = check_nvidia_runtime(no_nv, SPARK_NEEDS)
    assert missing.status == "fail" and "nvidia-ctk" in (missing.hint or "")
    assert check_nvidia_runtime(no_nv, GENERAL).status == "warn"
    assert check_nvidia_runtime(down, SPARK_NEEDS).status == "fail"
    assert check_nvidia_runtime(down, CPU_NEEDS).status == "pass"


def test_memory() -> None:
    host = MemoryStatus(int(121.7 * GiB), int(100 * GiB), None, None, None)
    assert check_memory(host, None).status == "pass"
    assert check_memory(MemoryStatus(100 * GiB, 5 * GiB, None, None, None), None).status == "warn"
    assert check_memory(host, make_plan(memory=memory_plan(90))).status == "pass"
    tight = check_memory(host, make_plan(memory=memory_plan(110)))
    assert tight.status == "warn" and "--evict" in (tight.hint or "")
    small_host = MemoryStatus(24 * GiB, 20 * GiB, None, None, None)
    assert check_memory(small_host, make_plan(memory=memory_plan(90))).status == "fail"
    nofit = check_memory(host, make_plan(memory=memory_plan(90, fits=False)))
    assert nofit.status == "fail" and "does not fit" in nofit.detail
    boxed = MemoryStatus(int(121.7 * GiB), int(100 * GiB), 32 * GiB, 0, "/sys/fs/cgroup/x")
    assert check_memory(boxed, make_plan(memory=memory_plan(90))).status == "warn"  # cgroup caps it


def test_disk() -> None:
    assert check_disk(DiskFacts("/hf", 50 * GiB, 91 * GiB)).status == "fail"
    assert check_disk(DiskFacts("/hf", 95 * GiB, 91 * GiB)).status == "warn"
    assert check_disk(DiskFacts("/hf", 500 * GiB, 91 * GiB)).status == "pass"
    assert check_disk(DiskFacts("/hf", 50 * GiB, 91 * GiB, local="/hf/snap")).status == "pass"
    assert check_disk(DiskFacts("/m", None, None, error="model path /m does not exist")).status == "fail"
    assert check_disk(DiskFacts("/hf", 50 * GiB, None)).status == "warn"
    assert check_disk(DiskFacts("/c", 50 * GiB, None, generated=True)).status == "pass"
    # A recipe without model.expected_bytes is judged by its weights, not by a Spark-size guess.
    sized = check_disk(DiskFacts("/hf", 50 * GiB, None, at_least_bytes=15 * GiB))
    assert sized.status == "pass" and "at least 15.0 GiB" in sized.detail and "91" not in sized.detail
    assert check_disk(DiskFacts("/hf", 10 * GiB, None, at_least_bytes=15 * GiB)).status == "fail"


def test_hf_token() -> None:
    gated = Needs(token=True, recipe="gated")
    assert check_hf_token(False, gated).status == "fail"
    assert check_hf_token(True, gated).status == "pass"
    assert check_hf_token(False, GENERAL).status == "pass"


def test_needs_of_plans() -> None:
    assert needs_of(None) == Needs()
    spark = needs_of(make_plan())
    assert spark.gpu and spark.docker and spark.gpu_container and not spark.token
    cpu_docker = needs_of(make_plan(gpus=False))
    assert cpu_docker.docker and not cpu_docker.gpu
    native_cpu = make_plan(runtime="native", device="cpu")
    assert not needs_of(native_cpu).gpu and not needs_of(native_cpu).docker
    assert needs_of(native_cpu, needs_gpu=True).gpu
    # A native CUDA plan needs a GPU whatever pool it is sized against (no guessing from the memory plan).
    host_pool = memory_plan(2, total=psutil.virtual_memory().total / GiB)
    native_gpu = needs_of(make_plan(runtime="native", memory=host_pool))
    assert native_gpu.gpu and not native_gpu.docker and not native_gpu.gpu_container
    assert not needs_of(make_plan(device="cpu")).gpu_container  # a CPU engine in a container: no GPUs


def test_the_planner_carries_the_engine_device_to_the_doctor() -> None:
    from sparkctl.planner import plan
    from sparkctl.recipe import load_recipe

    assert plan(load_recipe("tiny"), check_memory=False).device == "cpu"
    assert not needs_of(plan(load_recipe("tiny"), check_memory=False)).gpu
    gguf = plan(load_recipe("ornith-1.5-35b-a3b-iq3s"), check_memory=False)
    assert gguf.device == "cuda" and gguf.runtime == "native" and needs_of(gguf).gpu
    on_gpu = plan(load_recipe("tiny", ["engine.device=cuda"]), check_memory=False)
    assert on_gpu.device == "cuda" and needs_of(on_gpu).gpu
    gated = make_plan(model=ModelSource(repo="org/gated", needs_token=True))
    assert needs_of(gated).token


# ------------------------------------------------------------------------------------------ probes


def test_probe_nvidia_from_proc(tmp_path: Path) -> None:
    gpu_dir = tmp_path / "proc/driver/nvidia/gpus/000f:01:00.0"
    gpu_dir.mkdir(parents=True)
    (gpu_dir / "information").write_text("Model: \t\t NVIDIA GB10\nIRQ:   175\n")
    (tmp_path / "proc/driver/nvidia/version").write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build\nGCC version: gcc 13\n"
    )
    facts = doctor.probe_nvidia(root=str(tmp_path))
    assert facts.gpus == (Gpu("NVIDIA GB10", None),)
    assert facts.driver_version == "580.95.05" and facts.source == "/proc/driver/nvidia"
    empty = doctor.probe_nvidia(root=str(tmp_path / "none"))
    assert not empty.gpus and "no NVIDIA driver" in (empty.error or "")


def test_cdi_specs(tmp_path: Path) -> None:
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n")
    (tmp_path / "other.yaml").write_text("kind: vendor.com/fpga\n")
    assert doctor._cdi_nvidia_specs([str(tmp_path)]) == [str(tmp_path / "nvidia.yaml")]


def test_probe_disk_for_a_local_path(tmp_path: Path) -> None:
    plan = make_plan(runtime="native", model=ModelSource(path=str(tmp_path)))
    facts = doctor.probe_disk(plan)
    assert facts.local == str(tmp_path) and facts.free_bytes == shutil.disk_usage(tmp_path).free
    missing = doctor.probe_disk(make_plan(runtime="native", model=ModelSource(path=str(tmp_path / "nope"))))
    assert missing.error and "does not exist" in missing.error


def test_probe_disk_sizes_a_recipe_without_expected_bytes_by_its_weights() -> None:
    from sparkctl.planner import plan
    from sparkctl.recipe import load_recipe

    gguf = plan(load_recipe("ornith-1.5-35b-a3b-iq3s"), check_memory=False)
    assert gguf.model.expected_bytes is None and gguf.memory is not None
    facts = doctor.probe_disk(gguf)
    assert facts.need_bytes is None and facts.at_least_bytes == gguf.memory.weights_bytes == 16_000_000_000
    spark = plan(load_recipe("glm-5.3-flash"), check_memory=False)
    assert doctor.probe_disk(spark).at_least_bytes is None  # expected_bytes is given: that is the need


# ------------------------------------------------------------------------------------ the real host


@pytest.mark.slow
def test_run_checks_on_this_host() -> None:
    checks = run_checks()
    assert [c.name for c in checks] == [n for n in CHECK_NAMES if n not in ("hf-token", "verified")]
    by = {c.name: c for c in checks}
    assert platform.machine() in by["arch"].detail
    has_nvidia = bool(shutil.which("nvidia-smi")) or Path("/proc/driver/nvidia").exists()
    if not has_nvidia:  # this CI machine: says what is missing, without failing a general check-up
        assert by["gpu"].status == "warn" and "no nvidia-smi" in by["gpu"].detail
        assert by["driver"].status == "warn"
    assert f"{psutil.virtual_memory().total / GiB:.1f} GiB total" in by["memory"].detail
    for c in checks:
        assert c.status in ("pass", "warn", "fail") and c.detail
        assert c.status == "pass" or c.hint, c


def _engine_version() -> str | None:
    """The daemon's version asked over its socket with plain HTTP (httpx), not through the Docker SDK the
    probe uses: an independent witness. None when no daemon answers."""
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    if not host.startswith("unix://"):
        pytest.skip(f"DOCKER_HOST {host} is not a unix socket")
    sock = host.removeprefix("unix://")
    if not Path(sock).exists():
        return None
    try:
        with httpx.Client(transport=httpx.HTTPTransport(uds=sock), timeout=5) as client:
            return str(client.get("http://docker/version").json()["Version"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def test_docker_check_matches_the_daemon() -> None:
    (check,) = run_checks(only=["docker"])
    version = _engine_version()
    if version is None:
        assert check.status != "pass" and check.hint, check
    else:
        assert check.status == "pass", check
        assert version in check.detail


def test_docker_check_fails_for_a_daemon_that_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pointed at a socket nobody listens on, the probe must not report a daemon (whatever runs here)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path / 'no-daemon.sock'}")
    facts = doctor.probe_docker(timeout=2)
    assert not facts.reachable and facts.error
    (check,) = run_checks(only=["docker"])
    assert check.status != "pass" and check.hint


def test_only_and_unknown_names() -> None:
    assert [c.name for c in run_checks(only=["memory", "arch"])] == ["arch", "memory"]
    with pytest.raises(UserError, match="unknown check 'gpus'"):
        run_checks(only=["gpus"])


def test_hf_token_runs_only_when_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    gated = make_plan(
        runtime="native", model=ModelSource(repo="org/gated", needs_token=True, expected_bytes=GiB)
    )
    (tok,) = [c for c in run_checks(gated, needs_gpu=False) if c.name == "hf-token"]
    assert tok.status == "fail"
    monkeypatch.setenv("HF_TOKEN", "hf_test_token_value")
    assert run_checks(gated, only=["hf-token"], needs_gpu=False)[0].status == "pass"
    assert "hf-token" not in [c.name for c in run_checks(make_plan(runtime="native"), needs_gpu=False)]


# -------------------------------------------------------------------------------------- the command


def sparkctl(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sparkctl", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@pytest.mark.slow
def test_doctor_json_exit_code_follows_failures() -> None:
    r = sparkctl("doctor", "--json")
    data = json.loads(r.stdout)
    failed = any(c["status"] == "fail" for c in data["checks"])
    assert data["ok"] is (not failed)
    assert r.returncode == (1 if failed else 0)


@pytest.mark.slow
def test_doctor_table() -> None:
    r = sparkctl("doctor", "--only", "arch", "--only", "memory")
    assert r.returncode == 0, r.stderr
    assert "arch" in r.stdout and "memory" in r.stdout and "passed" in r.stdout


@pytest.mark.slow
def test_doctor_recipe_scoping(tmp_path: Path) -> None:
    env = {"SPARKCTL_CACHE_DIR": str(tmp_path / "cache"), "HF_HOME": str(tmp_path / "hf")}
    r = sparkctl("doctor", "tiny", "--json", env=env)
    data = json.loads(r.stdout)
    by = {c["name"]: c for c in data["checks"]}
    assert by["docker"]["detail"].startswith("not needed by tiny")
    assert by["gpu"]["status"] == "pass"
    assert r.returncode == (0 if data["ok"] else 1)
    if not (shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists()):
        gpu = by["gpu"]["detail"]
        assert gpu.startswith("not needed by tiny; no nvidia-smi") and "))" not in gpu, gpu  # readable
        r = sparkctl("doctor", "glm-5.3-flash", "--json", env=env)
        assert r.returncode == 1
        by = {c["name"]: c for c in json.loads(r.stdout)["checks"]}
        assert by["gpu"]["status"] == "fail" and "glm-5.3-flash needs a CUDA GPU" in by["gpu"]["detail"]


@pytest.mark.slow
def test_doctor_user_errors() -> None:
    r = sparkctl("doctor", "no-such-recipe")
    assert r.returncode == 2 and "unknown recipe" in r.stderr and "Traceback" not in r.stderr
    r = sparkctl("doctor", "--only", "gpus")
    assert r.returncode == 2 and "unknown check" in r.stderr and "Traceback" not in r.stderr
    r = sparkctl("doctor", "--set", "serve.port=1")
    assert r.returncode == 2 and "--set needs a RECIPE" in r.stderr
