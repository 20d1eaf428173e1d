"""Layer 3: what the running server computes against the plugin's own forward on the same weights.

A few fixed prompts (token ids, so tokenization is out of the picture) go to the server's `/v1/completions` with
vLLM's `prompt_logprobs`, and greedily continue. The same prompts go through a reference forward built from the
plugin's own layer functions (`kernels/bench/fixture_forward.py`: every EXL3 linear through
`vllm_plugin.forward.exl3_linear`, every MoE layer through `exl3_moe_forward`, the rest plain torch) on this
machine's CPU or GPU in fp32. Measured: top-1 agreement of every prompt position, mean |delta log-prob| of the
prompt tokens, and the greedy continuations (a divergence counts only where the reference's top two are apart by
more than `TIE_MARGIN`: a near-tie may go either way in a different summation order).

What this proves: vLLM loads the pack into the layers the plugin owns, in the right order, with the right routing,
and its attention, norms and sampling around them agree with a plain forward. What it does not: the reference
forward knows Llama, Mixtral, Qwen3-MoE and GLM-4-MoE; another architecture is skipped, saying so.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sparkctl.verify.records import SKIP, Check

TOP1_MIN = 0.98
DLOGPROB_MAX = 0.05
TIE_MARGIN = 0.05  # logits: a greedy divergence where the reference's top two are closer is not a failure
GREEDY_TOKENS = 8
PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
)
#: the reference forward holds the whole pack in memory at fp32-sized activations; past this, skip
MAX_REFERENCE_BYTES = 4 << 30


@dataclass
class EngineTarget:
    """A running server of the recipe: where it answers and under which model name."""

    base_url: str
    model: str
    headers: dict[str, str] = field(default_factory=dict)


def _fixture_forward() -> ModuleType:
    """kernels/bench/fixture_forward.py, beside the plugin package (a script, not a module of it)."""
    import sparkctl_exl3

    path = Path(sparkctl_exl3.__file__).resolve().parents[1] / "bench" / "fixture_forward.py"
    name = "sparkctl_verify_fixture_forward"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise FileNotFoundError(f"{path} is not installed beside the plugin")
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


def prompt_ids(model_dir: Path, config: dict[str, Any]) -> list[list[int]]:
    """The fixed prompts as token ids of the pack's own tokenizer, BOS first where the model has one."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    bos = (config.get("text_config") or config).get("bos_token_id")
    out = []
    for text in PROMPTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        if isinstance(bos, int) and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        out.append(ids)
    return out


def _server_answer(
    target: EngineTarget, ids: list[int], timeout_s: float
) -> tuple[list[dict | None], list[int]]:
    """(prompt log-probs per position as {token id: logprob, "top": id}, greedy continuation ids) from the server."""
    import httpx

    body = {
        "model": target.model,
        "prompt": ids,
        "max_tokens": GREEDY_TOKENS,
        "temperature": 0.0,
        "logprobs": 1,
        "prompt_logprobs": 1,
        "return_tokens_as_token_ids": True,
        "ignore_eos": True,
    }
    r = httpx.post(
        f"{target.base_url.rstrip('/')}/v1/completions", json=body, headers=target.headers, timeout=timeout_s
    )
    r.raise_for_status()
    choice = r.json()["choices"][0]
    positions: list[dict | None] = []
    for entry in choice.get("prompt_logprobs") or []:
        if not entry:
            positions.append(None)
            continue
        lp = {int(k): float(v["logprob"]) for k, v in entry.items()}
        top = min(entry.items(), key=lambda kv: kv[1].get("rank", 1 << 30))
        positions.append({"logprobs": lp, "top": int(top[0])})
    tokens = [
        int(str(t).removeprefix("token_id:")) for t in (choice.get("logprobs") or {}).get("tokens") or []
    ]
    return positions, tokens


