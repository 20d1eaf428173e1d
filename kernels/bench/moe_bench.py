"""EXL3 MoE bench: our fused MoE op against the reference and against exllamav3 1.6.5, same tensors, same process.

For issue 23 (fused MoE decode, 1..8 tokens) and the MoE prefill of issue 24. One command on the GPU machine
(kernels/README.md, "MoE bench", gives the device command that also installs and builds the peer):

    python kernels/bench/moe_bench.py --out $OUT

1. Random experts: any int16 bit pattern is a valid trellis for any K (SPEC 2.2); ``suh`` a random sign times ~1,
   ``svh`` a random sign times ~1/sqrt(I) so that every projection keeps unit-scale activations (with ~1 on both
   sides the down projection's fp16 output overflows and every comparison reads inf). Codebooks 3inst/mcg/mul1,
   K 1..8, the half rates (mul1), and mixed K / codebooks across the experts of one layer.
2. Routing on the GPU: random distinct experts per token, duplicate expert ids across tokens, every token on the
   same experts, and (prefill) more than 256 tokens on one expert.
3. Correctness: our op (``sparkctl_exl3.cuda.moe``, output taken from NaN-poisoned memory) and exllamav3's
   (``peer_exllamav3.moe``, its persistent decode output NaN-filled before the call) against
   :func:`reference_moe`, the routed-only math of ``vllm_plugin.forward._moe_routed`` on ``sparkctl_exl3.reference``
   (the CPU test holds the two together); a CUDA-graph replay with new inputs and routing; exllamav3's dense
   ``gemm`` against the reference as a check of the peer itself. Only our failures fail the run (exit 1).
4. Timing: CUDA graphs of ``--calls`` calls cycling over ``--sets`` routing sets (run.py's ``_graph_time_us``;
   unique experts per set exceed the L2), medians of ``--reps`` replays. exllamav3's prefill path reads expert
   counts on the host and cannot be captured: it is timed with events around eager calls (the ``mode`` column),
   and ours is timed that way too for those rows. Columns: ours, exllamav3, ratio, the bandwidth floor (trellis +
   suh/svh bytes of the routed unique experts' three projections at 4.0 TB/s), the GB10 floor (same bytes at
   273 GB/s) and ours scaled to the GB10's 48 SMs at the same clock (a rough compute-side bound).

Writes ``<out>/moe_bench.json``; prints a markdown table. Exit 0 pass, 1 a check of ours failed, 2 no CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))
sys.path.insert(0, str(BENCH_DIR.parent))

import compiled_rates  # noqa: E402
from sparkctl_exl3 import reference  # noqa: E402

FLOOR_GBS = 4000.0  # issue 23: the H200 bandwidth floor at 4.0 TB/s
GB10_GBS = 273.0  # the DGX Spark's LPDDR5x
GB10_SMS = 48
OURS_TOL = 5e-3  # relative L2 error of our op against the reference
PEER_NOTE_TOL = 5e-2  # exllamav3 (fp16 intermediates, int8 GEMV paths) is reported; beyond this it is flagged

Expert = dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]]

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_tanh": partial(F.gelu, approximate="tanh"),
}


# ------------------------------------------------------------------------------------------------------------
# Random experts and routing (device-agnostic; tests/kernels/test_moe_bench.py runs them on the CPU)
# ------------------------------------------------------------------------------------------------------------


def tile_length(bits: float) -> int:
    """int16 per trellis tile for K = bits (SPEC 1.1, 2.5): 16K, or 16KA + 8 for K = KA + 0.5."""
    whole = math.floor(bits)
    if bits == whole and 1 <= whole <= 8:
        return 16 * whole
    if bits - whole == 0.5 and 1 <= whole <= 7:
        return 16 * whole + 8
    raise ValueError(f"unsupported K {bits}: 1..8 or a half rate 1.5..7.5")


def random_projection(
    in_f: int, out_f: int, bits: float, codebook: str, gen: torch.Generator, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """One random EXL3 linear ``(trellis, suh, svh, codebook)``, I = in_f, O = out_f (multiples of 128)."""
    if codebook not in reference.CODEBOOKS:
        raise ValueError(f"unknown codebook {codebook!r}")
    if bits != int(bits) and codebook != "mul1":
        raise ValueError(f"half rate K={bits} needs mul1, not {codebook}")
    shape = (in_f // 16, out_f // 16, tile_length(bits))
    trellis = torch.randint(-32768, 32768, shape, generator=gen, dtype=torch.int32, device=device).to(
        torch.int16
    )

    def signs(n: int) -> torch.Tensor:
        return torch.randint(0, 2, (n,), generator=gen, device=device).float() * 2 - 1

    jitter_u = 1 + 0.05 * torch.randn(in_f, generator=gen, device=device)
    jitter_v = 1 + 0.05 * torch.randn(out_f, generator=gen, device=device)
    suh = (signs(in_f) * jitter_u).half()
    svh = (signs(out_f) * jitter_v / math.sqrt(in_f)).half()
    return trellis, suh, svh, codebook


def random_experts(
    num_experts: int,
    hidden: int,
    inter: int,
    bits: float | Sequence[float],
    codebook: str | Sequence[str],
    *,
    seed: int,
    device: torch.device | str,
) -> list[Expert]:
    """``num_experts`` gated experts (gate, up: hidden -> inter; down: inter -> hidden). ``bits`` / ``codebook``
    may be per expert (cycled), which makes a layer of mixed K or mixed codebooks."""
    gen = torch.Generator(device=device).manual_seed(seed)
    ks = [bits] if isinstance(bits, int | float) else list(bits)
    cbs = [codebook] if isinstance(codebook, str) else list(codebook)
    out = []
    for e in range(num_experts):
        k, cb = float(ks[e % len(ks)]), cbs[e % len(cbs)]
        out.append(
            {
                "gate": random_projection(hidden, inter, k, cb, gen, device),
                "up": random_projection(hidden, inter, k, cb, gen, device),
                "down": random_projection(inter, hidden, k, cb, gen, device),
            }
        )
    return out


ROUTINGS = ("random", "dup", "same", "fat")


def random_routing(
    tokens: int, top_k: int, num_experts: int, kind: str, gen: torch.Generator, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(topk_ids int32 [T, k], topk_weights fp32 [T, k])`` made on ``device``; every row has k distinct experts
    (as a top-k router gives) and weights that sum to 1.

    ``random``: any experts; ``dup``: drawn from a pool of k + 2, so tokens share experts (duplicate ids across
    tokens); ``same``: every token on the same k experts; ``fat``: expert 0 in every token (more than 256 rows on one
    expert once T > 256, the fat-expert case of issue 24), the other slots random.
    """
    if kind not in ROUTINGS:
        raise ValueError(f"unknown routing {kind!r}: expected one of {', '.join(ROUTINGS)}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top_k {top_k} must be in 1..{num_experts}")
    scores = torch.rand(tokens, num_experts, generator=gen, device=device)
    if kind == "dup":
        pool = torch.randperm(num_experts, generator=gen, device=device)[: min(num_experts, top_k + 2)]
        mask = torch.full((num_experts,), -1.0, device=device)
        mask[pool] = 0.0
        scores = scores + 2 * mask  # only pool experts can win
    elif kind == "same":
        scores = scores[:1].expand(tokens, num_experts)
    elif kind == "fat":
        scores = scores.clone()
        scores[:, 0] = 2.0
    ids = scores.topk(top_k, dim=-1).indices
    logits = torch.randn(tokens, top_k, generator=gen, device=device)
    weights = torch.softmax(logits, dim=-1)
    return ids.to(torch.int32).contiguous(), weights.float().contiguous()


