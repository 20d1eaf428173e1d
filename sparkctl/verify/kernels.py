"""Layer 2: the plugin's forward path on the pack's own bits against the reference decoder in fp64.

For a sample of modules of every kind in the pack (attention, dense MLP, routed experts of every K, shared expert,
lm_head, MTP layer, n-gram rows; `--full`: every module) the path vLLM runs through the plugin
(`vllm_plugin.forward.exl3_linear` / `exl3_moe_forward` / the n-gram lookup op) is compared with the same
weights decoded by `sparkctl_exl3.reference` and multiplied out in fp64. On a GPU with the extension built that
path is our CUDA kernels (GEMV at 1 and 8 rows, the fused MoE for 1..8 tokens with the pack's own router, the
prefill reconstruction, the n-gram lookup kernel); on a CPU it is the plugin's CPU path (the reference decoder in
fp32), which proves the loading, shard and routing code and the rounding, not the kernels. The row says which.

Inputs are seeded random activations, so a run is repeatable; the error is the relative L2 norm of the
difference (the n-gram rows: max |difference|, which must be 0: the kernel is bit-exact by design).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from sparkctl.verify.pack import ModuleFacts, Pack, kind_of, text_config
from sparkctl.verify.records import SKIP, Check

#: (bound on the CPU path, bound on CUDA). CPU: fp32 against fp64, about 1e-6 seen. CUDA: fp16 activations and
#: outputs (one fp16 rounding is ~5e-4), the bounds the plugin's GPU check holds the kernels to.
LINEAR_BOUND = {"cpu": 1e-4, "cuda": 5e-3}
RECON_BOUND = 2e-3  # the fp16 reconstruction (cuda.weight) against the fp64 weight
MOE_BOUND = {"cpu": 1e-4, "cuda": 1e-2}
LINEAR_ROWS = (1, 8)
MOE_TOKENS = (1, 2, 4, 8)
NGRAM_SAMPLE = 64  # rows per table and end (quick)
QUICK_PER_KIND = 2
SEED = 20261206


def sample(pack: Pack, facts: dict[str, ModuleFacts], full: bool) -> dict[str, list[str]]:
    """kind -> the modules checked: all of them with `full`, else the first and the last of each kind."""
    layers = int(text_config(pack.config).get("num_hidden_layers") or 10**9)
    kinds: dict[str, list[str]] = {}
    for prefix, f in facts.items():
        kinds.setdefault(kind_of(prefix, f.bits, layers), []).append(prefix)
    order = ("attention", "dense MLP", "routed", "shared expert", "MTP layer", "lm_head")
    kinds = dict(
        sorted(
            kinds.items(), key=lambda kv: (next(i for i, o in enumerate(order) if kv[0].startswith(o)), kv[0])
        )
    )
    if full:
        return kinds
    return {k: sorted({v[0], v[-1]}, key=v.index)[:QUICK_PER_KIND] for k, v in kinds.items()}


#: output columns of W decoded to fp64 at once: a 151k-row lm_head would be 5 GiB in fp64, a block of 2048 columns
#: of a 4096-wide input 64 MiB (the Hadamard on the right acts within 128-column blocks, so any multiple of 128 cuts)
BLOCK_COLS = 2048


def exact_blocks(
    trellis: torch.Tensor, suh: torch.Tensor, svh: torch.Tensor, codebook: str
) -> Iterator[tuple[int, torch.Tensor]]:
    """(first column, fp64 W[:, block]) of W = diag(suh) . Hk . W_hat . Hn . diag(svh) (SPEC 4), block by block,
    W_hat from the bit-exact reference decoder.

    On the trellis's device: the decoder is integer arithmetic and table lookups, bit-exact on any device, and the
    rest is fp64, so on a GPU it is the same reference, only about a hundred times faster (a 151k-row lm_head on the
    CPU took minutes, which made `verify` on a real pack time out)."""
    from sparkctl_exl3 import reference

    h = reference.hadamard_128(trellis.device, dtype=torch.float64)
    suh, svh = suh.to(trellis.device).double(), svh.to(trellis.device).double()
    tiles = BLOCK_COLS // 16
    for t0 in range(0, trellis.shape[1], tiles):
        w = reference.w_hat(trellis[:, t0 : t0 + tiles].contiguous(), codebook).double()
        i, o = w.shape
        w = (h @ w.reshape(i // 128, 128, o)).reshape(i, o)
        w = (w.reshape(i, o // 128, 128) @ h).reshape(i, o)
        yield 16 * t0, w * suh[:, None] * svh[16 * t0 : 16 * t0 + o][None, :]


def exact_product(x: torch.Tensor, w) -> torch.Tensor:  # noqa: ANN001 (ShardWeights)
    """x (any dtype) . W in fp64, W decoded block by block where its trellis lives; the result on the CPU."""
    xd = x.double().to(w.trellis.device)
    return torch.cat([(xd @ b).cpu() for _, b in exact_blocks(w.trellis, w.suh, w.svh, w.codebook)], dim=1)


def rel_l2(y: torch.Tensor, ref: torch.Tensor) -> float:
    y64, r64 = y.detach().double().cpu(), ref.double().cpu()
    if not torch.isfinite(y64).all():
        return float("inf")
    return float((y64 - r64).norm() / r64.norm().clamp_min(1e-30))


@dataclass
class Device:
    """Where the plugin's path runs here, and what that path is."""

    name: str  # cpu | cuda
    label: str  # for the record and the table
    kernels: bool  # our compiled kernels (else the reference decoder, on that device)

    @property
    def torch(self) -> torch.device:
        return torch.device(self.name)


