"""Whole-model forward of the real exllamav3 fixtures through the plugin's layer functions, without vLLM.

``plugin_gpu_check.py`` uses this to hold the plugin's GPU path to exllamav3's own logits
(``tests/fixtures/exl3_real/*/exl3_reference.safetensors``), on a device machine where vLLM is not installed.
vLLM with the plugin meets the same bar on the CPU (``tests/plugin/test_exl3_real_fixtures.py``); this checks
the CUDA kernels in the same place vLLM would put them, so a kernel that passes its layer checks but breaks a
model (a shard order, an expert id, a fused-MoE routing slot) shows up as wrong tokens.

Why a small torch forward and not vLLM's or transformers' model classes: neither is installed on the device,
and the pieces around the EXL3 layers are few and standard. What is the plugin's and what is plain torch:

* every EXL3 linear goes through ``vllm_plugin.forward.finish_shard`` (at load) and ``exl3_linear`` per shard,
  with the outputs concatenated, then cast and biased, exactly as ``EXL3LinearMethod.apply`` does for the layers
  vLLM merges: ``qkv_proj`` = [q, k, v] and ``gate_up_proj`` = [gate, up] (then vLLM's ``SiluAndMul`` on the
  merged output), the lm_head a single shard of the vocabulary width;
* every MoE layer's routed experts go through ``exl3_moe_forward`` with the arguments ``EXL3MoEMethod.apply``
  passes: global expert ids, the experts stacked once for the CPU (``stack_experts``) and the fused MoE's device
  tables made once for CUDA (``fused_tables``), routing weights fp32 and ids int32 as vLLM's router returns them;
* plain torch, in ``dtype`` (fp32 by default): the embedding, RMSNorm, RoPE (NeoX, partial as the config says),
  causal GQA attention over a packed batch, the routers (softmax top-k for Qwen3-MoE; sigmoid scores, selection
  bias, groups, renormalisation and ``routed_scaling_factor`` for GLM-4-MoE), and any module stored as a plain
  ``.weight`` (the routers here).

Three ways through the prompts, because the plugin takes a different kernel path at each batch shape:

* ``prefill``: each prompt alone (18-49 rows: the GEMM/GEMV prefill split, the fused MoE decode up to 64 tokens);
* ``batched``: all prompts packed into one forward (140 rows, a block-diagonal causal mask: vLLM's mixed prefill
  batch, the MoE prefill path);
* ``decode``: all prompts one token per step together with a KV cache (1-5 rows: the GEMV kernel and the fused MoE
  decode, what generation runs).

Pass: per fixture and way, the top-1 token agrees with exllamav3's argmax on at least ``TOP1_MIN`` of the
positions and the prompt tokens' log-probabilities are within ``DLOGPROB_MAX`` of exllamav3's on average (the
bar of the vLLM test). The CPU run (reference decoder, fp32) meets it too; ``tests/kernels/test_fixture_forward.py``
holds it there.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # kernels/ on the path without installing

from sparkctl_exl3.vllm_plugin.forward import (  # noqa: E402
    ExpertStack,
    ExpertWeights,
    ShardWeights,
    exl3_linear,
    exl3_moe_forward,
    finish_shard,
    fused_tables,
    op_dtype_for,
    stack_experts,
)

TOP1_MIN = 0.98
DLOGPROB_MAX = 0.05
ARCHITECTURES = ("LlamaForCausalLM", "Qwen3MoeForCausalLM", "Glm4MoeForCausalLM", "MixtralForCausalLM")
MODES = ("prefill", "batched", "decode")
FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "exl3_real"
EXL3_LEAVES = ("trellis", "suh", "svh", "mcg", "mul1")


class FixtureError(ValueError):
    """A fixture this forward cannot run (an unsupported config value, a missing or inconsistent tensor)."""


# -- config --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelConfig:
    """What the forward needs from config.json, with each architecture's defaults and rules (HF's)."""

    arch: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    eps: float
    rope_theta: float
    rotary_dim: int
    qk_norm: bool
    attention_bias: bool
    vocab: int
    tie_embeddings: bool
    intermediate: int
    moe_layers: frozenset[int] = frozenset()
    experts: int = 0
    top_k: int = 0
    moe_intermediate: int = 0
    norm_topk_prob: bool = True
    scoring: str = "softmax"  # "softmax" (Qwen3-MoE) | "sigmoid" (GLM-4-MoE, DeepSeek-V3 style)
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    shared_intermediate: int = 0
    nextn_layers: int = 0  # MTP draft layers stored after the target's (num_nextn_predict_layers)
    moe_module: str = "mlp"  # a MoE layer's module under model.layers.<i> (Mixtral: block_sparse_moe)
    expert_projs: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")  # Mixtral: w1, w3, w2


def read_config(model_dir: Path) -> ModelConfig:
    """The model's config; FixtureError for an architecture or a setting this forward does not implement."""
    cfg = json.loads((model_dir / "config.json").read_text())
    archs = cfg.get("architectures") or ["?"]
    arch = archs[0]
    if arch not in ARCHITECTURES:
        raise FixtureError(f"architecture {arch} is not one this forward knows ({', '.join(ARCHITECTURES)})")
    rope = cfg.get("rope_scaling") or {}
    if (rope.get("rope_type") or rope.get("type") or "default") != "default":
        raise FixtureError(f"rope_scaling {rope} is not implemented here (only the default RoPE)")
    if cfg.get("hidden_act", "silu") != "silu":
        raise FixtureError(f"hidden_act {cfg['hidden_act']!r}: only silu is implemented here")
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    layers = int(cfg["num_hidden_layers"])
    common = {
        "arch": arch,
        "hidden": hidden,
        "heads": heads,
        "kv_heads": int(cfg.get("num_key_value_heads") or heads),
        "head_dim": head_dim,
        "layers": layers,
        "nextn_layers": int(cfg.get("num_nextn_predict_layers") or 0),
        "eps": float(cfg["rms_norm_eps"]),
        "rope_theta": float(cfg.get("rope_theta", 10000.0)),
        "rotary_dim": int(head_dim * float(cfg.get("partial_rotary_factor", 1.0))),
        "attention_bias": bool(cfg.get("attention_bias", False)),
        "vocab": int(cfg["vocab_size"]),
        "tie_embeddings": bool(cfg.get("tie_word_embeddings", False)),
        "intermediate": int(cfg.get("intermediate_size", 0)),
    }
    if arch == "LlamaForCausalLM":
        if cfg.get("mlp_bias"):
            raise FixtureError("mlp_bias is not implemented here")
        return ModelConfig(**common, qk_norm=False)
    if (
        arch == "MixtralForCausalLM"
    ):  # sparkctl's tiny-exl3-moe (`sparkctl verify` checks its engine with this)
        return ModelConfig(
            **common,
            qk_norm=False,
            moe_layers=frozenset(range(layers)),
            experts=int(cfg["num_local_experts"]),
            top_k=int(cfg["num_experts_per_tok"]),
            moe_intermediate=int(cfg["intermediate_size"]),
            norm_topk_prob=True,
            scoring="softmax",
            moe_module="block_sparse_moe",
            expert_projs=("w1", "w3", "w2"),
        )
    if arch == "Qwen3MoeForCausalLM":
        step = int(cfg.get("decoder_sparse_step", 1))
        dense = set(cfg.get("mlp_only_layers") or [])
        experts = int(cfg["num_experts"])
        moe = {i for i in range(layers) if i not in dense and experts > 0 and (i + 1) % step == 0}
        return ModelConfig(
            **common,
            qk_norm=True,
            moe_layers=frozenset(moe),
            experts=experts,
            top_k=int(cfg["num_experts_per_tok"]),
            moe_intermediate=int(cfg["moe_intermediate_size"]),
            norm_topk_prob=bool(cfg.get("norm_topk_prob", False)),
            scoring="softmax",
        )
    # Glm4MoeForCausalLM
    if cfg.get("topk_method", "noaux_tc") != "noaux_tc":
        raise FixtureError(f"topk_method {cfg['topk_method']!r} is not implemented here")
    return ModelConfig(
        **common,
        qk_norm=bool(cfg.get("use_qk_norm", False)),
        moe_layers=frozenset(range(int(cfg.get("first_k_dense_replace", 1)), layers)),
        experts=int(cfg["n_routed_experts"]),
        top_k=int(cfg["num_experts_per_tok"]),
        moe_intermediate=int(cfg["moe_intermediate_size"]),
        norm_topk_prob=bool(cfg.get("norm_topk_prob", True)),
        scoring="sigmoid",
        n_group=int(cfg.get("n_group") or 1),
        topk_group=int(cfg.get("topk_group") or 1),
        routed_scaling_factor=float(cfg.get("routed_scaling_factor", 1.0)),
        shared_intermediate=int(cfg["moe_intermediate_size"]) * int(cfg.get("n_shared_experts") or 0),
    )


