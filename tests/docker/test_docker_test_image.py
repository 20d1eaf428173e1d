"""The local test image (scripts/test-image.sh) carries every shared library that the host Python, its
standard-library extensions, torch and vLLM's compiled modules link against: checked with `ldd` run
inside the image, on the files the e2e tests actually load from the bind-mounted host paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from dockerkit import TEST_IMAGE, host_python, host_python_mounts

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("test_image")]


def compiled_files() -> list[str]:
    site = next(Path(p) for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    files = [Path(host_python())]
    dynload = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    # tkinter's Tk/X11 libraries are left out of the image on purpose: nothing here draws windows
    files += [p for p in (dynload / "lib-dynload").glob("*.so") if not p.name.startswith("_tkinter")]
    files += sorted((site / "torch").glob("_C*.so")) + sorted((site / "torch" / "lib").glob("*.so*"))
    files += sorted((site / "vllm").glob("*.so"))
    return [str(f) for f in files if f.exists()]


def test_every_linked_library_resolves_inside_the_image(docker_client) -> None:
    files = compiled_files()
    if not any("/vllm/" in f for f in files) or not any("/torch/" in f for f in files):
        pytest.skip("torch and vLLM are not installed in this venv (make install-vllm)")
    from docker.types import Mount

    mounts = [Mount(m.target, m.source, type="bind", read_only=True) for m in host_python_mounts()]
    out = docker_client.containers.run(
        TEST_IMAGE, ["ldd", *files], mounts=mounts, remove=True, stdout=True, stderr=True
    ).decode()
    inside = unresolved(out)
    # vLLM's modules find libtorch through the already-imported torch, not the loader path: those are
    # "not found" for ldd on the host too, and are not something the image lacks
    on_host = unresolved(subprocess.run(["ldd", *files], capture_output=True, text=True).stdout)
    missing = {f: sorted(libs - on_host.get(f, set())) for f, libs in inside.items()}
    missing = {f: libs for f, libs in missing.items() if libs}
    assert not missing, (
        f"libraries missing from {TEST_IMAGE} (add their packages to scripts/test-image.sh): {missing}"
    )
    assert out.count("libc.so.6") >= len(files) - 1  # ldd really ran on them


def unresolved(ldd_output: str) -> dict[str, set[str]]:
    """file -> libraries `ldd` could not find, from its multi-file output."""
    found: dict[str, set[str]] = {}
    current = "?"
    for line in ldd_output.splitlines():
        if not line.startswith("\t"):
            current = line.rstrip(":")
        elif "not found" in line:
            found.setdefault(current, set()).add(line.split("=>")[0].strip())
    return found
