"""The ``sparkctl_exl3`` custom ops: they equal the reference, their fake implementations agree with the real
ones (opcheck), they trace under torch.compile(fullgraph=True), and they dispatch CUDA inputs correctly."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
from sparkctl_exl3 import ops
from sparkctl_exl3 import reference as ref
from torch._subclasses.fake_tensor import FakeTensorMode

VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "exl3" / "vectors.safetensors"


def _random_layer(
    tiles_k: int, tiles_n: int, bits: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    trellis = torch.randint(
        -(1 << 15), 1 << 15, (tiles_k, tiles_n, int(16 * bits)), generator=gen, dtype=torch.int32
    ).to(torch.int16)
    suh = (torch.randn(16 * tiles_k, generator=gen) * 0.02).half()
    svh = (torch.randn(16 * tiles_n, generator=gen) * 0.02).half()
    return trellis, suh, svh


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def test_codebook_ids() -> None:
    assert ops.CODEBOOKS == {"3inst": 0, "mcg": 1, "mul1": 2}


@pytest.mark.parametrize("codebook", list(ops.CODEBOOKS))
def test_op_equals_reference_on_cpu(codebook: str) -> None:
    trellis, suh, svh = _random_layer(8, 16, 2.5 if codebook == "mul1" else 3, seed=ops.CODEBOOKS[codebook])
    x = torch.randn(2, 3, 128).half()
    expected = ref.matmul(x, trellis, suh, svh, codebook)
    assert torch.equal(ops.exl3_matmul(x, trellis, suh, svh, codebook), expected)
    assert torch.equal(
        torch.ops.sparkctl_exl3.exl3_gemm(x, trellis, suh, svh, ops.CODEBOOKS[codebook]), expected
    )
    weight = torch.ops.sparkctl_exl3.exl3_weight(trellis, suh, svh, ops.CODEBOOKS[codebook])
    assert torch.equal(weight, ref.weight(trellis, suh, svh, codebook))


def test_op_on_a_real_layer() -> None:
    """One exllamav3-quantized layer end to end through the op, against exllamav3's own forward."""
    if not VECTORS.exists():
        pytest.skip(f"shared EXL3 vectors not found at {VECTORS}")
    from safetensors import safe_open

    with safe_open(str(VECTORS), framework="pt") as f:
        layer = {
            name: f.get_tensor(f"q.mul1.K3.5.{name}")
            for name in ("trellis", "suh", "svh", "mul1", "x8", "y8")
        }
    y = ops.exl3_matmul(layer["x8"], layer["trellis"], layer["suh"], layer["svh"], ref.codebook_of(layer))
    assert _rel(y, layer["y8"]) < 1e-3


def test_had_r_128_op() -> None:
    x = torch.randn(3, 256).half()
    pre, post = torch.randn(256).half(), torch.randn(256).half()
    assert torch.equal(torch.ops.sparkctl_exl3.had_r_128(x, pre, post, 0.5), ref.had_r_128(x, pre, post, 0.5))
    assert torch.equal(torch.ops.sparkctl_exl3.had_r_128(x, None, None, 1.0), ref.had_r_128(x))


def test_opcheck() -> None:
    """Schema, fake implementation and AOT dispatch (with dynamic shapes) agree with the real implementation."""
    trellis, suh, svh = _random_layer(8, 16, 2, seed=5)
    cases = [
        (torch.ops.sparkctl_exl3.exl3_gemm.default, (torch.randn(1, 128).half(), trellis, suh, svh, 0)),
        (torch.ops.sparkctl_exl3.exl3_gemm.default, (torch.randn(2, 7, 128).half(), trellis, suh, svh, 1)),
        (torch.ops.sparkctl_exl3.exl3_gemm.default, (torch.randn(4, 128), trellis, suh, svh, 2)),
        (torch.ops.sparkctl_exl3.exl3_weight.default, (trellis, suh, svh, 1)),
        (torch.ops.sparkctl_exl3.had_r_128.default, (torch.randn(4, 256), torch.randn(256), None, 0.5)),
        (
            torch.ops.sparkctl_exl3.had_r_128.default,
            (torch.randn(2, 128).half(), None, torch.randn(128).half(), 1.0),
        ),
    ]
    for op, args in cases:
        torch.library.opcheck(op, args)