def pick_device(want: str = "auto") -> Device:
    """CUDA with the extension built when there is one (or `want` says cuda), else the CPU path."""
    if want != "cpu" and torch.cuda.is_available():
        from sparkctl_exl3 import ops

        kernel = ops.cuda_kernel()
        name = torch.cuda.get_device_name()
        if kernel is not None:
            return Device("cuda", f"cuda: {name} (sparkctl_exl3 kernels)", True)
        return Device("cuda", f"cuda: {name} (kernels not built: reference decoder on the GPU)", False)
    if want == "cuda":
        from sparkctl.errors import UserError

        raise UserError("--device cuda: no CUDA device here")
    return Device(
        "cpu",
        "cpu (no GPU: the plugin's CPU path, the reference decoder in fp32; kernels not checked)",
        False,
    )


def _load(pack: Pack, prefix: str) -> dict[str, torch.Tensor]:
    return {leaf: pack.reader.tensor(name) for leaf, name in pack.modules[prefix].items()}


def check_linears(
    pack: Pack, chosen: dict[str, list[str]], dev: Device, progress: Callable[[str], None]
) -> list[Check]:
    """One row per module kind: every chosen module at 1 and 8 rows (and, on CUDA, its reconstruction)."""
    from sparkctl_exl3.vllm_plugin.forward import exl3_linear, finish_shard

    gen = torch.Generator().manual_seed(SEED)
    out: list[Check] = []
    for kind, prefixes in chosen.items():
        c = Check("kernels", kind, bound=LINEAR_BOUND[dev.name], unit="rel L2")
        taken = _PathCount()
        c.note = (
            "GEMV rows 1, 8 + reconstruction (CUDA)"
            if dev.kernels
            else f"rows 1, 8 on {dev.name} (reference path)"
        )
        for prefix in prefixes:
            progress(f"kernels: {prefix}")
            tensors = _load(pack, prefix)
            try:
                w = finish_shard(prefix, tensors)
            except ValueError as exc:
                c.fail(prefix, str(exc))
                continue
            c.checked += 1
            i, o = int(w.suh.shape[0]), int(w.svh.shape[0])
            wd = _to(w, dev)
            op_dtype = torch.float16 if dev.name == "cuda" else torch.float32
            xs = [torch.randn(rows, i, generator=gen) for rows in LINEAR_ROWS]
            wr = None
            if dev.kernels:
                from sparkctl_exl3 import cuda, ops

                wr = cuda.weight(wd.trellis, wd.suh, wd.svh, ops.CODEBOOKS[w.codebook])
            # one decode of W serves both the rows' reference and the reconstruction's
            xd = torch.cat(xs).double().to(dev.torch)
            cols, num, den = [], 0.0, 0.0
            for c0, b in exact_blocks(wd.trellis, wd.suh, wd.svh, w.codebook):
                cols.append((xd @ b).cpu())
                if wr is not None:
                    got = wr[:, c0 : c0 + b.shape[1]].double()
                    num += float((got - b).pow(2).sum()) if torch.isfinite(got).all() else float("inf")
                    den += float(b.pow(2).sum())
            refs = torch.cat(cols, dim=1).split(list(LINEAR_ROWS))
            for x, ref in zip(xs, refs, strict=True):
                y = exl3_linear(x.to(dev.torch), wd, o, op_dtype)
                c.error(rel_l2(y, ref), prefix, f"rel L2 at {x.shape[0]} rows")
                c.abs_error(y, ref)
            if wr is not None:
                err = (num / max(den, 1e-300)) ** 0.5
                del wr
                if not err <= RECON_BOUND:
                    c.fail(prefix, f"reconstruction rel L2 {err:.3g} > bound {RECON_BOUND:.3g}")
                c.worst = max(c.worst or 0.0, err)
        c.note += taken.done()
        out.append(c)
    return out