def active_bytes(topk_ids: torch.Tensor, experts: Sequence[Expert]) -> int:
    """Bytes a routed-only MoE must read: each routed unique expert's three trellises plus suh/svh (fp16)."""
    total = 0
    for e in torch.unique(topk_ids.reshape(-1)).tolist():
        if not 0 <= e < len(experts):
            continue
        for proj in ("gate", "up", "down"):
            trellis, suh, svh, _ = experts[e][proj]
            total += trellis.numel() * 2 + suh.numel() * 2 + svh.numel() * 2
    return total


def reference_moe(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: Sequence[Expert],
    activation: str = "silu",
) -> torch.Tensor:
    """The routed-only MoE on the reference decoder, rounded where ``forward._moe_routed`` rounds: each projection's
    output in x's dtype, the activation and the gate*up product in fp32, the down input in x's dtype, the weighted
    sum in fp32. Ids outside ``0..len(experts)-1`` add nothing. Loops over the routed unique experts (host-side ids:
    this is the oracle, not a graph-safe path), each expert's rows in one ``reference.matmul``."""
    act = ACTIVATIONS[activation]
    tokens, top_k = topk_ids.shape
    ids = topk_ids.reshape(-1).to(torch.int64)
    weight = topk_weights.reshape(-1).to(torch.float32)
    token = torch.arange(tokens, device=x.device).repeat_interleave(top_k)
    out = torch.zeros(tokens, x.shape[-1], dtype=torch.float32, device=x.device)
    for e in torch.unique(ids).tolist():
        if not 0 <= e < len(experts):
            continue
        sel = (ids == e).nonzero()[:, 0]
        xe = x.index_select(0, token[sel])
        g = reference.matmul(xe, *experts[e]["gate"]).float()
        h = act(g) * reference.matmul(xe, *experts[e]["up"]).float()
        y = reference.matmul(h.to(x.dtype), *experts[e]["down"]).float()
        out.index_add_(0, token[sel], y * weight[sel, None])
    return out.to(x.dtype)