def test_fake_impl_shapes_and_errors() -> None:
    trellis, suh, svh = _random_layer(8, 16, 4, seed=6)
    with FakeTensorMode() as mode:
        fx = mode.from_tensor(torch.randn(5, 128).half())
        ft, fsuh, fsvh = (mode.from_tensor(t) for t in (trellis, suh, svh))
        y = torch.ops.sparkctl_exl3.exl3_gemm(fx, ft, fsuh, fsvh, 2)
        assert y.shape == (5, 256) and y.dtype == torch.float16
        w = torch.ops.sparkctl_exl3.exl3_weight(ft, fsuh, fsvh, 0)
        assert w.shape == (128, 256) and w.dtype == torch.float16
        with pytest.raises(ValueError, match=r"x must have shape \[\.\.\., 128\]"):
            torch.ops.sparkctl_exl3.exl3_gemm(mode.from_tensor(torch.randn(5, 256).half()), ft, fsuh, fsvh, 2)
        with pytest.raises(ValueError, match="unknown codebook_id 7"):
            torch.ops.sparkctl_exl3.exl3_gemm(fx, ft, fsuh, fsvh, 7)


def test_compile_fullgraph() -> None:
    """The op traces as one opaque node (no graph break), with a batch dim that varies without recompiling."""
    trellis, suh, svh = _random_layer(8, 16, 2, seed=7)

    def layer(x: torch.Tensor) -> torch.Tensor:
        return ops.exl3_matmul(x * 2, trellis, suh, svh, "mul1") + 1

    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend="aot_eager")
    for rows in (3, 5):
        x = torch.randn(rows, 128).half()
        assert torch.equal(compiled(x), layer(x))


@pytest.mark.slow
def test_compile_inductor() -> None:
    """One tiny case through inductor, the backend vLLM uses: the op stays an opaque call around fused code."""
    trellis, suh, svh = _random_layer(8, 8, 2, seed=13)

    def layer(x: torch.Tensor) -> torch.Tensor:
        return ops.exl3_matmul(x * 2, trellis, suh, svh, "mcg") + 1

    torch._dynamo.reset()
    x = torch.randn(2, 128).half()
    got = torch.compile(layer, fullgraph=True)(x)
    assert got.shape == (2, 128) and got.dtype == torch.float16
    assert torch.allclose(got.float(), layer(x).float(), rtol=1e-3, atol=1e-3)