class _PathCount:
    """Which compute paths (`sparkctl_exl3.paths`) the calls of one row took: a kernel that does not take a shape
    falls back to the reference silently (right numbers, slow), and the row should say so."""

    def __init__(self) -> None:
        from sparkctl_exl3 import paths

        self.paths = paths
        self.before = paths.counts()

    def done(self) -> str:
        now = self.paths.counts()
        used = {k: v - self.before.get(k, 0) for k, v in now.items() if v - self.before.get(k, 0) > 0}
        return "; paths: " + ", ".join(f"{k} x{v}" for k, v in sorted(used.items())) if used else ""


def _to(w, dev: Device):  # noqa: ANN001, ANN202 (ShardWeights, imported lazily)
    from sparkctl_exl3.vllm_plugin.forward import ShardWeights

    if dev.name == "cpu":
        return w
    t = dev.torch
    return ShardWeights(w.trellis.to(t), w.suh.to(t), w.svh.to(t), w.codebook, w.bits)


_PROJ = {"gate": ("w1", "gate_proj"), "up": ("w3", "up_proj"), "down": ("w2", "down_proj")}


def moe_layers(pack: Pack, facts: dict[str, ModuleFacts]) -> dict[str, dict[int, dict[str, str]]]:
    """MoE layers of the pack: '<...>.experts' head -> expert id -> projection (gate/up/down) -> module prefix."""
    layers: dict[str, dict[int, dict[str, str]]] = {}
    for prefix in facts:
        m = re.match(r"(.*\.experts)\.(\d+)\.(\w+)$", prefix)
        if not m:
            continue
        proj = next((k for k, names in _PROJ.items() if m.group(3) in names), None)
        if proj is not None:
            layers.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[proj] = prefix
    return layers


def _router(pack: Pack, head: str) -> str | None:
    parent = head.rpartition(".")[0]
    for name in (f"{parent}.gate.weight", f"{parent}.router.weight", f"{parent}.gate.wg.weight"):
        if name in pack.reader.where:
            return name
    return None


