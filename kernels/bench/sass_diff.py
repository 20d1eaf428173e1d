"""Compare the SASS of every kernel between two versions of ``kernels/csrc``, kernel by kernel.

Why: a change meant as a refactor (moving code between files, sharing helpers, host-side clean-ups) must leave the
machine code of the kept kernels exactly as it was, so that every timing in kernels/PERF.md still holds without a
GPU run. This tool proves it on a machine without a GPU: it compiles every ``.cu`` of both trees for each
architecture with ``make kernels``' flags (``nvcc -cubin``), disassembles them with ``cuobjdump -sass`` and compares
each kernel symbol's listing (instruction words included, so register allocation and scheduling bits count), wherever
the kernel's source file now lives.

    python3 kernels/bench/sass_diff.py BEFORE [AFTER] [--arch sm_90 --arch sm_121] [--define EXL3_AB_PATHS]

BEFORE and AFTER are git revisions (``main``, ``HEAD~3``, a commit) or folders holding the kernel sources; AFTER
defaults to the working tree's ``kernels/csrc``. ``--define NAME`` compiles AFTER with ``-DNAME`` (the bench build's
``EXL3_AB_PATHS``: a build with it must hold every kernel of BEFORE, unchanged). Cubins are cached under ``kernels/build/sass/`` by the sources'
content, nvcc's version, the flags and the architecture, so a baseline compiles once. Prints one line per
architecture and one per kernel that differs, appeared or went away; exits 0 when every kernel present in both is
identical and none is new, 1 otherwise, 2 when nvcc or cuobjdump is missing or a compile fails.

cuobjdump is not part of nvcc's pip-less install here: ``pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm``
(the tool looks in ``$CUOBJDUMP``, on the PATH, and in the running Python's ``nvidia/cu13/bin``).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

KERNELS = Path(__file__).resolve().parents[1]
ROOT = KERNELS.parent
CSRC = KERNELS / "csrc"
CACHE = KERNELS / "build" / "sass"
DEFAULT_ARCHS = ("sm_90", "sm_121")
# `make kernels`' flags (build_kernels.NVCC_FLAGS) less the resource report, which changes no instruction
FLAGS = ["-std=c++17", "-O3", "-lineinfo"]
SOURCE_SUFFIXES = (".cu", ".cuh", ".h")
MAX_LISTED = 40  # kernels named per category and architecture


class Failure(Exception):
    """A tree, a compile or a disassembly that could not be had: one line, exit 2."""


_FUNCTION = re.compile(r"^\s*Function : (?P<name>\S+)\s*$")


def split_functions(sass: str) -> dict[str, str]:
    """cuobjdump -sass output -> {symbol: listing}. A listing's addresses are relative to its function's start and
    its spacing is normalised, so the same code compiled in another file or another order gives the same text."""
    functions: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in sass.splitlines():
        if m := _FUNCTION.match(line):
            current = functions.setdefault(m["name"], [])
        elif current is not None:
            if line.strip().startswith((".section", "Fatbin", "=====", "code for", "arch =", "host =")):
                current = None
                continue
            current.append(" ".join(line.split()))  # cuobjdump pads columns to the file's longest line
    return {name: "\n".join(lines).strip() for name, lines in functions.items()}


def compare(before: dict[str, str], after: dict[str, str]) -> tuple[list[str], list[str], list[str], int]:
    """(differing, removed, added, identical count) between two {symbol: listing} maps."""
    common = sorted(before.keys() & after.keys())
    differing = [name for name in common if before[name] != after[name]]
    return (
        differing,
        sorted(before.keys() - after.keys()),
        sorted(after.keys() - before.keys()),
        len(common) - len(differing),
    )


def find_cuobjdump() -> str | None:
    candidates = [os.environ.get("CUOBJDUMP", ""), shutil.which("cuobjdump") or ""]
    spec = importlib.util.find_spec("nvidia")
    for base in list(spec.submodule_search_locations or []) if spec else []:
        candidates.append(str(Path(base) / "cu13" / "bin" / "cuobjdump"))
    return next((c for c in candidates if c and Path(c).is_file()), None)


def find_nvcc() -> str | None:
    spec = importlib.util.spec_from_file_location("build_kernels", KERNELS / "build_kernels.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("build_kernels", module)
    spec.loader.exec_module(module)
    return module.find_nvcc()


def materialise(tree: str, scratch: Path) -> Path:
    """A folder holding the kernel sources of `tree`: the folder itself, or `git archive` of a revision."""
    path = Path(tree)
    if path.is_dir():
        found = next(
            (d for d in (path, path / "csrc", path / "kernels" / "csrc") if any(d.glob("*.cu"))), None
        )
        if found is None:
            raise Failure(f"error: no .cu files in {path}, {path / 'csrc'} or {path / 'kernels' / 'csrc'}")
        return found
    out = scratch / re.sub(r"[^A-Za-z0-9_.-]", "_", tree)
    out.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", tree, "kernels/csrc"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        raise Failure(
            f"error: {tree!r} is neither a folder nor a git revision: {archive.stderr.decode().strip()}"
        )
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "kernels" / "csrc"


def tree_key(csrc: Path, nvcc_version: str, arch: str, defines: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for part in (nvcc_version, arch, *FLAGS, *(f"-D{d}" for d in defines)):
        h.update(part.encode() + b"\0")
    for f in sorted(p for p in csrc.iterdir() if p.suffix in SOURCE_SUFFIXES):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:20]


def sass_of(
    nvcc: str, cuobjdump: str, csrc: Path, arch: str, nvcc_version: str, defines: Sequence[str] = ()
) -> dict[str, str]:
    """{kernel symbol: listing} over every .cu of `csrc` for `arch` (compiled once per content, then cached)."""
    cached = CACHE / tree_key(csrc, nvcc_version, arch, defines)
    cached.mkdir(parents=True, exist_ok=True)
    kernels: dict[str, str] = {}
    for source in sorted(csrc.glob("*.cu")):
        text = cached / f"{source.stem}.sass"
        if not text.is_file():
            cubin = cached / f"{source.stem}.cubin"
            cmd = [
                nvcc,
                *FLAGS,
                *(f"-D{d}" for d in defines),
                f"-arch={arch}",
                "-cubin",
                "-I",
                str(csrc),
                str(source),
                "-o",
                str(cubin),
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise Failure(f"error: nvcc failed for {source} ({arch}):\n{proc.stdout}{proc.stderr}")
            dump = subprocess.run(
                [cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=False
            )
            if dump.returncode != 0:
                raise Failure(f"error: cuobjdump failed for {cubin}: {dump.stderr.strip()}")
            tmp = text.with_suffix(".tmp")
            tmp.write_text(dump.stdout)
            tmp.replace(text)
            cubin.unlink()  # the listing is what is compared; the cubin is tens of MB
        for name, listing in split_functions(text.read_text()).items():
            if name in kernels:
                raise Failure(f"error: {name} is compiled in two files of {csrc}")
            kernels[name] = listing
    return kernels


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", help="git revision or folder of the sources before the change")
    ap.add_argument(
        "after", nargs="?", default=str(CSRC), help="the same after it (default: the working tree)"
    )
    ap.add_argument(
        "--arch", action="append", help="target, e.g. sm_121 (repeatable; default sm_90 and sm_121)"
    )
    ap.add_argument("--define", action="append", default=[], help="compile AFTER with -DNAME (repeatable)")
    args = ap.parse_args(argv)
    nvcc, cuobjdump = find_nvcc(), find_cuobjdump()
    if nvcc is None:
        print("error: nvcc not found (install the CUDA toolkit or set CUDA_HOME)", file=sys.stderr)
        return 2
    if cuobjdump is None:
        print(
            "error: cuobjdump not found: pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (or set CUOBJDUMP)",
            file=sys.stderr,
        )
        return 2
    try:
        changed = _diff(args.before, args.after, args.arch or DEFAULT_ARCHS, nvcc, cuobjdump, args.define)
        return 1 if changed else 0
    except Failure as exc:
        print(exc, file=sys.stderr)
        return 2


def _diff(
    before_tree: str,
    after_tree: str,
    archs: Sequence[str],
    nvcc: str,
    cuobjdump: str,
    defines: Sequence[str] = (),
) -> bool:
    """Prints the comparison per architecture; True when a kept kernel changed or a kernel is new."""
    # cuobjdump -sass runs nvdisasm from its own folder or the PATH
    os.environ["PATH"] = f"{Path(cuobjdump).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    nvcc_version = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    failed = False
    with tempfile.TemporaryDirectory() as scratch:
        before_dir = materialise(before_tree, Path(scratch) / "before")
        after_dir = materialise(after_tree, Path(scratch) / "after")
        for arch in archs:
            before = sass_of(nvcc, cuobjdump, before_dir, arch, nvcc_version)
            after = sass_of(nvcc, cuobjdump, after_dir, arch, nvcc_version, defines)
            differing, removed, added, same = compare(before, after)
            lines = sum(listing.count("\n") + 1 for listing in after.values())
            print(
                f"{arch}: {same} kernels identical, {len(differing)} differ, {len(removed)} removed, "
                f"{len(added)} new ({lines} lines of SASS after)"
            )
            for label, names in (("differs", differing), ("removed", removed), ("new", added)):
                for name in names[:MAX_LISTED]:
                    print(f"  {label + ':':8} {name}")
                if len(names) > MAX_LISTED:
                    print(f"  ... and {len(names) - MAX_LISTED} more {label}")
            failed = failed or bool(differing or added)
    return failed


if __name__ == "__main__":
    sys.exit(main())
