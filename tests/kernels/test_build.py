"""The EXL3 CUDA kernels compile with the host nvcc for the GB10 (sm_121) and the H200 (sm_90), without spills.

Runs the same build as `make kernels` (kernels/build_kernels.py). The kernels' numerical checks need a GPU and live
in kernels/bench/run.py (results in kernels/PERF.md); here we prove the build and the Python face of the loader on a
machine without one.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sparkctl_exl3 import cuda

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "kernels"


def _load_build_module():
    spec = importlib.util.spec_from_file_location("build_kernels", KERNELS / "build_kernels.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["build_kernels"] = module  # dataclasses look their module up there
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


build_kernels = _load_build_module()
NVCC = build_kernels.find_nvcc()

# The rates x codebooks of the shape rule: K 1..8 with 3inst/mcg/mul1, and 1.5/2.5/3.5 with mul1.
EVERY_RATE = {f"gemv K={k} {cb}" for k in range(1, 9) for cb in ("3inst", "mcg", "mul1")} | {
    f"gemv K={k} mul1" for k in ("1.5", "2.5", "3.5")
}
# The fp16 GEMV's instances in the product build: 3inst and mcg; mul1 runs through the integer kernel below, and
# mul1 through the fp16 kernel is a bench-only A/B path (EXL3_AB_PATHS, kernels/csrc/exl3_gemv.cu).
EXPECTED_GEMV = {label for label in EVERY_RATE if not label.endswith("mul1")}
# mul1 (1 to 8 rows) also runs through the integer-tensor-core kernel, one instance per rate and row class (one
# row; 2 and 3-4 rows on one column group; 5-8 rows on two)
EXPECTED_GEMV_I8 = {
    f"gemv-i8 K={k} rows<={r}"
    for k in ("1", "1.5", "2", "2.5", "3", "3.5", "4", "5", "6", "7", "8")
    for r in (1, 2, 4, 8)
}

# The prefill path's reconstruction (exl3_recon.cu): the same rates and codebooks as the GEMV's shape rule
EXPECTED_RECON = {label.replace("gemv", "recon", 1) for label in EVERY_RATE}


def _load_bench_module(name: str):
    spec = importlib.util.spec_from_file_location(name, KERNELS / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_the_benches_read_the_rates_the_kernels_compile() -> None:
    """The one list of compiled rates (EXL3_RATES in csrc/exl3_common.cuh), as the Python benches read it, is the
    set of rates and codebooks the shape rule takes (EVERY_RATE above, written out by hand), in the benches' order."""
    rates = _load_bench_module("compiled_rates")
    labels = {f"gemv K={build_kernels._bits(k2)} {cb}" for k2, cb in rates.pairs()}
    assert labels == EVERY_RATE
    assert rates.rates_k2() == (2, 4, 6, 8, 10, 12, 14, 16, 3, 5, 7)
    assert rates.codebooks(5) == ("mul1",) and rates.codebooks(9) == ()


def test_a_header_the_rate_parser_cannot_read_is_an_error(tmp_path: Path) -> None:
    rates = _load_bench_module("compiled_rates")
    bad = tmp_path / "exl3_common.cuh"
    bad.write_text("#define EXL3_RATES(X) \\\n  X(2, 1) RATE(4)\n")
    with pytest.raises(ValueError, match="X\\(k2, 0 or 1\\) entries only"):
        rates.compiled_rates(bad)
    bad.write_text("// no list here\n")
    with pytest.raises(ValueError, match="no '#define EXL3_RATES"):
        rates.compiled_rates(bad)