def run(
    model_dir: Path,
    config: dict[str, Any],
    pack_bytes: int,
    target: EngineTarget | None,
    device: str,
    timeout_s: float = 300.0,
) -> list[Check]:
    """The engine layer's rows (skipped, saying why, without a server or a reference forward for the model)."""
    lp = Check("engine", "prompt log-probs vs reference", bound=DLOGPROB_MAX, unit="mean |dlogprob|")
    greedy = Check("engine", "greedy continuation", unit="divergences")
    if target is None:
        for c in (lp, greedy):
            c.verdict, c.note = (
                SKIP,
                "no server of this recipe is running (sparkctl up RECIPE --verify checks it)",
            )
        return [lp, greedy]
    if pack_bytes > MAX_REFERENCE_BYTES:
        for c in (lp, greedy):
            c.verdict = SKIP
            c.note = f"the reference forward would hold the whole {pack_bytes / 2**30:.1f} GiB pack beside the server"
        return [lp, greedy]
    import torch

    try:
        ff = _fixture_forward()
        model = ff.FixtureModel(model_dir, torch.device(device), torch.float32)
    except (FileNotFoundError, ValueError) as exc:  # FixtureError is a ValueError
        for c in (lp, greedy):
            c.verdict, c.note = SKIP, f"no reference forward for this model: {exc}"
        return [lp, greedy]
    prompts = prompt_ids(model_dir, config)
    agree = positions = 0
    deltas: list[float] = []
    lp.note = f"{len(prompts)} prompts; reference: the plugin's forward functions on {device}, fp32"
    import httpx

    for n, ids in enumerate(prompts):
        try:
            theirs, continuation = _server_answer(target, ids, timeout_s)
        except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
            for c in (lp, greedy):
                c.fail(target.base_url, f"the server did not answer prompt {n} with log-probs: {exc}")
            return [lp, greedy]
        if not any(theirs):
            for c in (lp, greedy):
                c.verdict = SKIP
                c.note = "the server returns no prompt log-probs (vLLM's prompt_logprobs): nothing to compare"
            return [lp, greedy]
        # one reference forward over the prompt and the server's continuation: row t predicts token t+1, so the
        # prompt rows give the log-probs and the rest say what the reference would have chosen at each step
        logits = model.run([ids + continuation], "prefill")[0].float().cpu()
        ref = torch.log_softmax(logits, -1)
        lp.checked += 1
        for t in range(1, len(ids)):
            got = theirs[t] if t < len(theirs) else None
            if got is None:
                lp.fail(f"prompt {n} position {t}", "the server returned no log-prob for it")
                continue
            positions += 1
            agree += int(got["top"] == int(ref[t - 1].argmax()))
            if ids[t] in got["logprobs"]:
                deltas.append(abs(got["logprobs"][ids[t]] - float(ref[t - 1, ids[t]])))
        greedy.checked += len(continuation)
        for step, tok in enumerate(continuation):
            top2 = logits[len(ids) - 1 + step].topk(2)
            want = int(top2.indices[0])
            if tok != want:
                margin = float(top2.values[0] - top2.values[1])
                if margin > TIE_MARGIN or tok != int(top2.indices[1]):
                    greedy.fail(
                        f"prompt {n} token {step}",
                        f"server chose {tok}, reference {want} (margin {margin:.3g})",
                    )
                break  # past a (forgiven) tie the two continue from different tokens
    greedy.worst = float(len(greedy.failures))
    mean = sum(deltas) / len(deltas) if deltas else float("inf")
    lp.error(mean, "whole model", "mean |dlogprob|")
    top1 = agree / positions if positions else 0.0
    if top1 < TOP1_MIN:
        lp.fail("whole model", f"top-1 agreement {top1:.3f} < {TOP1_MIN}")
    lp.note += f"; top-1 agreement {top1:.3f} over {positions} positions"
    greedy.note = (
        f"{GREEDY_TOKENS} tokens per prompt, temperature 0; near-ties (margin <= {TIE_MARGIN}) forgiven"
    )
    return [lp, greedy]
