"""A plan with an API key: the key's env file, and for vLLM the gate that puts the key on every route.

vLLM checks its own key only under /v1, /v2, /inference and /cohere; every other route it serves
(/tokenize, /pooling, /invocations, which generates text, ...) answers without it. With a key, the plan
loads sparkctl's ASGI middleware (sparkctl.server.keygate) into vLLM, which refuses every request
without the key except the /health probe. The key itself stays in the env file: the flag names a class.
"""

from __future__ import annotations

import dataclasses

from sparkctl.planner.types import Plan

# sparkctl.server.keygate.IMPORT_PATH (the planner may not import sparkctl.server; a test ties the two)
KEY_GATE = "sparkctl.server.keygate.KeyGate"


def with_key_file(plan: Plan, api_key_file: str | None) -> Plan:
    """`plan` serving with the key in `api_key_file` (None: no key, the plan as it is)."""
    if api_key_file is None:
        return plan
    from sparkctl.planner.adapters import adapter_for

    argv, gate = plan.argv, adapter_for(plan.engine).key_gate_args()
    if gate and not set(gate) <= set(argv):
        argv = (*argv, *gate)
    return dataclasses.replace(plan, argv=argv, api_key_file=api_key_file)