# ------------------------------------------------------------------------------------------------------------
# Records
# ------------------------------------------------------------------------------------------------------------


@dataclass
class Check:
    who: str  # "ours" | "exllamav3"
    case: str
    err: float
    tol: float
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.err <= self.tol


@dataclass
class Timing:
    case: str
    tokens: int
    routing: str
    ours_us: float | None
    ours_mode: str
    peer_us: float | None
    peer_mode: str
    bytes: int
    floor_us: float
    gb10_floor_us: float
    ours_sm_scaled_us: float | None
    ours_err: float | None
    peer_err: float | None
    peer_path: str = ""
    extra: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Shape:
    name: str
    hidden: int
    inter: int
    experts: int
    top_k: int
    bits: float | tuple[float, ...]
    codebook: str | tuple[str, ...]


GLM = Shape("GLM-like", 4096, 1536, 128, 8, 2.0, "mul1")
QWEN_NEXT = Shape("Qwen-Next-like", 2560, 1024, 512, 10, 4.0, "mul1")


# ------------------------------------------------------------------------------------------------------------
# The two sides
# ------------------------------------------------------------------------------------------------------------


class Ours:
    """``sparkctl_exl3.cuda.moe_prepare`` / ``moe`` if the module has them and its extension loads."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self.cuda = None
        try:
            from sparkctl_exl3 import cuda
        except Exception as exc:  # noqa: BLE001  (one line, and the peer side still runs)
            self.reason = f"sparkctl_exl3.cuda does not import: {type(exc).__name__}: {exc}"
            return
        if not (hasattr(cuda, "moe_prepare") and hasattr(cuda, "moe")):
            self.reason = "sparkctl_exl3.cuda has no moe_prepare/moe yet"
        elif not cuda.available():
            self.reason = f"our extension is unavailable: {cuda.unavailable_reason()}"
        else:
            self.cuda = cuda

    @property
    def ok(self) -> bool:
        return self.cuda is not None

    def prepare(self, experts: Sequence[Expert]) -> object:
        return self.cuda.moe_prepare(list(experts), expert_ids=None)

    def call(
        self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, tables: object, **tune: int
    ) -> torch.Tensor:
        return self.cuda.moe(x, ids, w, tables, activation="silu", **tune)


class Peer:
    """exllamav3 1.6.5 through ``peer_exllamav3`` (loaded once; a failure is one line and the run goes on)."""

    def __init__(self, enabled: bool, allow_jit: bool = True) -> None:
        self.reason: str | None = None
        self.mod = None
        if not enabled:
            self.reason = "disabled (--no-peer)"
            return
        try:
            import peer_exllamav3

            peer_exllamav3.load(allow_jit=allow_jit)
            self.mod = peer_exllamav3
        except Exception as exc:  # noqa: BLE001
            self.reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__

    @property
    def ok(self) -> bool:
        return self.mod is not None

    def prepare(self, experts: Sequence[Expert], top_k: int) -> tuple[object | None, str]:
        """(handle, "") or (None, why not)."""
        try:
            return self.mod.prepare_moe(list(experts), top_k=top_k), ""
        except self.mod.PeerUnsupported as exc:
            return None, f"n/a: {exc}"
        except Exception as exc:  # noqa: BLE001
            return None, f"error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]

    def call(self, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, handle: object) -> torch.Tensor:
        return self.mod.moe(x, ids, w, handle)

    def poison(self, handle: object) -> None:
        """NaN-fill exllamav3's persistent decode output, so an element it does not write shows up."""
        cfg = getattr(handle.mlp, "experts_cfg", None)
        if cfg is not None and cfg.out_bszn is not None:
            cfg.out_bszn.fill_(float("nan"))


# ------------------------------------------------------------------------------------------------------------
# Checks
# ------------------------------------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