class _ExpertsFp64:
    """The routed experts' weighted sum in fp64. Expert by expert: only the experts some token chose are decoded,
    each once per call and dropped after (256 experts of a large MoE in fp64 would not fit beside a server)."""

    def __init__(self, experts: dict) -> None:
        self.experts = experts  # on the device the check runs on: the reference decodes there

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, topk_ids: torch.Tensor) -> torch.Tensor:
        xd = x.double()
        out: torch.Tensor | None = None
        for e in sorted({int(i) for i in topk_ids.flatten()}):
            tok, slot = (topk_ids == e).nonzero(as_tuple=True)
            ex = self.experts[e]
            h = torch.nn.functional.silu(exact_product(xd[tok], ex.gate))
            if ex.up is not None:
                h = h * exact_product(xd[tok], ex.up)
            y = exact_product(h, ex.down) * weights[tok, slot].double()[:, None]
            out = torch.zeros(x.shape[0], y.shape[1], dtype=torch.float64) if out is None else out
            out.index_add_(0, tok, y)
        assert out is not None
        return out


def check_moe(
    pack: Pack, facts: dict[str, ModuleFacts], full: bool, dev: Device, progress: Callable[[str], None]
) -> Check:
    """Routed experts through `exl3_moe_forward` with the pack's own router, against the fp64 sum of the experts."""
    from sparkctl_exl3.vllm_plugin.forward import ExpertWeights, exl3_moe_forward, finish_shard, fused_tables

    c = Check("kernels", "MoE forward (routed)", bound=MOE_BOUND[dev.name], unit="rel L2")
    layers = moe_layers(pack, facts)
    if not layers:
        c.verdict, c.note = SKIP, "no routed experts in this pack"
        return c
    heads = sorted(layers, key=lambda h: [int(n) if n.isdigit() else n for n in re.split(r"(\d+)", h)])
    if not full:
        heads = heads[:1]
    cfg = text_config(pack.config)
    top_k = int(cfg.get("num_experts_per_tok") or 2)
    gen = torch.Generator().manual_seed(SEED + 1)
    taken = _PathCount()
    for head in heads:
        progress(f"kernels: {head} (MoE)")
        ids = sorted(layers[head])
        try:
            experts = [
                ExpertWeights(
                    finish_shard(layers[head][e]["gate"], _load(pack, layers[head][e]["gate"])),
                    finish_shard(layers[head][e]["up"], _load(pack, layers[head][e]["up"]))
                    if "up" in layers[head][e]
                    else None,
                    finish_shard(layers[head][e]["down"], _load(pack, layers[head][e]["down"])),
                )
                for e in ids
            ]
        except (KeyError, ValueError) as exc:
            c.fail(head, f"experts do not load as the plugin loads them: {exc}")
            continue
        c.checked += 1
        hidden, inter = experts[0].gate.suh.shape[0], experts[0].gate.svh.shape[0]
        router = _router(pack, head)
        gate = pack.reader.tensor(router).float() if router else None
        dexperts = [
            ExpertWeights(_to(e.gate, dev), _to(e.up, dev) if e.up else None, _to(e.down, dev))
            for e in experts
        ]
        fused = fused_tables(dexperts, ids, hidden=hidden, intermediate=inter) if dev.name == "cuda" else None
        reference = _ExpertsFp64(dict(zip(ids, dexperts, strict=True)))
        for tokens in MOE_TOKENS if not full else (*MOE_TOKENS, 33, 80):
            x = torch.randn(tokens, hidden, generator=gen)
            if gate is not None and gate.shape[-1] == hidden:
                logits = x @ gate.T
            else:
                logits = torch.randn(tokens, len(ids), generator=gen)
            k = min(top_k, len(ids))
            weights, slot = torch.softmax(logits, -1).topk(k, dim=-1)
            weights = weights / weights.sum(-1, keepdim=True)
            topk_ids = torch.tensor(ids)[slot].to(torch.int32)
            y = exl3_moe_forward(
                x.to(dev.torch),
                weights.to(dev.torch),
                topk_ids.to(dev.torch),
                dexperts,
                ids,
                hidden=hidden,
                intermediate=inter,
                activation="silu",
                fused=fused,
            )
            ref = reference(x, weights, topk_ids)
            c.error(rel_l2(y, ref), head, f"rel L2 at {tokens} tokens")
            c.abs_error(y, ref)
    c.note = f"{'1..8' if not full else '1..8, 33, 80'} tokens, the pack's router{taken.done()}"
    return c