def test_wrapper_errors() -> None:
    trellis, suh, svh = _random_layer(8, 8, 2, seed=8)
    x = torch.randn(1, 128).half()
    with pytest.raises(ValueError, match="unknown codebook 'int4'"):
        ops.exl3_matmul(x, trellis, suh, svh, "int4")
    with pytest.raises(TypeError, match="must be a str"):
        ops.exl3_matmul(x, trellis, suh, svh, 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown codebook_id -1"):
        torch.ops.sparkctl_exl3.exl3_gemm(x, trellis, suh, svh, -1)
    with pytest.raises(ValueError, match="multiples of 128"):
        ops.exl3_matmul(
            torch.randn(1, 64).half(), torch.zeros(4, 8, 32, dtype=torch.int16), suh[:64], svh, "mcg"
        )
    with pytest.raises(ValueError, match="half-integer rate"):
        ops.exl3_matmul(x, torch.zeros(8, 8, 40, dtype=torch.int16), suh, svh, "3inst")


# ------------------------------------------------------------------------------------------------
# CUDA dispatch. The real kernel cannot run on a CPU-only machine, so the decision logic is checked here with a
# stand-in module (it records calls and computes through the reference); the real kernel is checked against the
# reference on the device by test_cuda_op_matches_reference and by kernels/bench/run.py.
# ------------------------------------------------------------------------------------------------


@pytest.fixture
def stand_in_kernel(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    calls: list[tuple[int, ...]] = []

    def gemv(
        x: torch.Tensor, trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook_id: int
    ) -> torch.Tensor:
        assert x.dim() == 2 and x.is_contiguous()
        calls.append(tuple(x.shape))
        return ref.matmul(x, trellis, suh, svh, ref.CODEBOOKS[codebook_id])

    def supports(x: torch.Tensor, *_: object) -> bool:  # the rows and dtype part of the kernel's rule
        return 1 <= x.numel() // x.shape[-1] <= 8 and x.dtype == torch.float16

    module = types.SimpleNamespace(available=lambda: True, gemv=gemv, supports=supports, calls=calls)
    monkeypatch.setattr(ops, "_cuda_module", module)
    monkeypatch.setattr(ops, "_cuda_probed", True)
    return module


def test_cuda_dispatch_uses_kernel_for_gemv_rows(stand_in_kernel: types.SimpleNamespace) -> None:
    trellis, suh, svh = _random_layer(8, 16, 4, seed=9)
    x = torch.randn(2, 4, 128).half()  # 8 rows in all: the kernel's range
    y = ops._exl3_gemm_cuda(x, trellis, suh, svh, 1)
    assert stand_in_kernel.calls == [(8, 128)]
    assert y.shape == (2, 4, 256)
    assert torch.equal(y, ref.matmul(x, trellis, suh, svh, "mcg"))


def test_cuda_dispatch_falls_back(stand_in_kernel: types.SimpleNamespace) -> None:
    trellis, suh, svh = _random_layer(8, 16, 4, seed=10)
    ops._exl3_gemm_cuda(torch.randn(9, 128).half(), trellis, suh, svh, 1)  # too many rows for the GEMV
    ops._exl3_gemm_cuda(torch.randn(2, 128), trellis, suh, svh, 1)  # fp32 input
    assert stand_in_kernel.calls == []
    stand_in_kernel.supports = lambda x, *_: x.shape[0] == 9  # the extension's own predicate wins
    ops._exl3_gemm_cuda(torch.randn(9, 128).half(), trellis, suh, svh, 1)
    assert stand_in_kernel.calls == [(9, 128)]


def test_cuda_kernel_probe_without_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """A missing or broken extension means "no kernel", never an import error from the ops."""

    def broken(name: str) -> types.ModuleType:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr(ops, "_cuda_probed", False)
    monkeypatch.setattr(ops, "_cuda_module", None)
    monkeypatch.setattr(ops.importlib, "import_module", broken)
    assert ops.cuda_kernel() is None
    if not torch.cuda.is_available():
        monkeypatch.undo()
        monkeypatch.setattr(ops, "_cuda_probed", False)
        assert ops.cuda_kernel() is None  # whatever sparkctl_exl3.cuda is, without a GPU it is not available


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 8, 33])
def test_cuda_op_matches_reference(rows: int) -> None:
    trellis, suh, svh = _random_layer(16, 24, 4, seed=rows)
    x = torch.randn(rows, 256).half()
    expected = ref.matmul(x, trellis, suh, svh, "mul1")
    y = ops.exl3_matmul(x.cuda(), trellis.cuda(), suh.cuda(), svh.cuda(), "mul1")
    assert _rel(y.cpu(), expected) < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_capture() -> None:
    trellis, suh, svh = (t.cuda() for t in _random_layer(16, 24, 2, seed=12))
    x = torch.randn(1, 256, device="cuda").half()
    expected = ops.exl3_matmul(
        x, trellis, suh, svh, "mcg"
    )  # warm-up: tables and kernels loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ops.exl3_matmul(x, trellis, suh, svh, "mcg")
    x.copy_(torch.randn_like(x))
    graph.replay()
    torch.cuda.synchronize()
    assert _rel(out, ops.exl3_matmul(x, trellis, suh, svh, "mcg")) < 1e-3
    assert not torch.equal(out, expected)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("codebook", ["mul1", "3inst"])  # the integer kernel and the fp16 kernel
@pytest.mark.parametrize("rows", [1, 3, 5])  # mul1: fixed-point, ticket and fenced hand-overs
def test_cuda_split_k_hand_over(codebook: str, rows: int) -> None:
    """Splits of every size on one stream's workspace: each call exact and repeatable, the workspace left zero.

    mul1's fixed-point (1-2 rows) and ticket (3-4 rows) hand-overs keep slots in the workspace that must be zero
    before each call (kernels/csrc/exl3_gemv_device.cuh, fixed_share and take_ticket): a slot a call failed to clear, or a
    stale one read as this call's, shows up as a changed result or a non-zero workspace here. 5 rows and 3INST take
    the fenced hand-over, whose counters must be left zero too.
    """
    from sparkctl_exl3 import cuda

    trellis, suh, svh = _random_layer(64, 32, 3, seed=rows)  # 1024 x 512: 8 input chunks, 4 column chunks
    x = torch.randn(rows, 1024).half()
    expected = ref.matmul(x, trellis, suh, svh, codebook)
    args = (x.cuda(), trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index(codebook))
    first: dict[int, torch.Tensor] = {}
    for ksplit in [1, 2, 8, 3, 2, 8, 4, 1, 3, 4]:
        y = cuda.gemv(*args, ksplit=ksplit)
        assert _rel(y.cpu().float(), expected) < 1e-3, ksplit
        if ksplit in first:
            assert torch.equal(y, first[ksplit]), ksplit
        first.setdefault(ksplit, y)
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream().cuda_stream
    workspace = cuda._workspaces[(torch.cuda.current_device(), stream)]
    assert int(workspace.count_nonzero()) == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("ksplit", [1, 4])