# -- layers ----------------------------------------------------------------------------------------


@dataclass
class Linear:
    """One vLLM linear layer: EXL3 shards merged in vLLM's order, or a plain ``weight [out, in]``."""

    name: str
    shards: list[ShardWeights]
    out_sizes: list[int]
    bias: torch.Tensor | None = None
    weight: torch.Tensor | None = None
    rows: Counter = field(default_factory=Counter)  # rows per call, for the report

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.rows[x.shape[0]] += 1
        if self.weight is not None:
            y = x @ self.weight.T
        else:
            # EXL3LinearMethod.apply, line for line (kept in step by tests/plugin/test_fixture_forward_apply.py)
            dtype = op_dtype_for(x)
            outs = [exl3_linear(x, w, out, dtype) for w, out in zip(self.shards, self.out_sizes, strict=True)]
            y = outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
            y = y.to(x.dtype)
        if self.bias is not None:
            y = y + self.bias
        return y


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


@dataclass
class DenseMLP:
    """SwiGLU through one merged ``gate_up_proj`` (vLLM's MergedColumnParallelLinear + SiluAndMul)."""

    gate_up: Linear
    down: Linear

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        h = self.gate_up(x)
        d = h.shape[-1] // 2
        return self.down(F.silu(h[..., :d]) * h[..., d:])


