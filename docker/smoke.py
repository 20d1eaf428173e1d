"""Build-time self-test of the serving image (run by docker/Dockerfile after installing sparkctl).

Fails the build, with the reason, if vLLM would not load our plugin, lacks a model class the recipes
need (SPARKCTL_REQUIRED_ARCHS), the EXL3 kernels were not compiled into the image, or their machine code
lacks the GPU architecture the image is for (SPARKCTL_KERNEL_ARCHS, read with `cuobjdump --list-elf`):
catching that at build time beats finding it 12 minutes into a model load.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from importlib.metadata import entry_points

EXPECTED_PLUGIN = "sparkctl_exl3.vllm_plugin:register"


def main() -> int:
    plugins = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    if plugins.get("exl3") != EXPECTED_PLUGIN:
        print(
            f"smoke: vllm.general_plugins has no exl3 = {EXPECTED_PLUGIN} (found {plugins})", file=sys.stderr
        )
        return 1
    import sparkctl_exl3.cuda as cuda
    import sparkctl_exl3.vllm_plugin  # noqa: F401  (what vLLM imports in every process)

    required = os.environ.get("SPARKCTL_REQUIRED_ARCHS", "").split()
    if required:
        from vllm import ModelRegistry

        missing = sorted(set(required) - set(ModelRegistry.get_supported_archs()))
        if missing:
            print(f"smoke: this vLLM has no model class {', '.join(missing)}", file=sys.stderr)
            return 1
    try:
        # Loads the build the Dockerfile just made (no compile: the sources are unchanged); a failure
        # here is exactly what a server would hit when it first calls the kernels.
        module = cuda.build()
    except Exception as exc:
        print(f"smoke: the EXL3 kernels do not load: {exc}", file=sys.stderr)
        return 1
    sass = []
    for arch in os.environ.get("SPARKCTL_KERNEL_ARCHS", "").split():
        tool = shutil.which("cuobjdump")
        if tool is None:
            print("smoke: no cuobjdump on PATH to read the kernels' machine code", file=sys.stderr)
            return 1
        elves = subprocess.run([tool, "--list-elf", str(module.__file__)], capture_output=True, text=True)
        if f".{arch}." not in elves.stdout:
            print(
                f"smoke: {module.__file__} has no {arch} code ({elves.stdout.strip() or elves.stderr.strip()})",
                file=sys.stderr,
            )
            return 1
        sass.append(arch)
    print(
        f"smoke: plugin {plugins['exl3']}, EXL3 kernels {module.__file__}, SASS {' '.join(sass) or 'not checked'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