def check_ngram(pack: Pack, full: bool, dev: Device, progress: Callable[[str], None]) -> Check:
    """Rows of each n-gram table through the lookup op against an fp64 decode of the same words (must be exact)."""
    c = Check("kernels", "n-gram rows", bound=0.0, unit="max |diff|")
    if not pack.ngram:
        c.verdict, c.note = SKIP, "no n-gram table in this pack"
        return c
    from sparkctl_exl3 import ngram, reference

    if dev.name == "cuda":
        from sparkctl_exl3 import ngram_cuda  # noqa: F401 (registers the CUDA kernel for the op)
    where = pack.reader.where
    for prefix in sorted(pack.ngram):
        progress(f"kernels: {prefix} (n-gram)")
        leaves = pack.modules[prefix]
        offsets = pack.reader.tensor(leaves["head_offsets"]).to(torch.int64)
        bias = pack.reader.tensor(leaves["head_bias"])
        shards = []
        while f"{prefix}.shard_{len(shards)}.trellis" in where:
            shards.append(f"{prefix}.shard_{len(shards)}.trellis")
        shards = shards or [leaves["trellis"]]
        base = 0
        for name in shards:
            rows = where[name].shape[0]
            spans = (
                [(0, rows)]
                if full
                else sorted({(0, min(NGRAM_SAMPLE, rows)), (max(0, rows - NGRAM_SAMPLE), rows)})
            )
            for lo, hi in spans:
                block = _rows(pack, name, lo, hi)
                c.checked += hi - lo
                glob = torch.arange(base + lo, base + hi)
                heads = (torch.searchsorted(offsets, glob, right=True) - 1).clamp(0, offsets.shape[0] - 1)
                states, scales = ngram.unpack_rows(block, bias.shape[-1])
                table = reference.decode_table("mul1").double()
                want = (table[states] * scales.double()[:, None] + bias.double()[heads]).to(torch.float16)
                # the op with the block as its one shard: rows and head starts shifted by the block's start
                got = torch.ops.sparkctl_exl3.ngram_lookup(
                    (glob - base - lo).to(dev.torch),
                    [block.to(dev.torch)],
                    (offsets - base - lo).to(dev.torch),
                    bias.to(dev.torch),
                    hi - lo,
                )
                diff = (got.cpu().float() - want.float()).abs()
                worst = float(diff.max()) if diff.numel() else 0.0
                if not torch.isfinite(got.cpu().float()).all():
                    worst = float("inf")
                c.error(worst, f"{prefix} rows {base + lo}..{base + hi - 1}", "max |diff|")
            base += rows
    c.note = (
        f"{'every row' if full else f'{NGRAM_SAMPLE} rows at each end of every shard'}; lookup on {dev.name}"
    )
    return c


def _rows(pack: Pack, name: str, lo: int, hi: int) -> torch.Tensor:
    """Rows lo..hi of a 2-D int16 tensor, reading only their bytes."""
    info = pack.reader.where[name]
    width = info.shape[1] * 2
    with open(info.file, "rb") as f:
        f.seek(info.start + lo * width)
        data = f.read((hi - lo) * width)
    pack.reader.bytes_read += len(data)
    return torch.frombuffer(bytearray(data), dtype=torch.int16).reshape(hi - lo, info.shape[1])


def run(
    pack: Pack,
    facts: dict[str, ModuleFacts],
    *,
    full: bool,
    device: str = "auto",
    progress: Callable[[str], None] = lambda _m: None,
) -> tuple[list[Check], Device, float]:
    """The kernel layer's rows, the device they ran on, and the seconds it took."""
    t0 = time.monotonic()
    dev = pick_device(device)
    chosen = sample(pack, facts, full)
    checks = check_linears(pack, chosen, dev, progress)
    checks.append(check_moe(pack, facts, full, dev, progress))
    checks.append(check_ngram(pack, full, dev, progress))
    return checks, dev, time.monotonic() - t0
