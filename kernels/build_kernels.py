"""Compile the EXL3 CUDA kernels with nvcc alone and summarise ptxas' resource report (``make kernels``).

Why a standalone build: CI and the Docker image must prove the kernels compile for the GB10 (sm_121) and the
H200 used for checks (sm_90) without torch or a GPU. The torch extension (sparkctl_exl3/cuda.py) compiles the same
sources on the GPU machine; this script is the quick, torch-free gate in front of it.

    python3 kernels/build_kernels.py [--arch sm_90 --arch sm_121] [--out kernels/build/nvcc] [--allow-spills]

Prints one line per kernel and architecture (registers, spill bytes, stack, static shared memory) and exits
non-zero when nvcc fails or, unless --allow-spills, when any kernel spills registers to local memory.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

KERNELS_DIR = Path(__file__).resolve().parent
CSRC = KERNELS_DIR / "csrc"
DEFAULT_ARCHS = ("sm_90", "sm_121")
NVCC_FLAGS = ["-std=c++17", "-O3", "-lineinfo", "-Xptxas", "-v"]

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\d+a?)'")
_SPILL = re.compile(
    r"(?P<stack>\d+) bytes stack frame, (?P<st>\d+) bytes spill stores, (?P<ld>\d+) bytes spill loads"
)
_USED = re.compile(r"Used (?P<regs>\d+) registers(?:, used \d+ barriers)?(?:, (?P<smem>\d+) bytes smem)?")
_GEMV = re.compile(r"gemv_kernelILi(?P<k2>\d+)ELi(?P<cb>\d)E")
_GEMV_I8 = re.compile(r"gemv_i8_kernelILi(?P<k2>\d+)ELi(?P<rows>\d)E")
_RECON = re.compile(r"recon_kernelILi(?P<k2>\d+)ELi(?P<cb>\d)E")
_CODEBOOKS = ("3inst", "mcg", "mul1")


@dataclass
class KernelReport:
    source: str
    arch: str
    name: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack: int = 0
    smem: int = 0

    @property
    def label(self) -> str:
        """A readable kernel name: the GEMV's rate and codebook instead of the mangled template."""
        m = _GEMV.search(self.name)
        if m:
            return f"gemv K={_bits(int(m['k2']))} {_CODEBOOKS[int(m['cb'])]}"
        m = _GEMV_I8.search(self.name)
        if m:  # the integer-tensor-core mul1 kernel, one instance per row class: 1, 2, 3-4, 5-8 rows
            return f"gemv-i8 K={_bits(int(m['k2']))} rows<={m['rows']}"
        m = _RECON.search(self.name)
        if m:  # the prefill path's weight reconstruction (exl3_recon.cu)
            return f"recon K={_bits(int(m['k2']))} {_CODEBOOKS[int(m['cb'])]}"
        return _unqualified(self.name)