class Checker:
    def __init__(self, ours: Ours, peer: Peer, log: Callable[[str], None]) -> None:
        self.ours, self.peer, self.log = ours, peer, log
        self.results: list[Check] = []

    def add(self, c: Check) -> None:
        self.results.append(c)
        bad = not c.ok
        flag = "FAIL" if bad and c.who == "ours" else ("note" if bad else "ok  ")
        self.log(f"  check {flag} {c.who:9} {c.case}: err {c.err:.3g} (tol {c.tol:g}) {c.note}")

    def layer(
        self,
        label: str,
        experts: Sequence[Expert],
        top_k: int,
        cases: Sequence[tuple[int, str]],
        gen: torch.Generator,
        *,
        tables: object | None = None,
        handle: object | None = None,
        handle_note: str | None = None,
    ) -> None:
        """Check both sides on one layer, for each (tokens, routing kind)."""
        dev = experts[0]["gate"][0].device
        hidden = 16 * experts[0]["gate"][0].shape[0]
        if self.ours.ok and tables is None and not self.ours.cuda.moe_supports(list(experts)):
            # not a failure: the plugin runs such layers per expert through the GEMV (forward.exl3_moe_forward)
            self.log(f"  ours      {label}: n/a: the fused MoE takes mul1 experts only")
        elif self.ours.ok and tables is None:
            try:
                tables = self.ours.prepare(experts)
            except Exception as exc:  # noqa: BLE001
                self.add(Check("ours", f"{label}: moe_prepare", math.inf, OURS_TOL, _first_line(exc)))
                tables = None
        if self.peer.ok and handle is None and handle_note is None:
            handle, handle_note = self.peer.prepare(experts, top_k)
        for tokens, kind in cases:
            ids, w = random_routing(tokens, top_k, len(experts), kind, gen, dev)
            x = torch.randn(tokens, hidden, generator=gen, device=dev).half()
            y_ref = reference_moe(x, ids, w, experts)
            case = f"{label} T={tokens} {kind}"
            if tables is not None:
                try:
                    import run as bench_run

                    y, landed = bench_run.poisoned_call(
                        partial(self.ours.call, x, ids, w, tables), tokens, hidden, str(dev)
                    )
                    self.add(
                        Check(
                            "ours",
                            case,
                            bench_run.rel_err(y, y_ref),
                            OURS_TOL,
                            "" if landed else "(output not in poisoned block)",
                        )
                    )
                except Exception as exc:  # noqa: BLE001
                    self.add(Check("ours", case, math.inf, OURS_TOL, _first_line(exc)))
            if handle is not None:
                try:
                    import run as bench_run

                    pid, pw = self.peer.mod.routing_for_peer(ids, w)
                    self.peer.poison(handle)
                    y = self.peer.call(x, pid, pw, handle).clone()
                    note = self.peer.mod.moe_path(handle, tokens).split(":")[0]
                    self.add(Check("exllamav3", case, bench_run.rel_err(y, y_ref), PEER_NOTE_TOL, note))
                except Exception as exc:  # noqa: BLE001
                    self.add(Check("exllamav3", case, math.inf, PEER_NOTE_TOL, _first_line(exc)))
            elif handle_note and tokens == cases[0][0] and kind == cases[0][1]:
                self.log(f"  exllamav3 {label}: {handle_note}")

    def graph_replay(
        self,
        label: str,
        experts: Sequence[Expert],
        top_k: int,
        tokens: int,
        gen: torch.Generator,
        tables: object | None,
        handle: object | None,
    ) -> None:
        """Capture one call in a CUDA graph, then replay it with new x and routing copied into its inputs."""
        import run as bench_run

        dev = experts[0]["gate"][0].device
        hidden = 16 * experts[0]["gate"][0].shape[0]
        sides: list[tuple[str, Callable, float]] = []
        if tables is not None:
            sides.append(("ours", lambda x, i, w: self.ours.call(x, i, w, tables), OURS_TOL))
        if handle is not None and tokens <= 8:
            sides.append(("exllamav3", lambda x, i, w: self.peer.call(x, i, w, handle), PEER_NOTE_TOL))
        for who, fn, tol in sides:
            case = f"{label} T={tokens} CUDA graph replay"
            try:
                ids, w = random_routing(tokens, top_k, len(experts), "random", gen, dev)
                if who == "exllamav3":
                    ids, w = self.peer.mod.routing_for_peer(ids, w)
                sx = torch.randn(tokens, hidden, generator=gen, device=dev).half()
                sids, sw = ids.clone(), w.clone()
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    fn(sx, sids, sw)
                    fn(sx, sids, sw)
                torch.cuda.current_stream().wait_stream(s)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=s):
                    sy = fn(sx, sids, sw)
                worst = 0.0
                for _ in range(3):
                    nid, nw = random_routing(tokens, top_k, len(experts), "random", gen, dev)
                    nx = torch.randn(tokens, hidden, generator=gen, device=dev).half()
                    sx.copy_(nx)
                    sids.copy_(nid.to(sids.dtype))
                    sw.copy_(nw.to(sw.dtype))
                    graph.replay()
                    torch.cuda.synchronize()
                    worst = max(worst, bench_run.rel_err(sy, reference_moe(nx, nid, nw, experts)))
                del graph
                self.add(Check(who, case, worst, tol))
            except Exception as exc:  # noqa: BLE001
                self.add(Check(who, case, math.inf, tol, _first_line(exc)))

    def peer_gemm(self, gen: torch.Generator) -> None:
        """exllamav3's dense EXL3 GEMM on our tensors vs the reference (the peer of issue 24's benches)."""
        if not self.peer.ok:
            return
        import run as bench_run

        dev = torch.device("cuda")
        for cb in reference.CODEBOOKS:
            for bits in (2.0, 4.0):
                trellis, suh, svh, _ = random_projection(1024, 2048, bits, cb, gen, dev)
                for rows in (1, 8, 200):
                    x = torch.randn(rows, 1024, generator=gen, device=dev).half()
                    case = f"gemm 1024x2048 K={bits:g} {cb} rows={rows}"
                    try:
                        y = self.peer.mod.gemm(x, trellis, suh, svh, cb)
                        ref = reference.matmul(x, trellis, suh, svh, cb)
                        self.add(
                            Check(
                                "exllamav3",
                                case,
                                bench_run.rel_err(y, ref),
                                PEER_NOTE_TOL,
                                self.peer.mod.gemm_path(rows),
                            )
                        )
                    except Exception as exc:  # noqa: BLE001
                        self.add(Check("exllamav3", case, math.inf, PEER_NOTE_TOL, _first_line(exc)))
        self.peer.mod.clear_gemm_cache()


