"""Greedy completions of unquantized models through vLLM's offline engine, as JSON.

The plugin's end-to-end test compares the EXL3 models served by `sparkctl up` with their dequantized
twins. Serving each twin over HTTP would cost another ~70 s server start; the offline `vllm.LLM`
engine gives the same sampler output (token ids and top logprobs) for a fraction of that, so the twins
run here, in a child process (vLLM's engine must start under an `if __name__ == "__main__"` guard).

Usage: python twin_generate.py SPEC.json OUT.json, where SPEC has "models" (directories), "prompts",
"max_tokens" and "logprobs".
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    from vllm import LLM, SamplingParams

    params = SamplingParams(
        temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True, logprobs=spec["logprobs"]
    )
    results: dict[str, object] = {}
    for model in spec["models"]:
        t0 = time.monotonic()
        llm = LLM(
            model=model,
            dtype="float32",
            enforce_eager=True,
            max_model_len=512,
            max_num_seqs=4,
            kv_cache_memory_bytes=256 * 2**20,
            seed=0,
        )
        started = time.monotonic() - t0
        outs = llm.generate(spec["prompts"], params, use_tqdm=False)
        results[model] = {
            "startup_s": started,
            "completions": [
                {
                    "prompt_token_ids": list(o.prompt_token_ids),
                    "token_ids": list(o.outputs[0].token_ids),
                    "logprobs": [
                        {str(tid): lp.logprob for tid, lp in step.items()} for step in o.outputs[0].logprobs
                    ],
                }
                for o in outs
            ],
        }
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()
    tmp = Path(sys.argv[2] + ".tmp")
    tmp.write_text(json.dumps(results))
    os.replace(tmp, sys.argv[2])


if __name__ == "__main__":
    main()