@dataclass
class MoE:
    """Router in plain torch, routed experts through ``exl3_moe_forward``, shared expert (if any) added after."""

    cfg: ModelConfig
    gate: torch.Tensor  # [experts, hidden], plain
    score_bias: torch.Tensor | None  # e_score_correction_bias [experts], selection only
    experts: list[ExpertWeights]
    expert_ids: list[int]
    stack: ExpertStack | None
    fused: object | None
    shared: DenseMLP | None
    tokens: Counter = field(default_factory=Counter)

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights fp32 [T, k], global expert ids int32 [T, k]) as the architecture's router computes them."""
        c = self.cfg
        logits = x.float() @ self.gate.float().T
        if c.scoring == "softmax":
            weights, ids = torch.softmax(logits, dim=-1).topk(c.top_k, dim=-1)
            if c.norm_topk_prob:
                weights = weights / weights.sum(-1, keepdim=True)
            return weights, ids.to(torch.int32)
        scores = logits.sigmoid()
        choice = scores if self.score_bias is None else scores + self.score_bias.float()[None]
        if c.n_group > 1:
            tokens = choice.shape[0]
            grouped = choice.view(tokens, c.n_group, -1)
            group_score = grouped.topk(2, dim=-1).values.sum(-1)
            keep = group_score.topk(c.topk_group, dim=-1).indices
            mask = torch.zeros(tokens, c.n_group, dtype=torch.bool, device=x.device).scatter_(1, keep, True)
            choice = choice.masked_fill(~mask.repeat_interleave(c.experts // c.n_group, dim=1), float("-inf"))
        ids = choice.topk(c.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if c.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * c.routed_scaling_factor, ids.to(torch.int32)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.tokens[x.shape[0]] += 1
        weights, ids = self.route(x)
        y = exl3_moe_forward(
            x,
            weights,
            ids,
            self.experts,
            self.expert_ids,
            hidden=x.shape[-1],
            intermediate=self.cfg.moe_intermediate,
            activation="silu",
            stack=self.stack,
            fused=self.fused,
        )
        return y if self.shared is None else y + self.shared(x)


@dataclass
class KVCache:
    """Keys and values of every (sequence, position) seen so far, per layer, packed along one axis."""

    k: list[torch.Tensor | None]
    v: list[torch.Tensor | None]
    seq: torch.Tensor
    pos: torch.Tensor


@dataclass
class Block:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: Linear
    o: Linear
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    mlp: DenseMLP | MoE


# -- model -----------------------------------------------------------------------------------------


class FixtureModel:
    """One fixture's checkpoint on ``device``, every EXL3 module loaded the way the plugin loads it."""

    def __init__(self, model_dir: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        from safetensors.torch import load_file

        self.cfg = cfg = read_config(model_dir)
        self.device, self.dtype = device, dtype
        tensors: dict[str, torch.Tensor] = {}
        for f in sorted(model_dir.glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        self._groups: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in tensors.items():
            prefix, _, leaf = name.rpartition(".")
            self._groups.setdefault(prefix, {})[leaf] = t
        self._used: set[str] = set()
        self.linears: list[Linear] = []
        self.moes: list[MoE] = []
        self.embed = self._plain("model.embed_tokens.weight")
        q, kv = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
        self.blocks: list[Block] = []
        for i in range(cfg.layers):
            p = f"model.layers.{i}"
            attn = f"{p}.self_attn"
            qkv = self._linear(
                f"{attn}.qkv_proj", [f"{attn}.q_proj", f"{attn}.k_proj", f"{attn}.v_proj"], [q, kv, kv]
            )
            if cfg.attention_bias != (qkv.bias is not None):
                raise FixtureError(
                    f"{attn}: attention_bias is {cfg.attention_bias} but q/k/v bias present is "
                    f"{qkv.bias is not None}"
                )
            self.blocks.append(
                Block(
                    input_norm=self._plain(f"{p}.input_layernorm.weight"),
                    post_norm=self._plain(f"{p}.post_attention_layernorm.weight"),
                    qkv=qkv,
                    o=self._linear(f"{attn}.o_proj", [f"{attn}.o_proj"], [cfg.hidden]),
                    q_norm=self._plain(f"{attn}.q_norm.weight") if cfg.qk_norm else None,
                    k_norm=self._plain(f"{attn}.k_norm.weight") if cfg.qk_norm else None,
                    mlp=self._moe(f"{p}.{cfg.moe_module}")
                    if i in cfg.moe_layers
                    else self._mlp(f"{p}.mlp", cfg.intermediate),
                )
            )
        self.norm = self._plain("model.norm.weight")
        if "lm_head" in self._groups:
            self.lm_head = self._linear("lm_head", ["lm_head"], [cfg.vocab])
        elif cfg.tie_embeddings:
            self.lm_head = Linear("lm_head", [], [cfg.vocab], weight=self.embed)
        else:
            raise FixtureError("no lm_head in the checkpoint and tie_word_embeddings is false")
        # the MTP draft's layers (model.layers.N.. past the target's N) are not part of the target's logits; vLLM
        # runs them only as the speculative draft (tests/plugin/test_exl3_real_mtp.py serves them)
        draft = tuple(f"model.layers.{cfg.layers + j}." for j in range(cfg.nextn_layers))
        self.draft_tensors = sorted(t for t in tensors if draft and t.startswith(draft))
        unused = sorted(set(tensors) - self._used - set(self.draft_tensors))
        if unused:  # a tensor the forward never read means a module it does not model
            raise FixtureError(
                f"tensors this forward does not use: {', '.join(unused[:8])}"
                + (f" (+{len(unused) - 8})" if len(unused) > 8 else "")
            )
        rd = cfg.rotary_dim
        exponent = torch.arange(0, rd, 2, dtype=torch.int64, device=device).float() / rd
        self.inv_freq = 1.0 / (cfg.rope_theta**exponent)

    # loading helpers

    def _plain(self, name: str) -> torch.Tensor:
        prefix, _, leaf = name.rpartition(".")
        t = self._groups.get(prefix, {}).get(leaf)
        if t is None:
            raise FixtureError(f"{name}: not in the checkpoint")
        self._used.add(name)
        return t.to(device=self.device, dtype=self.dtype if t.is_floating_point() else t.dtype)

    def _linear(self, label: str, names: list[str], out_sizes: list[int]) -> Linear:
        """The layer vLLM would build from these checkpoint modules (merged in this order)."""
        groups = []
        for n in names:
            g = self._groups.get(n)
            if g is None:
                raise FixtureError(f"{n}: not in the checkpoint")
            groups.append((n, g))
        exl3 = ["trellis" in g for _, g in groups]
        biases = [g.get("bias") for _, g in groups]
        if any(b is not None for b in biases) and not all(b is not None for b in biases):
            raise FixtureError(f"{label}: some of {names} have a bias and some do not")
        bias = None
        if biases[0] is not None:
            bias = torch.cat([b for b in biases if b is not None]).to(self.device, self.dtype)
            self._used.update(f"{n}.bias" for n in names)
        if all(exl3):
            shards = []
            for n, g in groups:
                got = {leaf: t.to(self.device).contiguous() for leaf, t in g.items() if leaf in EXL3_LEAVES}
                shards.append(finish_shard(n, got))
                self._used.update(f"{n}.{leaf}" for leaf in got)
            self.linears.append(Linear(label, shards, out_sizes, bias=bias))
            return self.linears[-1]
        if not any(exl3) and all("weight" in g for _, g in groups):
            weight = torch.cat([self._plain(f"{n}.weight") for n, _ in groups])
            self.linears.append(Linear(label, [], out_sizes, bias=bias, weight=weight))
            return self.linears[-1]
        raise FixtureError(f"{label}: {names} mix EXL3 and plain modules (or lack both)")

    def _mlp(self, p: str, intermediate: int) -> DenseMLP:
        return DenseMLP(
            self._linear(
                f"{p}.gate_up_proj", [f"{p}.gate_proj", f"{p}.up_proj"], [intermediate, intermediate]
            ),
            self._linear(f"{p}.down_proj", [f"{p}.down_proj"], [self.cfg.hidden]),
        )

    def _moe(self, p: str) -> MoE:
        cfg = self.cfg
        experts = []
        for e in range(cfg.experts):
            shard = {}
            for proj in cfg.expert_projs:
                name = f"{p}.experts.{e}.{proj}"
                group = self._groups.get(name)
                if group is None or "trellis" not in group:
                    raise FixtureError(f"{name}: not an EXL3 module in the checkpoint")
                got = {
                    leaf: t.to(self.device).contiguous() for leaf, t in group.items() if leaf in EXL3_LEAVES
                }
                shard[proj] = finish_shard(name, got)
                self._used.update(f"{name}.{leaf}" for leaf in got)
            gate, up, down = (shard[proj] for proj in cfg.expert_projs)
            experts.append(ExpertWeights(gate, up, down))
        ids = list(range(cfg.experts))
        has_bias = "e_score_correction_bias" in self._groups.get(f"{p}.gate", {})
        self.moes.append(
            MoE(
                cfg=cfg,
                gate=self._plain(f"{p}.gate.weight"),
                score_bias=self._plain(f"{p}.gate.e_score_correction_bias") if has_bias else None,
                experts=experts,
                expert_ids=ids,
                stack=None if self.device.type == "cuda" else stack_experts(experts),
                fused=fused_tables(experts, ids, hidden=cfg.hidden, intermediate=cfg.moe_intermediate),
                shared=self._mlp(f"{p}.shared_experts", cfg.shared_intermediate)
                if cfg.shared_intermediate
                else None,
            )
        )
        return self.moes[-1]

    # forward

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """NeoX-style rotation of the first ``rotary_dim`` channels of every head (x [T, H, D])."""
        rd = self.cfg.rotary_dim
        freqs = pos.float()[:, None] * self.inv_freq[None]
        cos, sin = freqs.cos()[:, None], freqs.sin()[:, None]
        xf = x.float()
        x1, x2, rest = xf[..., : rd // 2], xf[..., rd // 2 : rd], xf[..., rd:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1).to(x.dtype)

    def _attention(
        self, i: int, b: Block, x: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, cache: KVCache
    ) -> torch.Tensor:
        c = self.cfg
        tokens = x.shape[0]
        q, k, v = b.qkv(x).split([c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], -1)
        q = q.reshape(tokens, c.heads, c.head_dim)
        k = k.reshape(tokens, c.kv_heads, c.head_dim)
        v = v.reshape(tokens, c.kv_heads, c.head_dim)
        if b.q_norm is not None and b.k_norm is not None:
            q, k = rms_norm(q, b.q_norm, c.eps), rms_norm(k, b.k_norm, c.eps)
        q, k = self._rope(q, pos), self._rope(k, pos)
        prev_k, prev_v = cache.k[i], cache.v[i]
        cache.k[i] = keys = k if prev_k is None else torch.cat((prev_k, k))
        cache.v[i] = values = v if prev_v is None else torch.cat((prev_v, v))
        rep = c.heads // c.kv_heads  # query head h reads kv head h // rep (HF's repeat_kv)
        keys, values = (
            keys.repeat_interleave(rep, dim=1).float(),
            values.repeat_interleave(rep, dim=1).float(),
        )
        scores = torch.einsum("thd,nhd->htn", q.float(), keys) * c.head_dim**-0.5
        allowed = (cache.seq[None] == seq[:, None]) & (cache.pos[None] <= pos[:, None])
        probs = torch.softmax(scores.masked_fill(~allowed[None], float("-inf")), dim=-1)
        out = torch.einsum("htn,nhd->thd", probs, values).reshape(tokens, c.heads * c.head_dim)
        return b.o(out.to(x.dtype))

    def step(self, ids: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One engine step over packed tokens (``ids``, their sequence and position): fp32 logits [T, vocab]."""
        cache.seq, cache.pos = torch.cat((cache.seq, seq)), torch.cat((cache.pos, pos))
        x = self.embed[ids]
        for i, b in enumerate(self.blocks):
            x = x + self._attention(i, b, rms_norm(x, b.input_norm, self.cfg.eps), seq, pos, cache)
            x = x + b.mlp(rms_norm(x, b.post_norm, self.cfg.eps))
        return self.lm_head(rms_norm(x, self.norm, self.cfg.eps)).float()

    def new_cache(self) -> KVCache:
        empty = torch.zeros(0, dtype=torch.int64, device=self.device)
        return KVCache([None] * self.cfg.layers, [None] * self.cfg.layers, empty, empty)

    @torch.inference_mode()
    def run(self, prompts: list[list[int]], mode: str) -> list[torch.Tensor]:
        """Logits [T, vocab] per prompt (position t predicting token t+1), the prompts fed the ``mode`` way."""
        dev = self.device

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=dev)

        if mode == "prefill":
            return [
                self.step(ints(p), ints([0] * len(p)), ints(list(range(len(p)))), self.new_cache())
                for p in prompts
            ]
        if mode == "batched":
            seq = [s for s, p in enumerate(prompts) for _ in p]
            pos = [t for p in prompts for t in range(len(p))]
            logits = self.step(ints([t for p in prompts for t in p]), ints(seq), ints(pos), self.new_cache())
            return list(logits.split([len(p) for p in prompts]))
        if mode == "decode":
            cache, rows = self.new_cache(), [[] for _ in prompts]
            for t in range(max(len(p) for p in prompts)):
                live = [s for s, p in enumerate(prompts) if t < len(p)]
                out = self.step(ints([prompts[s][t] for s in live]), ints(live), ints([t] * len(live)), cache)
                for s, row in zip(live, out, strict=True):
                    rows[s].append(row)
            return [torch.stack(r) for r in rows]
        raise ValueError(f"unknown mode {mode!r} (one of {', '.join(MODES)})")

    def call_shapes(self) -> dict[str, dict[int, int]]:
        """Rows per call over the EXL3 linears and tokens per call over the MoE layers since the last reset."""
        lin: Counter = Counter()
        moe: Counter = Counter()
        for layer in self.linears:
            if layer.shards:
                lin.update(layer.rows)
        for m in self.moes:
            moe.update(m.tokens)
        return {"linear_rows": dict(sorted(lin.items())), "moe_tokens": dict(sorted(moe.items()))}

    def reset_counts(self) -> None:
        for layer in self.linears:
            layer.rows.clear()
        for m in self.moes:
            m.tokens.clear()


# -- the check -------------------------------------------------------------------------------------


def reference_prompts(fixture: Path) -> list[tuple[list[int], torch.Tensor]]:
    """(token ids, exllamav3's fp32 logits [T, vocab]) per saved prompt."""
    from safetensors.torch import load_file

    ref = load_file(str(fixture / "exl3_reference.safetensors"))
    out, i = [], 0
    while f"prompt.{i}.input_ids" in ref:
        out.append((ref[f"prompt.{i}.input_ids"].tolist(), ref[f"prompt.{i}.logits"].float()))
        i += 1
    if not out:
        raise FixtureError(f"{fixture.name}: exl3_reference.safetensors holds no prompt.<i>.input_ids")
    return out


def compare(reference: list[tuple[list[int], torch.Tensor]], ours: list[torch.Tensor]) -> dict[str, float]:
    """Top-1 agreement over every position and |delta log-prob| of the prompt tokens (the vLLM test's measures)."""
    agree = agree_or_tied = ties = positions = 0
    deltas: list[torch.Tensor] = []
    for (ids, theirs), mine in zip(reference, ours, strict=True):
        mine = mine.detach().float().cpu()
        if mine.shape != theirs.shape:
            raise FixtureError(f"logits shape {tuple(mine.shape)} != exllamav3's {tuple(theirs.shape)}")
        top = mine.argmax(-1)
        agree += int((top == theirs.argmax(-1)).sum())
        # exllamav3's logits are fp16 values: two tokens can tie exactly, and argmax then names the lower id
        best = theirs.max(-1, keepdim=True).values
        agree_or_tied += int((theirs.gather(1, top[:, None]) == best).sum())
        ties += int(((theirs == best).sum(-1) > 1).sum())
        positions += len(ids)
        nxt = torch.arange(len(ids) - 1), torch.tensor(ids[1:])
        deltas.append((torch.log_softmax(mine, -1)[nxt] - torch.log_softmax(theirs, -1)[nxt]).abs())
    d = torch.cat(deltas)
    finite = bool(torch.isfinite(d).all())
    return {
        "positions": positions,
        "top1": agree / positions,
        "top1_ties_counted": agree_or_tied
        / positions,  # information only: the pass uses top1, as the vLLM test
        "exl3_tied_positions": ties,
        "mean_dlogprob": float(d.mean()) if finite else float("inf"),
        "max_dlogprob": float(d.max()) if finite else float("inf"),
    }


def check_fixture(
    fixture: Path, device: torch.device, modes: tuple[str, ...] = MODES, dtype: torch.dtype = torch.float32
) -> list[dict]:
    """One result per mode: the fixture's logits through the plugin on ``device`` against exllamav3's."""
    t0 = time.monotonic()
    model = FixtureModel(fixture / "model", device, dtype)
    reference = reference_prompts(fixture)
    prompts = [ids for ids, _ in reference]
    load_s = time.monotonic() - t0
    results = []
    for mode in modes:
        t1 = time.monotonic()
        model.reset_counts()
        measured = compare(reference, model.run(prompts, mode))
        if device.type == "cuda":
            torch.cuda.synchronize()
        ok = measured["top1"] >= TOP1_MIN and measured["mean_dlogprob"] <= DLOGPROB_MAX
        results.append(
            {
                "fixture": fixture.name,
                "arch": model.cfg.arch,
                "device": str(device),
                "dtype": str(dtype).removeprefix("torch."),
                "mode": mode,
                **measured,
                **model.call_shapes(),
                "fused_moe_layers": sum(m.fused is not None for m in model.moes),
                "load_s": load_s,
                "seconds": time.monotonic() - t1,
                "ok": bool(ok),
            }
        )
    return results


def check_fixtures(
    root: Path = FIXTURES,
    device: torch.device | None = None,
    modes: tuple[str, ...] = MODES,
    names: list[str] | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[list[dict], list[dict]]:
    """(results, skipped) over every fixture folder under ``root`` (or just ``names``).

    A folder without the three parts, or of an architecture this forward does not know, is skipped with the
    reason; a fixture that fails to load or run is a result with ``ok`` false and its error.
    """
    device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if names:
        unknown = set(names) - {p.name for p in folders}
        if unknown:
            raise FixtureError(f"no fixture {', '.join(sorted(unknown))} under {root}")
        folders = [p for p in folders if p.name in names]
    results: list[dict] = []
    skipped: list[dict] = []
    for fixture in folders:
        parts = [
            fixture / "meta.json",
            fixture / "exl3_reference.safetensors",
            fixture / "model" / "config.json",
        ]
        absent = [str(p.relative_to(fixture)) for p in parts if not p.exists()]
        if absent:
            skipped.append({"fixture": fixture.name, "reason": f"incomplete: no {', '.join(absent)}"})
            continue
        arch = (json.loads(parts[2].read_text()).get("architectures") or ["?"])[0]
        if arch not in ARCHITECTURES:
            skipped.append({"fixture": fixture.name, "reason": f"architecture {arch} not implemented here"})
            continue
        try:
            results += check_fixture(fixture, device, modes, dtype)
        except Exception as exc:  # report it as this fixture's failure and go on with the others
            results.append(
                {
                    "fixture": fixture.name,
                    "arch": arch,
                    "device": str(device),
                    "mode": "load",
                    "error": f"{type(exc).__name__}: {exc}",
                    "ok": False,
                }
            )
    return results, skipped


def result_line(r: dict) -> str:
    """One line per fixture and mode: name, device, top-1, mean |dlogprob|, PASS/FAIL."""
    verdict = "PASS" if r["ok"] else "FAIL"
    if "error" in r:
        return f"fixture {r['fixture']:<18} {r['device']:<6} {r['mode']:<8} {verdict}: {r['error']}"
    return (
        f"fixture {r['fixture']:<18} {r['device']:<6} {r['mode']:<8} top-1 {r['top1']:7.2%} "
        f"(>= {TOP1_MIN:.0%})  mean |dlogprob| {r['mean_dlogprob']:.2e} (<= {DLOGPROB_MAX})  "
        f"max {r['max_dlogprob']:.2e}  {r['seconds']:5.1f}s  {verdict}"
    )
