"""Run by FreeToken's own venv Python: parse `ft serve` arguments with FreeToken's real parser, print JSON.

Kept free of sparkctl imports (that venv does not have sparkctl); tests/gguf/test_freetoken_parser.py
passes the arguments the planner rendered and compares the parsed values with the recipe.
"""

import json
import sys

from freetoken.server.args import parse_args

args, _shell = parse_args(sys.argv[1:], prog="ft serve")
fields = (
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
out = {f: getattr(args, f, "<missing>") for f in fields}
out["dtype"] = str(args.dtype).removeprefix("torch.")
json.dump(out, sys.stdout, default=str)
