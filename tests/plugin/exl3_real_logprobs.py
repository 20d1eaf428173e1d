"""Prompt log-probabilities of EXL3 checkpoints through vLLM's offline engine with the exl3 plugin, as JSON.

The real-exllamav3 fixture test (test_exl3_real_fixtures.py) compares them with exllamav3's own logits. Each
model gets its own engine, one after the other in this one child process (vLLM's engine must start under an
``if __name__ == "__main__"`` guard, and a child keeps its memory out of the test process).

Usage: python exl3_real_logprobs.py SPEC.json OUT.json, where SPEC has "models": {name: {"dir": model dir,
"prompts": [[token ids], ...]}}. OUT has, per name: "startup_s", and per prompt "top1" (the argmax token at
each position 0..T-1, position t predicting token t+1) and "logprob" (log p(token t+1 | tokens <= t) for
t = 0..T-2), or "error" (one line) if that model's engine failed.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path


def _top1(step: dict) -> int:
    return next(int(tid) for tid, lp in step.items() if lp.rank == 1)


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=1, logprobs=1, prompt_logprobs=1)
    results: dict[str, object] = {}
    for name, job in spec["models"].items():
        t0 = time.monotonic()
        llm = None
        try:
            llm = LLM(
                model=job["dir"],
                dtype="float32",
                enforce_eager=True,
                max_model_len=256,
                max_num_seqs=8,
                kv_cache_memory_bytes=128 * 2**20,
                enable_prefix_caching=False,
                seed=0,
            )
            started = time.monotonic() - t0
            prompts = [TokensPrompt(prompt_token_ids=ids) for ids in job["prompts"]]
            outs = llm.generate(prompts, params, use_tqdm=False)
            rows = []
            for ids, o in zip(job["prompts"], outs, strict=True):
                plp = o.prompt_logprobs  # [None, {tok: Logprob}, ...]: entry t is log p(ids[t] | ids[:t])
                top1 = [_top1(plp[t]) for t in range(1, len(ids))] + [_top1(o.outputs[0].logprobs[0])]
                logprob = [plp[t][ids[t]].logprob for t in range(1, len(ids))]
                rows.append({"top1": top1, "logprob": logprob})
            results[name] = {"startup_s": started, "prompts": rows}
        except Exception as exc:  # report, and go on with the next model
            results[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        finally:
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()
                del llm
            gc.collect()
    tmp = Path(sys.argv[2] + ".tmp")
    tmp.write_text(json.dumps(results))
    os.replace(tmp, sys.argv[2])


if __name__ == "__main__":
    main()