def run_checks(args: argparse.Namespace, ours: Ours, peer: Peer, log: Callable[[str], None]) -> Checker:
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    chk = Checker(ours, peer, log)
    chk.peer_gemm(gen)
    # every K and codebook on a small layer, tokens 1..8 and one prefill size, routings rotated
    kinds = ("random", "dup", "same")
    # every compiled rate and codebook (csrc/exl3_common.cuh, EXL3_RATES): codebook by codebook, then the half rates
    every = [k2 for k2, all_cbs in compiled_rates.compiled_rates() if all_cbs]
    rates = [(k2 / 2, cb) for cb in reference.CODEBOOKS for k2 in every] + [
        (k2 / 2, "mul1") for k2, all_cbs in compiled_rates.compiled_rates() if not all_cbs
    ]
    for i, (bits, cb) in enumerate(rates):
        experts = random_experts(16, 1024, 512, bits, cb, seed=args.seed + 100 + i, device=dev)
        cases = [(1 + i % 8, kinds[i % 3]), (8, "random"), (33 + 4 * i, "fat")]
        chk.layer(f"H1024 I512 E16 k4 K={bits:g} {cb}", experts, 4, cases, gen)
        del experts
    # mixed K (and mixed codebooks) across the experts of one layer: ours only, exllamav3 needs one K
    for label, bits, cbs in (
        ("mixed K 1..8 mul1", tuple(float(k) for k in range(1, 9)), "mul1"),
        ("mixed K 2,3,4 mcg", (2.0, 3.0, 4.0), "mcg"),
        ("mixed K+codebook", (2.0, 4.0, 3.0), ("mul1", "3inst", "mcg")),
    ):
        experts = random_experts(16, 1024, 512, bits, cbs, seed=args.seed + 200, device=dev)
        chk.layer(
            f"H1024 I512 E16 k4 {label}",
            experts,
            4,
            [(1, "random"), (4, "dup"), (8, "same"), (300, "fat")],
            gen,
        )
        del experts
    torch.cuda.empty_cache()
    return chk


# ------------------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------------------


def eager_time_us(make_call: Callable[[int], Callable[[], object]], n_sets: int, reps: int) -> float:
    """Median of single eager calls between CUDA events, cycling over the sets (for paths that sync the host)."""
    fns = [make_call(i % n_sets) for i in range(max(reps, n_sets))]
    for f in fns[: 2 * n_sets]:
        f()
    torch.cuda.synchronize()
    times = []
    for f in fns[:reps]:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        f()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1000.0)
    return statistics.median(times)


def time_side(
    make_call: Callable[[int], Callable[[], object]], n_sets: int, calls: int, reps: int, graph: bool
) -> tuple[float, str]:
    """Median us per call: CUDA graphs when ``graph`` (falling back to eager, and saying why, if capture fails)."""
    import run as bench_run

    if graph:
        try:
            return bench_run._graph_time_us(make_call, n_sets, calls=calls, reps=reps), "graph"
        except Exception as exc:  # noqa: BLE001
            torch.cuda.synchronize()
            return eager_time_us(make_call, n_sets, reps), f"eager (capture failed: {_first_line(exc)})"
    return eager_time_us(make_call, n_sets, reps), "eager"


def sweep_ours(
    ours: Ours, sets: list, tables: object, n_sets: int, calls: int, reps: int, log: Callable[[str], None]
) -> list[dict]:
    """--sweep (tuning experiment): the two launches' split-K, one at a time around automatic."""
    out = []
    for name, values in (("ksplit_gu", (0, 1, 2, 3, 4, 6, 8)), ("ksplit_down", (1, 2, 3, 4))):
        for v in values:
            tune = {name: v}

            def make(i: int, tune: dict = tune) -> Callable[[], object]:
                return partial(ours.call, *sets[i], tables, **tune)

            try:
                us, _ = time_side(make, n_sets, calls, reps, graph=True)
            except Exception as exc:  # noqa: BLE001
                log(f"    sweep {tune}: {_first_line(exc)}")
                continue
            out.append({**tune, "us": us})
            log(f"    sweep {name}={v}: {us:.2f} us")
    return out


