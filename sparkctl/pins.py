"""The versions an engine release is built with, in one place.

The image build reads these (build args), `sparkctl show` prints them, `doctor` compares them with the
labels of the image a recipe names, and the recipe schema refuses a recipe pin that contradicts them:
a pin written once per engine release cannot drift between four recipes, a Dockerfile and a README.
Facts are from the wheels' own metadata (vLLM 0.33.0 `Requires-Dist: torch==2.14.0`,
`flashinfer-python==0.7.2.post1`, `Requires-Python: <3.15,>=3.11`; PyPI's torch 2.14.0 is the cu130 build:
its `torch/version.py` says cuda = '13.0', so no extra index is needed).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# label namespace on a built image: io.sparkctl.pin.<component> = version
PIN_LABEL_PREFIX = "io.sparkctl.pin."


@dataclass(frozen=True)
class EnginePins:
    engine: str
    version: str
    torch: str
    flashinfer: str
    cuda: str  # CUDA major.minor the torch build targets (torch.version.cuda)
    python: str  # what the wheels accept (Requires-Python); the base decides which (3.12 on the Spark bases)
    cuda_toolkit: (
        str  # PyPI cuda-toolkit (torch 2.14.0 pins 13.0.3); its [nvcc] extra when the base has no nvcc
    )
    ninja: str
    ray: str  # two-node serving; vLLM declares no ray pin, this is the version we test with
    cuobjdump: str  # PyPI nvidia-cuda-cuobjdump (the smoke test reads the kernels' SASS); 13.2 is its oldest

    def components(self) -> dict[str, str]:
        """component -> version, what labels and recipe pins are compared on."""
        d = asdict(self)
        for key in ("engine", "version"):
            d.pop(key)
        return {self.engine: self.version, **d}

    def build_args(self) -> dict[str, str]:
        """The docker/Dockerfile ARGs these pins set."""
        return {
            "VLLM_VERSION": self.version,
            "TORCH_VERSION": self.torch,
            "FLASHINFER_VERSION": self.flashinfer,
            "CUDA_VERSION": self.cuda,
            "CUDA_TOOLKIT_VERSION": self.cuda_toolkit,
            "NINJA_VERSION": self.ninja,
            "RAY_VERSION": self.ray,
            "CUOBJDUMP_VERSION": self.cuobjdump,
        }

    def labels(self) -> dict[str, str]:
        return {PIN_LABEL_PREFIX + k: v for k, v in self.components().items()}


_PINS = (
    EnginePins(
        engine="vllm",
        version="0.33.0",
        torch="2.14.0",
        flashinfer="0.7.2.post1",
        cuda="13.0",
        python=">=3.11",
        cuda_toolkit="13.0.3",
        ninja="1.13.2",
        ray="2.60.0",
        cuobjdump="13.2.51",
    ),
)
PINS: dict[tuple[str, str], EnginePins] = {(p.engine, p.version): p for p in _PINS}
# the engine release the Spark image is built for when a recipe names none
DEFAULT = _PINS[0]


def pins_for(engine: str, version: str | None) -> EnginePins | None:
    """The pins of one engine release, or None when sparkctl has none for it (e.g. llama.cpp, vLLM CPU)."""
    if version is None:
        return None
    return PINS.get((engine, version))


def same_version(want: str, have: str) -> bool:
    """A pin matches an installed version that only adds a local tag: 2.14.0 == 2.14.0+cu130."""
    return have == want or have.split("+", 1)[0] == want.split("+", 1)[0]


def conflicts(pins: EnginePins, recipe_pins: dict[str, str]) -> list[str]:
    """Recipe pins that contradict the engine release's pins, in words."""
    known = pins.components()
    return [
        f"{name} {value} ({pins.engine} {pins.version} needs {name}=={known[name]})"
        for name, value in recipe_pins.items()
        if name in known and not same_version(known[name], value)
    ]
