"""Run by FreeToken's own venv Python: parse `ft serve` argument lists with FreeToken's real parser.

Reads a JSON list of argument lists on stdin and prints one JSON list of results: the parsed values, or
{"exit": code} where the parser refused (its message is on stderr). One process for all of them, as
importing FreeToken (torch, its kernels) costs tens of seconds on 2 cores. Kept free of sparkctl imports
(that venv has none); tests/gguf/test_freetoken_parser.py compares the values with the recipes.
"""

import json
import sys

from freetoken.server.args import parse_args

FIELDS = (
    "model_path",
    "served_model_name",
    "server_host",
    "server_port",
    "max_running_req",
    "max_seq_len_override",
    "moe_strategy",
    "moe_cache_mem",
    "moe_cache_rate",
    "moe_cpu_threads",
    "memory_ratio",
    "cuda_graph_max_bs",
    "cache_type",
    "tool_call_parser",
    "reasoning_parser",
)

results = []
for argv in json.load(sys.stdin):
    try:
        args, _shell = parse_args(argv, prog="ft serve")
    except SystemExit as exc:
        results.append({"exit": exc.code})
        continue
    out = {f: getattr(args, f, "<missing>") for f in FIELDS}
    out["dtype"] = str(args.dtype).removeprefix("torch.")
    results.append(out)
print(json.dumps(results, default=str))
