"""The real-exllamav3 fixtures (tests/fixtures/exl3_real/): which exist, where their parts are, how to make them.

Shared by the reference-decoder test (tests/kernels/test_exl3_real_decoder.py) and the vLLM test
(tests/plugin/test_exl3_real_fixtures.py). The list of fixtures is make_fixtures.py's own, so a fixture the
script makes but nobody committed shows up as a skip naming the command, not as silence.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent / "fixtures" / "exl3_real"
MAKE_CMD = (
    "python3 tests/fixtures/exl3_real/make_fixtures.py --out DIR on a CUDA machine (exllamav3 1.6.5; "
    "the device command is in tests/fixtures/exl3_real/README.md), then "
    "tar -xJf DIR/exl3_real_fixtures.tar.xz -C tests/fixtures/exl3_real"
)


def _load_script(name: str, path: Path):  # noqa: ANN202 (a module)
    """A script that is no package's module, imported from its file once per process under `name` (its
    dataclasses look their module up in sys.modules)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def _make_fixtures():  # noqa: ANN202 (a module)
    return _load_script("exl3_make_fixtures", ROOT / "make_fixtures.py")


def fixture_forward():  # noqa: ANN201 (a module)
    """kernels/bench/fixture_forward.py: the fixtures' whole forward through the plugin's layer functions."""
    return _load_script(
        "kernels_bench_fixture_forward", ROOT.parents[2] / "kernels" / "bench" / "fixture_forward.py"
    )


FIXTURES = _make_fixtures().FIXTURES
NAMES: list[str] = [f.name for f in FIXTURES]


def path(name: str) -> Path:
    return ROOT / name


def missing_reason(name: str) -> str | None:
    """None if the fixture is complete on disk, else the skip reason (naming the command that makes it)."""
    d = path(name)
    parts = [d / "meta.json", d / "exl3_reference.safetensors", d / "model" / "config.json"]
    absent = [str(p.relative_to(ROOT)) for p in parts if not p.exists()]
    if absent:
        return f"exllamav3-made fixture {name} not in tests/fixtures/exl3_real/ ({', '.join(absent)}): make it with {MAKE_CMD}"
    return None


def meta(name: str) -> dict:
    return json.loads((path(name) / "meta.json").read_text())


def reference(name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path(name) / "exl3_reference.safetensors"))


def prompts(ref: dict[str, torch.Tensor]) -> list[tuple[list[int], torch.Tensor]]:
    """(token ids, exllamav3's fp32 logits [T, vocab]) per prompt, in order."""
    out = []
    i = 0
    while f"prompt.{i}.input_ids" in ref:
        out.append((ref[f"prompt.{i}.input_ids"].tolist(), ref[f"prompt.{i}.logits"].float()))
        i += 1
    return out


def stored_layers(name: str) -> dict[str, dict[str, torch.Tensor]]:
    """Every EXL3 module of the fixture's model: key -> its stored tensors (trellis, suh, svh, marker, bias)."""
    from safetensors import safe_open

    groups: dict[str, dict[str, torch.Tensor]] = {}
    for f in sorted((path(name) / "model").glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():  # noqa: SIM118 (safe_open is not a mapping)
                prefix, _, leaf = key.rpartition(".")
                groups.setdefault(prefix, {})[leaf] = st.get_tensor(key)
    return {k: g for k, g in groups.items() if "trellis" in g}