def shared_expert_case(args: argparse.Namespace, ours: Ours, log: Callable[[str], None]) -> list[dict]:
    """--shared (issue 23): a GLM-like layer's shared expert as one more fused slot (weight 1) against the same
    expert as a dense MLP through the GEMV op (what vLLM runs for it beside our routed experts)."""
    import torch.nn.functional as F
    from sparkctl_exl3 import ops

    dev = torch.device("cuda")
    shape = GLM
    experts = random_experts(
        shape.experts + 1,
        shape.hidden,
        shape.inter,
        shape.bits,
        shape.codebook,
        seed=args.seed + 17,
        device=dev,
    )
    shared = experts[-1]
    routed = ours.prepare(experts[:-1])
    with_shared = ours.prepare(experts)
    gen = torch.Generator(device=dev).manual_seed(args.seed + 19)
    out = []
    for tokens in (1, 4, 8):
        sets, sets9 = [], []
        for _ in range(args.sets):
            ids, w = random_routing(tokens, shape.top_k, shape.experts, "random", gen, dev)
            x = torch.randn(tokens, shape.hidden, generator=gen, device=dev).half()
            sets.append((x, ids, w))
            ids9 = torch.cat([ids, torch.full((tokens, 1), shape.experts, dtype=ids.dtype, device=dev)], 1)
            w9 = torch.cat([w, torch.ones(tokens, 1, dtype=w.dtype, device=dev)], 1)
            sets9.append((x, ids9, w9))

        def mlp(x: torch.Tensor) -> torch.Tensor:
            g = ops.exl3_matmul(x, *shared["gate"])
            u = ops.exl3_matmul(x, *shared["up"])
            return ops.exl3_matmul((F.silu(g.float()) * u.float()).half(), *shared["down"])

        x0, ids0, w0 = sets[0]
        _, ids9, w9 = sets9[0]
        both = ours.call(x0, ids9, w9, with_shared).float()
        ref = ours.call(x0, ids0, w0, routed).float() + mlp(x0).float()
        err = float((both - ref).norm() / ref.norm())
        t8, _ = time_side(
            lambda i, s=sets: partial(ours.call, *s[i], routed), args.sets, args.calls, args.reps, True
        )
        t9, _ = time_side(
            lambda i, s=sets9: partial(ours.call, *s[i], with_shared), args.sets, args.calls, args.reps, True
        )
        tm, _ = time_side(lambda i, s=sets: partial(mlp, s[i][0]), args.sets, args.calls, args.reps, True)
        row = {
            "tokens": tokens,
            "routed_us": t8,
            "routed_plus_shared_slot_us": t9,
            "dense_mlp_us": tm,
            "err": err,
        }
        out.append(row)
        log(
            f"  shared expert T={tokens}: as a fused slot +{t9 - t8:.2f} us ({t8:.2f} -> {t9:.2f}), as a dense MLP "
            f"through the GEMV {tm:.2f} us (separate launches; sum check rel err {err:.2g})"
        )
    return out


