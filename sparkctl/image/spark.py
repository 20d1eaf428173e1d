"""The Spark serving image: docker/Dockerfile built from a recipe's engine release and sparkctl's pins.

A recipe names the image it runs (`container.image`, e.g. sparkctl/vllm-exl3:0.33.0-sm121); the build
tags the content-hashed image `sparkctl/vllm-exl3:0.33.0-sm121-<hash>` and points that name at it, so
`up` finds it and `image ls` shows which inputs made it.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from sparkctl.errors import UserError
from sparkctl.image.context import BuildSpec
from sparkctl.pins import DEFAULT, EnginePins, pins_for

# docker/README.md, "Choosing the base": the default and why.
DEFAULT_BASE = "nvidia/cuda:13.0.2-devel-ubuntu24.04"
DEFAULT_ARCH = "12.1"
DEFAULT_RECIPE = "glm-5.3-flash"
DOCKERFILE = "docker/Dockerfile"
IGNORE_FILE = "docker/Dockerfile.dockerignore"


def checkout_root() -> Path:
    """The sparkctl checkout this code runs from: the Dockerfile and kernel sources are read from it."""
    root = Path(__file__).resolve().parents[2]
    if not (root / DOCKERFILE).is_file():
        raise UserError(
            f"sparkctl build needs a sparkctl checkout ({DOCKERFILE} is not next to the installed package)",
            hint="git clone the sparkctl repository and run sparkctl from it (pip install -e .)",
        )
    return root


def sm(arch: str) -> str:
    """12.1 -> sm_121, 12.1a -> sm_121a (what `make kernels ARCHS=` takes)."""
    m = re.fullmatch(r"(\d+)\.(\d+)([af]?)", arch)
    if not m:
        raise UserError(f"--arch {arch!r} is not a CUDA compute capability like 12.1 or 12.1a")
    return f"sm_{m.group(1)}{m.group(2)}{m.group(3)}"


def spark_spec(
    recipe: Any | None,
    *,
    base: str | None = None,
    arch: str = DEFAULT_ARCH,
    root: Path | None = None,
) -> tuple[BuildSpec, EnginePins]:
    """The build of the image `recipe` runs (or the default Spark image when recipe is None)."""
    pins = DEFAULT
    image = None
    extra: dict[str, str] = {}
    if recipe is not None:
        from sparkctl.planner.adapters import adapter_for

        engine = adapter_for(recipe.engine.name)
        if not engine.builds_image:
            raise UserError(f"{recipe.name} uses {recipe.engine.name}; sparkctl build makes the vLLM image")
        if recipe.runtime != "docker" or not recipe.container or not recipe.container.image:
            raise UserError(
                f"{recipe.name} does not run in a container (runtime {recipe.runtime}): nothing to build"
            )
        if recipe.container.image.startswith("sparkctl-test:"):
            raise UserError(
                f"{recipe.name} runs the local test image {recipe.container.image}, made by `make test-image`, "
                "not by sparkctl build"
            )
        found = pins_for(engine.name, recipe.engine.version)
        if found is None:
            raise UserError(
                f"sparkctl has no pins for vllm {recipe.engine.version} ({recipe.name}'s engine.version)",
                hint=f"use engine.version {DEFAULT.version}, or add the release to sparkctl/pins.py",
            )
        pins, image, extra = found, recipe.container.image, dict(recipe.engine.pins)
    smarch = sm(arch)
    prefix = f"{pins.version}-sm{smarch[3:]}"
    repository = "sparkctl/vllm-exl3"
    if image and arch == DEFAULT_ARCH and ":" in image.rsplit("/", 1)[-1]:
        repository = image.rpartition(":")[0]
        alias = image
    else:
        alias = f"{repository}:{prefix}"
    labels = {**pins.labels(), **{f"io.sparkctl.pin.{k}": v for k, v in extra.items()}}
    labels["io.sparkctl.cuda-arch"] = arch
    args = {
        **pins.build_args(),
        "TORCH_CUDA_ARCH_LIST": arch,
        "KERNEL_ARCHS": smarch,
    }
    spec = BuildSpec(
        context=root or checkout_root(),
        dockerfile=DOCKERFILE,
        repository=repository,
        prefix=prefix,
        base=base or DEFAULT_BASE,
        alias=alias,
        build_args=args,
        labels=labels,
        ignore_file=IGNORE_FILE,
    )
    return spec, pins