def _bits(k2: int) -> str:
    return str(k2 // 2) if k2 % 2 == 0 else f"{k2 / 2:.1f}"


def _unqualified(mangled: str) -> str:
    """The last identifier of an Itanium-mangled nested name (_ZN4exl312xprep_kernelE... -> xprep_kernel)."""
    if not mangled.startswith("_ZN"):
        return mangled
    i, last = 3, mangled
    while i < len(mangled) and mangled[i].isdigit():
        j = i
        while j < len(mangled) and mangled[j].isdigit():
            j += 1
        n = int(mangled[i:j])
        last = mangled[j : j + n]
        i = j + n
    return last


def parse_ptxas(text: str, source: str) -> list[KernelReport]:
    """Pull the per-entry resource lines out of nvcc's `-Xptxas -v` output."""
    reports: list[KernelReport] = []
    current: KernelReport | None = None
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            current = KernelReport(source, m["arch"], m["name"])
            reports.append(current)
        elif current is not None and (m := _SPILL.search(line)):
            current.stack, current.spill_stores, current.spill_loads = (
                int(m["stack"]),
                int(m["st"]),
                int(m["ld"]),
            )
        elif current is not None and (m := _USED.search(line)):
            current.registers = int(m["regs"])
            current.smem = int(m["smem"] or 0)
    return reports


def find_nvcc() -> str | None:
    """nvcc from $CUDA_HOME, the PATH, or the usual install location."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = [Path(cuda_home) / "bin" / "nvcc"] if cuda_home else []
    on_path = shutil.which("nvcc")
    if on_path:
        candidates.append(Path(on_path))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    return next((str(c) for c in candidates if c.is_file()), None)


def compile_one(
    nvcc: str, source: Path, arch: str, out_dir: Path, extra: tuple[str, ...] = ()
) -> tuple[int, str, Path]:
    obj = out_dir / arch / (source.stem + ".o")
    obj.parent.mkdir(parents=True, exist_ok=True)
    cmd = [nvcc, *NVCC_FLAGS, *extra, f"-arch={arch}", "-I", str(CSRC), "-c", str(source), "-o", str(obj)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr, obj


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--arch", action="append", help="target, e.g. sm_121 (repeatable; default sm_90 and sm_121)"
    )
    ap.add_argument("--out", default=str(KERNELS_DIR / "build" / "nvcc"), help="object directory")
    ap.add_argument("--allow-spills", action="store_true", help="do not fail when a kernel spills registers")
    ap.add_argument("--quiet", action="store_true", help="print only the summary line")
    ap.add_argument(
        "--ab-paths",
        action="store_true",
        help="also compile the bench-only A/B paths (-DEXL3_AB_PATHS: mul1 through the fp16 kernel, the integer "
        "kernel's x' kernel), as kernels/bench/run.py's build has them",
    )
    args = ap.parse_args(argv)
    nvcc = find_nvcc()
    if nvcc is None:
        print("error: nvcc not found (install the CUDA toolkit or set CUDA_HOME)", file=sys.stderr)
        return 2
    archs = args.arch or list(DEFAULT_ARCHS)
    sources = sorted(CSRC.glob("*.cu"))
    if not sources:
        print(f"error: no .cu files in {CSRC}", file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    jobs = [(src, arch) for src in sources for arch in archs]
    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), os.cpu_count() or 1))) as pool:
        extra = ("-DEXL3_AB_PATHS",) if args.ab_paths else ()
        results = list(pool.map(lambda job: compile_one(nvcc, job[0], job[1], out_dir, extra), jobs))

    failed = False
    reports: list[KernelReport] = []
    for (src, arch), (rc, output, obj) in zip(jobs, results, strict=True):
        if rc != 0:
            failed = True
            print(f"error: nvcc failed for {src.name} ({arch}):\n{output}", file=sys.stderr)
            continue
        found = parse_ptxas(output, src.name)
        if not found and "__global__" in src.read_text():  # a host-only source (the planner) has no report
            failed = True
            print(f"error: no ptxas report for {src.name} ({arch}); output was:\n{output}", file=sys.stderr)
        reports.extend(found)
        if not args.quiet:
            print(f"built {obj} ({arch})")

    spills = [r for r in reports if r.spill_stores or r.spill_loads]
    if not args.quiet:
        print(f"\n{'arch':7} {'kernel':22} {'regs':>4} {'spill st/ld':>11} {'stack':>5} {'smem':>5}")
        for r in sorted(reports, key=lambda r: (r.arch, r.label)):
            flag = "  <-- spills" if (r.spill_stores or r.spill_loads) else ""
            print(
                f"{r.arch:7} {r.label:22} {r.registers:4d} {r.spill_stores:5d}/{r.spill_loads:<5d} "
                f"{r.stack:5d} {r.smem:5d}{flag}"
            )
    by_arch = {a: [r for r in reports if r.arch == a] for a in archs}
    summary = ", ".join(
        f"{a}: {len(rs)} kernels, max {max((r.registers for r in rs), default=0)} regs"
        for a, rs in by_arch.items()
    )
    print(f"kernels: {summary}; {len(spills)} spilling")
    if spills and not args.allow_spills:
        print("error: register spills (see above); pass --allow-spills to accept them", file=sys.stderr)
        return 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