def bench_shape(
    shape: Shape,
    timed: Sequence[tuple[int, str]],
    args: argparse.Namespace,
    ours: Ours,
    peer: Peer,
    chk: Checker,
    log: Callable[[str], None],
) -> list[Timing]:
    """One layer of ``shape`` (made once), checked at its token counts, then timed for each (tokens, routing)."""
    import run as bench_run

    dev = torch.device("cuda")
    t0 = time.time()
    experts = random_experts(
        shape.experts, shape.hidden, shape.inter, shape.bits, shape.codebook, seed=args.seed + 7, device=dev
    )
    log(f"{shape.name}: {shape.experts} experts made in {time.time() - t0:.1f} s")
    tables = handle = None
    note = ""
    if ours.ok:
        try:
            tables = ours.prepare(experts)
        except Exception as exc:  # noqa: BLE001
            log(f"  ours: moe_prepare failed: {_first_line(exc)}")
    if peer.ok:
        handle, note = peer.prepare(experts, shape.top_k)
        if handle is None:
            log(f"  exllamav3: {note}")
    gen = torch.Generator(device=dev).manual_seed(args.seed + 11)
    decode = sorted({t for t, _ in timed if t <= 8})
    prefill = sorted({t for t, _ in timed if t > 8})
    cases = [(t, k) for t in decode for k in ("random", "dup", "same")]
    cases += [(t, k) for t in prefill for k in ("random", "fat")]
    chk.layer(
        shape.name, experts, shape.top_k, cases, gen, tables=tables, handle=handle, handle_note=note or None
    )
    if decode:
        chk.graph_replay(shape.name, experts, shape.top_k, max(decode), gen, tables, handle)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for tokens, routing in timed:
        n_sets = args.sets if tokens <= 8 else 2
        calls = args.calls if tokens <= 8 else args.prefill_calls
        sets = []
        for _ in range(n_sets):
            ids, w = random_routing(tokens, shape.top_k, shape.experts, routing, gen, dev)
            x = torch.randn(tokens, shape.hidden, generator=gen, device=dev).half()
            sets.append((x, ids, w))
        nbytes = int(statistics.mean(active_bytes(ids, experts) for _, ids, _ in sets))
        floor = nbytes / (FLOOR_GBS * 1e3)
        x0, ids0, w0 = sets[0]
        y_ref = reference_moe(x0, ids0, w0, experts)
        extra: dict = {}
        ours_us = ours_err = None
        ours_mode = ours.reason or ""
        if tables is not None:
            try:
                ours_err = bench_run.rel_err(ours.call(x0, ids0, w0, tables), y_ref)

                def make_ours(i: int, sets: list = sets, tables: object = tables) -> Callable[[], object]:
                    return partial(ours.call, *sets[i], tables)

                ours_us, ours_mode = time_side(make_ours, n_sets, calls, args.reps, graph=True)
                if tokens > 8:  # exllamav3's prefill runs eager: ours that way too, beside the graph number
                    extra["ours_eager_us"] = eager_time_us(make_ours, n_sets, args.reps)
                elif args.sweep:
                    extra["sweep"] = sweep_ours(ours, sets, tables, n_sets, calls, args.reps, log)
            except Exception as exc:  # noqa: BLE001
                ours_mode = f"error: {_first_line(exc)}"
        peer_us = peer_err = None
        peer_mode = peer.reason or note
        path = ""
        if handle is not None:
            try:
                psets = [(x, *peer.mod.routing_for_peer(ids, w)) for x, ids, w in sets]
                peer_err = bench_run.rel_err(peer.call(*psets[0], handle).clone(), y_ref)
                path = peer.mod.moe_path(handle, tokens)

                def make_peer(i: int, psets: list = psets, handle: object = handle) -> Callable[[], object]:
                    return partial(peer.call, *psets[i], handle)

                peer_us, peer_mode = time_side(make_peer, n_sets, calls, args.reps, graph=tokens <= 8)
            except Exception as exc:  # noqa: BLE001
                peer_mode = f"error: {_first_line(exc)}"
        t = Timing(
            shape.name,
            tokens,
            routing,
            ours_us,
            ours_mode,
            peer_us,
            peer_mode,
            nbytes,
            floor,
            nbytes / (GB10_GBS * 1e3),
            ours_us * sms / GB10_SMS if ours_us is not None else None,
            ours_err,
            peer_err,
            path,
            extra,
        )
        log(
            f"  {shape.name} T={tokens} {routing}: ours {_fmt(ours_us)} us ({ours_mode}), exllamav3 {_fmt(peer_us)} us "
            f"({peer_mode}), floor {floor:.2f} us, GB10 floor {t.gb10_floor_us:.1f} us, err ours {_fmt(ours_err, 3)} "
            f"exllamav3 {_fmt(peer_err, 3)}"
            + (f", ours eager {extra['ours_eager_us']:.1f} us" if "ours_eager_us" in extra else "")
            + (f"; exllamav3 path: {path}" if path else "")
        )
        rows.append(t)
    return rows


def _fmt(v: float | None, digits: int = 2) -> str:
    if v is None:
        return "-"
    return f"{v:.{digits}g}" if digits == 3 else f"{v:.{digits}f}"