@pytest.mark.parametrize("rows", [1, 3, 8])  # the integer kernel's hand-overs: fixed-point, ticket, fenced
def test_cuda_non_finite_and_overflow(rows: int, ksplit: int) -> None:
    """Outputs that the reference gives as inf or NaN are not finite here either, split or not; other rows are exact.

    The integer kernel quantises x' with a scale per warp: a NaN x' must make that scale NaN, not turn into a
    garbage q (exl3_gemv_i8.cuh, fmax_nan). A split slice that is not finite (or 2^17 or more) cannot join the
    fixed-point sum of its column, so it makes the column NaN there (fixed_share); sums past fp16's range are inf.
    """
    from sparkctl_exl3 import cuda

    trellis, suh, svh = _random_layer(64, 32, 2, seed=51)  # 1024 x 512
    layer = (trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index("mul1"))
    gen = torch.Generator().manual_seed(53)
    x = torch.randn(rows, 1024, generator=gen).half()
    x[0, 300] = float("inf")
    expected = ref.matmul(x, trellis, suh, svh, "mul1").float()
    y = cuda.gemv(x.cuda(), *layer, ksplit=ksplit).cpu().float()
    assert bool(expected[0].isnan().all())
    finite = int(y[0].isfinite().sum())
    assert finite == 0, f"{finite} of 512 columns finite"
    if rows > 1:
        assert _rel(y[1:], expected[1:]) < 1e-3
    # big finite outputs: some columns past 65504 (10 of 512 with one row)
    suh, svh = (suh.float() * 50).half(), (svh.float() * 400).half()
    layer = (trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index("mul1"))
    x = (torch.randn(rows, 1024, generator=gen) * 100).half()
    expected = ref.matmul(x, trellis, suh, svh, "mul1").float()
    y = cuda.gemv(x.cuda(), *layer, ksplit=ksplit).cpu().float()
    assert bool(expected.isinf().any()) and bool(expected.isfinite().any())
    finite = int(y[expected.isinf()].isfinite().sum())
    assert finite == 0, f"{finite} of {int(expected.isinf().sum())} columns past fp16's range finite"
    small = expected.abs() < 60000
    assert _rel(y[small], expected[small]) < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_most_slices() -> None:
    """The integer kernel counts up to 255 slices per column (exl3_gemv_device.cuh, fixed_share); 256 is refused."""
    from sparkctl_exl3 import cuda

    trellis, suh, svh = _random_layer(2048, 8, 2, seed=52)  # 32768 x 128: 256 input chunks
    x = torch.randn(2, 32768).half()
    layer = (trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index("mul1"))
    y = cuda.gemv(x.cuda(), *layer, ksplit=255)
    assert _rel(y.cpu().float(), ref.matmul(x, trellis, suh, svh, "mul1")) < 1e-3
    assert torch.equal(cuda.gemv(x.cuda(), *layer, ksplit=255), y)
    with pytest.raises(RuntimeError, match="at most 255 slices"):
        cuda.gemv(x.cuda(), *layer, ksplit=256)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_workspace_follows_the_tuning() -> None:
    """A workspace size asked under one tuning does not serve a call planned under another.

    The tuning's mul1_fp16 plans one split row of mul1 on the fp16 kernel (fenced hand-over: counters only); without
    it the integer kernel's fixed-point hand-over needs its slots too. The size cached for the first call must not be
    reused for the second (on a stream whose workspace is still the small one, the call would be refused).
    """
    from sparkctl_exl3 import cuda

    if not cuda.ab_paths():
        pytest.skip("mul1 through the fp16 kernel is an A/B path: only in a SPARKCTL_EXL3_AB_PATHS=1 build")
    trellis, suh, svh = _random_layer(256, 512, 2, seed=41)  # 4096 x 8192: split at one row, 8192 columns
    x = torch.randn(1, 4096).half()
    expected = ref.matmul(x, trellis, suh, svh, "mul1")
    args = (x.cuda(), trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index("mul1"))
    stream = torch.cuda.Stream()  # a stream no earlier test has given a workspace
    before = cuda.tuning()
    with torch.cuda.stream(stream):
        with cuda.tuned(mul1_fp16=1):
            y16 = cuda.gemv(*args, ksplit=4)
        small = cuda._workspaces[(torch.cuda.current_device(), stream.cuda_stream)].numel()
        y8 = cuda.gemv(*args, ksplit=4)
        large = cuda._workspaces[(torch.cuda.current_device(), stream.cuda_stream)].numel()
    stream.synchronize()
    assert cuda.tuning() == before  # tuned() put back exactly what was there
    assert large >= 2 * 8192 > small  # a 64-bit slot per column of the one row
    assert _rel(y16.cpu().float(), expected) < 1e-3
    assert _rel(y8.cpu().float(), expected) < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_product_build_refuses_an_ab_tuning() -> None:
    """The product build leaves the A/B paths' kernels out (kernels/csrc/exl3_gemv.cu): a tuning that needs one
    makes the call fail with the sentence naming the bench build, and the default tuning serves the same layer."""
    from sparkctl_exl3 import cuda

    if cuda.ab_paths():
        pytest.skip("this process loaded the bench build (SPARKCTL_EXL3_AB_PATHS=1)")
    trellis, suh, svh = _random_layer(256, 512, 2, seed=43)
    x = torch.randn(2, 4096).half()
    args = (x.cuda(), trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index("mul1"))
    for change in ({"mul1_fp16": 1}, {"xprep_min_rows": 1}):
        with cuda.tuned(**change), pytest.raises(RuntimeError, match="SPARKCTL_EXL3_AB_PATHS=1"):
            cuda.gemv(*args)
    assert _rel(cuda.gemv(*args).cpu().float(), ref.matmul(x, trellis, suh, svh, "mul1")) < 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