@pytest.fixture(scope="module")
def nvcc_build(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    if NVCC is None:
        pytest.skip("nvcc not found: the CUDA kernels cannot be compiled on this machine")
    out = tmp_path_factory.mktemp("nvcc")
    proc = subprocess.run(
        [sys.executable, str(KERNELS / "build_kernels.py"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"make kernels failed:\n{proc.stdout}\n{proc.stderr}"
    return out, proc.stdout


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_121"])
def test_kernels_compile_without_spills(nvcc_build: tuple[Path, str], arch: str) -> None:
    out, stdout = nvcc_build
    objects = sorted((out / arch).glob("*.o"))
    assert [o.stem for o in objects] == sorted(p.stem for p in (KERNELS / "csrc").glob("*.cu"))
    assert all(o.stat().st_size > 0 for o in objects)
    rows = [line.split() for line in stdout.splitlines() if line.startswith(arch)]
    labels = {" ".join(r[1:4]) for r in rows if r[1] == "gemv"}
    assert labels == EXPECTED_GEMV
    labels_i8 = {" ".join(r[1:4]) for r in rows if r[1] == "gemv-i8"}
    assert labels_i8 == EXPECTED_GEMV_I8
    labels_recon = {" ".join(r[1:4]) for r in rows if r[1] == "recon"}
    assert labels_recon == EXPECTED_RECON
    for r in rows:
        assert r[-3] == "0/0", f"{arch} {' '.join(r)}: register spills"
        assert 0 < int(r[-4]) <= 255, f"{arch} {' '.join(r)}: register count"
    assert "0 spilling" in stdout


@pytest.mark.slow
def test_bench_drivers_compile(tmp_path: Path) -> None:
    """The torch-free device drivers (A/B timing of the GEMV and of the reconstruction, phase timing, pipe rates) still build against the kernel source:
    they are only run on the GPU machine, where a broken one would cost device time to find out."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    bench = KERNELS / "bench"
    jobs = [
        ("ab_time.cu", []),
        ("phase_timing.cu", []),
        ("phase_timing.cu", ["-DEXL3_TIMING_GT"]),
        ("pipes.cu", []),
        ("recon_ab.cu", []),
    ]
    procs = [
        subprocess.Popen(
            [
                NVCC,
                "-std=c++17",
                "-O1",
                "-arch=sm_90",
                f"-I{KERNELS / 'csrc'}",
                *flags,
                "-c",
                str(bench / name),
                "-o",
                str(tmp_path / f"{i}-{name}.o"),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i, (name, flags) in enumerate(jobs)
    ]
    for (name, _), proc in zip(jobs, procs, strict=True):
        out, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, f"{name} does not compile:\n{out}"


@pytest.mark.slow
def test_build_reports_compile_errors(tmp_path: Path) -> None:
    """A broken kernel must fail the build with nvcc's message, not pass silently."""
    if NVCC is None:
        pytest.skip("nvcc not found")
    bad = tmp_path / "broken.cu"
    bad.write_text("__global__ void k() { this_is_not_defined(); }\n")
    rc, output, _ = build_kernels.compile_one(NVCC, bad, "sm_90", tmp_path / "out")
    assert rc != 0 and "this_is_not_defined" in output


def test_parse_ptxas_report() -> None:
    text = (
        "ptxas info    : Compiling entry function '_ZN4exl311gemv_kernelILi5ELi2EEEvNS_10KernelArgsE' for 'sm_121'\n"
        "ptxas info    : Function properties for _ZN4exl311gemv_kernelILi5ELi2EEEvNS_10KernelArgsE\n"
        "    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n"
        "ptxas info    : Used 72 registers, used 1 barriers, 16 bytes smem\n"
        "ptxas info    : Compiling entry function '_ZN4exl312xprep_kernelEPK6__halfS2_Pjii' for 'sm_121'\n"
        "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
        "ptxas info    : Used 25 registers, used 0 barriers\n"
    )
    gemv, prep = build_kernels.parse_ptxas(text, "exl3_gemv.cu")
    assert (
        gemv.label,
        gemv.arch,
        gemv.registers,
        gemv.spill_stores,
        gemv.spill_loads,
        gemv.stack,
        gemv.smem,
    ) == (
        "gemv K=2.5 mul1",
        "sm_121",
        72,
        4,
        12,
        8,
        16,
    )
    assert (prep.label, prep.registers, prep.smem) == ("xprep_kernel", 25, 0)


# ----------------------------------------------------------------------------------------------------------------
# The loader's behaviour where there is no GPU (every CI machine): unavailable with a reason, never a crash.
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_loader_without_gpu_is_unavailable_with_reason() -> None:
    assert cuda.available() is False
    assert "CUDA" in (cuda.unavailable_reason() or "")
    x = torch.zeros(1, 128, dtype=torch.float16)
    trellis = torch.zeros(8, 8, 32, dtype=torch.int16)
    suh, svh = torch.ones(128, dtype=torch.float16), torch.ones(128, dtype=torch.float16)
    assert cuda.supports(x, trellis, suh, svh, 2) is False  # CPU tensors never go to the kernel
    with pytest.raises(RuntimeError, match="unavailable"):
        cuda.gemv(x, trellis, suh, svh, 2)


# The GEMV's objects, linked together: the planner (exl3_plan.cu, the C ABI) and the kernel families it plans for
# (exl3_gemv_i8.cu compiles the fused MoE's exl3_moe.cuh too).
GEMV_OBJECTS = ("exl3_plan", "exl3_gemv", "exl3_gemv_i8")

# The status codes of kernels/csrc/exl3_gemv.h (Exl3GemvStatus).
EXL3_OK, EXL3_ERR_ROWS, EXL3_ERR_SHAPE, EXL3_ERR_BITS, EXL3_ERR_CODEBOOK = 0, 1, 2, 3, 4

_RULE_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include "exl3_gemv.h"
int main(int argc, char** argv) {  // m I O k2 codebook, repeated: one status per case
  for (int i = 1; i + 4 < argc; i += 5)
    printf("%d\n", exl3_gemv_supports(atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3]),
                                      atoi(argv[i + 4])));
  return 0;
}
"""


@pytest.mark.slow
def test_the_one_shape_rule(nvcc_build: tuple[Path, str], tmp_path: Path) -> None:
    """exl3_gemv_supports, the rule the binding, the ops (through cuda.supports) and the bench all ask, run on the
    host from the built object (it touches no device, so it runs here)."""
    out, _ = nvcc_build
    main = tmp_path / "rule.cpp"
    main.write_text(_RULE_MAIN)
    prog = tmp_path / "rule"
    link = subprocess.run(
        [
            NVCC,
            "-std=c++17",
            f"-I{KERNELS / 'csrc'}",
            str(main),
            *(str(out / "sm_90" / f"{name}.o") for name in GEMV_OBJECTS),
            "-o",
            str(prog),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert link.returncode == 0, link.stdout + link.stderr
    cases = {
        (1, 256, 384, 8, 2): EXL3_OK,  # 4 bits mul1
        (8, 256, 384, 16, 0): EXL3_OK,  # 8 bits 3inst, the most rows
        (3, 256, 384, 2, 1): EXL3_OK,  # 1 bit mcg
        (1, 256, 384, 5, 2): EXL3_OK,  # 2.5 bits: mul1 ...
        (1, 256, 384, 5, 0): EXL3_ERR_CODEBOOK,  # ... only
        (1, 256, 384, 7, 2): EXL3_OK,  # 3.5 bits mul1
        (1, 256, 384, 9, 2): EXL3_ERR_BITS,  # 4.5 bits: not a rate
        (9, 256, 384, 8, 2): EXL3_ERR_ROWS,  # more than 8 rows per launch: the binding groups them
        (0, 256, 384, 8, 2): EXL3_ERR_ROWS,
        (1, 64, 384, 8, 2): EXL3_ERR_SHAPE,  # I = 64 is not a multiple of 128
        (1, 256, 200, 8, 2): EXL3_ERR_SHAPE,
        (1, 256, 384, 18, 2): EXL3_ERR_BITS,  # 9 bits
        (1, 256, 384, 1, 2): EXL3_ERR_BITS,  # 0.5 bits
        (1, 256, 384, 8, 3): EXL3_ERR_CODEBOOK,
    }
    args = [str(v) for case in cases for v in case]
    proc = subprocess.run([str(prog), *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert dict(zip(cases, map(int, proc.stdout.split()), strict=True)) == cases


def test_supports_is_false_without_the_kernels() -> None:
    """cuda.supports asks the kernel's rule; where the kernels cannot run it takes nothing (the ops then use the
    reference), whatever the shape."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")

    class FakeCuda:
        def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
            self.shape, self.dtype, self.is_cuda = shape, dtype, True

        def dim(self) -> int:
            return len(self.shape)

        def numel(self) -> int:
            n = 1
            for s in self.shape:
                n *= s
            return n

    f16, i16 = torch.float16, torch.int16
    x, trellis = FakeCuda((1, 256), f16), FakeCuda((16, 24, 64), i16)
    assert cuda.supports(x, trellis, FakeCuda((256,), f16), FakeCuda((384,), f16), 2) is False