def table(rows: Sequence[Timing]) -> str:
    head = (
        "| case | tokens | routing | ours us | exllamav3 us | ours/exllamav3 | floor us (4 TB/s) | ours % of floor "
        "| GB10 floor us (273 GB/s) | ours x SMs/48 us | err ours | err exllamav3 |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for t in rows:
        ratio = f"{t.ours_us / t.peer_us:.2f}" if t.ours_us and t.peer_us else "-"
        pct = f"{100 * t.floor_us / t.ours_us:.0f}%" if t.ours_us else "-"
        lines.append(
            f"| {t.case} | {t.tokens} | {t.routing} | {_fmt(t.ours_us)} | {_fmt(t.peer_us)} | {ratio} | "
            f"{t.floor_us:.2f} | {pct} | {t.gb10_floor_us:.1f} | {_fmt(t.ours_sm_scaled_us)} | "
            f"{_fmt(t.ours_err, 3)} | {_fmt(t.peer_err, 3)} |"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="kernels/build/moe_bench")
    p.add_argument("--calls", type=int, default=48, help="calls per CUDA graph")
    p.add_argument("--reps", type=int, default=15, help="graph replays / eager calls (median)")
    p.add_argument("--sets", type=int, default=8, help="routing + input sets cycled in decode timings")
    p.add_argument("--prefill-calls", type=int, default=8, help="calls per CUDA graph for the prefill rows")
    p.add_argument("--prefill-tokens", type=int, default=2048)
    p.add_argument("--seed", type=int, default=4321)
    p.add_argument("--skip-check", action="store_true", help="only the timed cases' own checks")
    p.add_argument("--skip-bench", action="store_true")
    p.add_argument("--no-peer", action="store_true", help="leave exllamav3 out")
    p.add_argument(
        "--peer-no-jit",
        action="store_true",
        help="use exllamav3 only from a prebuilt .device/peer/exllamav3_ext*.so (peer_build.sh / peer_unpack.sh)",
    )
    p.add_argument("--cases", default="glm,qwen,prefill", help="timed cases: glm,qwen,prefill")
    p.add_argument(
        "--shared", action="store_true", help="GLM-like shared expert: a fused slot vs a dense MLP"
    )
    p.add_argument(
        "--sweep", action="store_true", help="tuning experiment: time our decode cases per block size/split"
    )
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: no CUDA device; moe_bench runs on the GPU machine", file=sys.stderr)
        return 2
    import run as bench_run

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    logf = (out / "moe_checks.log").open("w")

    def log(line: str) -> None:
        print(line, flush=True)
        print(line, file=logf, flush=True)

    report: dict = {"machine": bench_run._machine(), "args": vars(args)}
    log(f"machine: {json.dumps(report['machine'])}")
    t0 = time.time()
    # the peer first: exllamav3's import must see EXL3_EXPANDABLE_SEGMENTS=0 before anything allocates
    peer = Peer(not args.no_peer, allow_jit=not args.peer_no_jit)
    report["peer"] = peer.mod.info() if peer.ok else {"error": peer.reason}
    log(
        f"exllamav3: {'ok ' + json.dumps(report['peer']) if peer.ok else 'UNAVAILABLE: ' + str(peer.reason)}"
        f" ({time.time() - t0:.1f} s)"
    )
    t0 = time.time()
    ours = Ours()
    report["ours"] = {"ok": ours.ok, "reason": ours.reason, "load_s": round(time.time() - t0, 1)}
    log(f"ours: {'ok' if ours.ok else 'UNAVAILABLE: ' + str(ours.reason)} ({time.time() - t0:.1f} s)")
    report["copy_gbs"] = round(bench_run._copy_bandwidth_gbs(), 1)
    log(f"device copy bandwidth: {report['copy_gbs']} GB/s (read + write)")

    def save() -> None:
        tmp = out / "moe_bench.json.tmp"
        tmp.write_text(json.dumps(report, indent=1, default=str))
        tmp.replace(out / "moe_bench.json")

    chk = Checker(ours, peer, log) if args.skip_check else run_checks(args, ours, peer, log)
    report["checks"] = [asdict(c) | {"ok": c.ok} for c in chk.results]
    save()
    rows: list[Timing] = []
    if not args.skip_bench:
        wanted = set(args.cases.split(","))
        unknown = wanted - {"glm", "qwen", "prefill"}
        if unknown:
            print(
                f"error: unknown --cases {', '.join(sorted(unknown))}: expected glm, qwen, prefill",
                file=sys.stderr,
            )
            return 2
        glm = [(t, "random") for t in (1, 4, 8)] if "glm" in wanted else []
        if "prefill" in wanted:
            glm += [(args.prefill_tokens, "random"), (args.prefill_tokens, "fat")]
        plan = [(GLM, glm)] if glm else []
        if "qwen" in wanted:
            plan.append((QWEN_NEXT, [(t, "random") for t in (1, 4, 8)]))
        for shape, timed in plan:
            rows += bench_shape(shape, timed, args, ours, peer, chk, log)
            torch.cuda.empty_cache()
            report["times"] = [asdict(t) for t in rows]
            report["checks"] = [asdict(c) | {"ok": c.ok} for c in chk.results]
            save()
        if args.shared and ours.ok:
            report["shared_expert"] = shared_expert_case(args, ours, log)
            save()
        log("\n" + table(rows))
    ours_fail = [c for c in chk.results if c.who == "ours" and not c.ok]
    peer_flag = [c for c in chk.results if c.who != "ours" and not c.ok]
    worst = max((c.err for c in chk.results if c.who == "ours" and math.isfinite(c.err)), default=0.0)
    log(
        f"checks: {len(chk.results)} run; ours {len(ours_fail)} failed (worst finite {worst:.3g}); "
        f"exllamav3 {len(peer_flag)} above {PEER_NOTE_TOL:g}"
    )
    for c in ours_fail:
        log(f"FAIL ours: {c.case}: err {c.err:.3g} > {c.tol:g} {c.note}")
    report["check_failures"] = len(ours_fail)
    report["machine_after"] = bench_run._machine()
    save()
    return 1 if ours_fail else 0


if __name__ == "__main__":
    sys.exit(main())