# no split, so the warps' runs of slabs are 4 (unaligned), 7 (unaligned, across up to 3 chunks), 8 and 16 (aligned),
# and 16 or 8 (28 chunks: whole chunks per warp, chunk_runs)
@pytest.mark.parametrize("in_chunks", [8, 14, 16, 32, 28])
def test_cuda_rows_5_to_8(in_chunks: int) -> None:
    """5-8 rows of mul1 take fp16 x' and one packed fp16 mma per tile (kernels/csrc/exl3_gemv_i8.cuh, half_slabs).

    Every row matches the reference, and a row's result is bit for bit the same whichever other rows share the
    call: rows are separate B columns and separate sums, and rows past the call's count are never read.
    """
    from sparkctl_exl3 import cuda

    trellis, suh, svh = _random_layer(8 * in_chunks, 16, 2, seed=in_chunks)  # 128 in_chunks x 256, K=2
    x = torch.randn(8, 128 * in_chunks).half()
    args = (trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index("mul1"))
    y8 = cuda.gemv(x.cuda(), *args, ksplit=1)
    assert _rel(y8.cpu().float(), ref.matmul(x, trellis, suh, svh, "mul1")) < 1e-3
    for rows in (5, 6, 7):
        assert torch.equal(cuda.gemv(x[:rows].cuda(), *args, ksplit=1), y8[:rows]), rows


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 2, 4])
def test_cuda_whole_chunk_runs(rows: int) -> None:
    """28 input chunks in one block: 12 warps take 2 whole chunks and 4 take 1 (exl3_gemv_i8.cuh, chunk_runs)."""
    from sparkctl_exl3 import cuda

    trellis, suh, svh = _random_layer(8 * 28, 16, 2, seed=28 + rows)
    x = torch.randn(rows, 128 * 28).half()
    y = cuda.gemv(x.cuda(), trellis.cuda(), suh.cuda(), svh.cuda(), ref.CODEBOOKS.index("mul1"), ksplit=1)
    assert _rel(y.cpu().float(), ref.matmul(x, trellis, suh, svh, "mul1")) < 1e-3