def test_tuning_refuses_unknown_fields() -> None:
    with pytest.raises(ValueError, match="unknown tuning field"):
        cuda.set_tuning(mul1_path=1)


@pytest.mark.slow
def test_bench_refuses_without_gpu() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    proc = subprocess.run(
        [sys.executable, str(KERNELS / "bench" / "run.py"), "--skip-bench"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "no CUDA device" in proc.stderr


@pytest.mark.slow
def test_the_build_command_explains_itself_and_rejects_anything_else() -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "sparkctl_exl3.cuda", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120)

    helped = run("--help")
    assert helped.returncode == 0, helped.stderr
    assert "usage: python -m sparkctl_exl3.cuda build" in helped.stdout and "compile" in helped.stdout
    wrong = run("bogus")
    assert wrong.returncode == 2 and "usage: python -m sparkctl_exl3.cuda build" in wrong.stderr


# The prefill path's statuses: exl3_gemv.h's codes plus EXL3_RECON_ERR_COLUMNS (exl3_recon.h)
EXL3_ERR_ALIGN, EXL3_RECON_ERR_COLUMNS = 6, 32

_RECON_MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include "exl3_recon.h"
// argv: I O k2 codebook col0 cols ldw null_trellis, repeated: one "status|message" line per case
int main(int argc, char** argv) {
  static short trellis_buf[64] __attribute__((aligned(16)));
  static short half_buf[64] __attribute__((aligned(16)));
  for (int i = 1; i + 7 < argc; i += 8) {
    Exl3ReconLayer l = {atoi(argv[i + 7]) ? nullptr : trellis_buf, half_buf, half_buf, half_buf};
    Exl3ReconParams p = {&l, 1, atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]), atoi(argv[i + 3]),
                         atoi(argv[i + 4]), atoi(argv[i + 5]), atoll(argv[i + 6])};
    const int st = exl3_recon_launch(&p, 0);
    printf("%d|%s\n", st, exl3_recon_error_string(st));
  }
  printf("supports %d %d\n", exl3_recon_supports(256, 384, 5, 2), exl3_recon_supports(256, 384, 5, 0));
  return 0;
}
"""


@pytest.mark.slow
def test_reconstruction_refuses_bad_launches_on_the_host(
    nvcc_build: tuple[Path, str], tmp_path: Path
) -> None:
    """exl3_recon_launch checks the shape rule (the GEMV's), the column range and the pointers before it touches
    the device, with its own one-line messages; run on the host from the built objects."""
    out, _ = nvcc_build
    main = tmp_path / "recon.cpp"
    main.write_text(_RECON_MAIN)
    prog = tmp_path / "recon"
    objs = [str(out / "sm_90" / f"{name}.o") for name in ("exl3_recon", *GEMV_OBJECTS)]
    link = subprocess.run(
        [NVCC, "-std=c++17", f"-I{KERNELS / 'csrc'}", str(main), *objs, "-o", str(prog)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert link.returncode == 0, link.stdout + link.stderr
    cases = [
        ((256, 200, 8, 2, 0, 128, 200, 0), (EXL3_ERR_SHAPE, "multiples of 128")),
        ((256, 384, 9, 2, 0, 384, 384, 0), (EXL3_ERR_BITS, "1..8 bits per weight")),
        ((256, 384, 5, 1, 0, 384, 384, 0), (EXL3_ERR_CODEBOOK, "half-integer rates need mul1")),
        ((256, 384, 8, 2, 64, 128, 384, 0), (EXL3_RECON_ERR_COLUMNS, "col0 and cols multiples of 128")),
        ((256, 384, 8, 2, 256, 256, 384, 0), (EXL3_RECON_ERR_COLUMNS, "col0 + cols <= out_features")),
        ((256, 384, 8, 2, 0, 384, 383, 0), (EXL3_RECON_ERR_COLUMNS, "even row stride")),
        ((256, 384, 8, 2, 0, 384, 384, 1), (EXL3_ERR_ALIGN, "none missing")),
    ]
    args = [str(v) for case, _ in cases for v in case]
    proc = subprocess.run([str(prog), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == len(cases) + 1, proc.stdout
    for (case, want), line in zip(cases, lines, strict=False):
        status, message = line.split("|", 1)
        assert (int(status), want[1] in message) == (want[0], True), (case, line)
    assert lines[-1] == f"supports {EXL3_OK} {EXL3_ERR_CODEBOOK}"


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_121"])
def test_ngram_lookup_kernel_is_built(nvcc_build: tuple[Path, str], arch: str) -> None:
    """`make kernels` builds the n-gram (PLE) lookup kernel too (its spills are checked with the others above)."""
    _, stdout = nvcc_build
    assert any(line.split()[:2] == [arch, "ngram_lookup_kernel"] for line in stdout.splitlines())


_SASS = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]
host = linux
compile_size = 64bit

\tcode for sm_90
\t\tFunction : _ZN4exl3_a
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;                 /* 0x00000a00ff017b82 */
        /*0010*/                   EXIT ;                                 /* 0x000000000000794d */
\t\t..........


\t\tFunction : _ZN4exl3_b
\t.headerflags\t@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   EXIT ;                                 /* 0x000000000000794d */
\t\t..........
"""


def test_sass_diff_compares_kernel_by_kernel() -> None:
    """kernels/bench/sass_diff.py (the refactor check of kernels/PERF.md) splits cuobjdump's listing per kernel
    symbol and tells identical, changed, removed and new kernels apart, wherever each kernel's file is."""
    sd = _load_bench_module("sass_diff")
    before = sd.split_functions(_SASS)
    assert sorted(before) == ["_ZN4exl3_a", "_ZN4exl3_b"]
    assert "LDC R1" in before["_ZN4exl3_a"] and "LDC" not in before["_ZN4exl3_b"]
    after = {"_ZN4exl3_a": before["_ZN4exl3_a"], "_ZN4exl3_b": before["_ZN4exl3_b"].replace("EXIT", "BRA")}
    after["_ZN4exl3_c"] = "EXIT ;"
    del after["_ZN4exl3_a"]
    assert sd.compare(before, after) == (["_ZN4exl3_b"], ["_ZN4exl3_a"], ["_ZN4exl3_c"], 0)
    assert sd.compare(before, dict(before)) == ([], [], [], 2)
