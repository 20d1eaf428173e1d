"""`sparkctl verify`'s kernel layer on a GPU: our CUDA path against the fp64 reference on real packs.

On the CPU `verify` can only hold the plugin's CPU path (the reference decoder in fp32) to the fp64 reference; the
kernels themselves run only where a GPU is. This script runs the same code (`sparkctl.verify.run.verify`, with the
device forced to CUDA) on:

* every exllamav3-made fixture under `tests/fixtures/exl3_real/` (Llama in all three codebooks and a half rate,
  Qwen3-MoE, GLM-4-MoE with and without MTP, Glm5Next, Qwen4Exp with its n-gram table), `--full` (every module:
  GEMV at 1 and 8 rows, the reconstruction kernel, the fused MoE for 1..8, 33 and 80 tokens with the pack's own
  router, so the fused decode and the MoE prefill are both reached, and every n-gram row through the lookup kernel),
  then `--quick`;
* any pack named with `--pack NAME=DIR` (the real-dimension GLM-class checkpoint `kernels/bench/model_speed.py
  --write-only` writes on the device: hidden 4096, 128 experts of width 1536; `--no-builtin` checks only those);
* the two tiny packs `sparkctl up tiny-exl3[-moe]` serves (our writer: K 2..6 and 2.5, all three codebooks mixed
  per shard and per expert), written here without a tokenizer (the kernel layer needs none).

Each row says which compute paths its calls took (`sparkctl_exl3.paths`): a kernel that declines a shape falls back
to the reference decoder on the GPU, which `verify` reports instead of hiding.

Run from the repository root on the device, after building the extension:

    export PYTHONPATH=$PWD:$PWD/kernels
    python3 -m sparkctl_exl3.cuda build && python3 bench/verify_gpu.py --out $OUT/verify_gpu.json

Needs torch with CUDA and safetensors (no vLLM, no sparkctl install: the checks import only sparkctl.verify and
sparkctl_exl3). One line per pack and mode, the worst row, PASS/FAIL; the JSON holds every row.
Exit status: 0 every pack passes, 1 one fails, 2 no CUDA device or the kernels are not built. `--device cpu` runs the
same packs through the CPU path (what `sparkctl verify` does without a GPU), to try the script anywhere.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "kernels")]  # sparkctl and sparkctl_exl3 without installing

FIXTURES = ROOT / "tests" / "fixtures" / "exl3_real"


def tiny_packs(root: Path) -> list[tuple[str, Path]]:
    """tiny-exl3 (dense) and tiny-exl3-moe as sparkctl serves them, minus the tokenizer."""
    from sparkctl_exl3 import checkpoint

    ids = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
    out = []
    for name, spec in (("tiny-exl3", checkpoint.DENSE), ("tiny-exl3-moe", checkpoint.MOE)):
        checkpoint.write_model(spec, root / name, vocab=640, token_ids=ids, eos_token_ids=[1], twin=False)
        out.append((name, root / name))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("verify_gpu.json"))
    ap.add_argument("--only", nargs="*", help="pack names (fixture folders, tiny-exl3, tiny-exl3-moe)")
    ap.add_argument(
        "--pack",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="one more pack to check (e.g. model_speed's real-dimension checkpoint); repeatable",
    )
    ap.add_argument(
        "--no-builtin", action="store_true", help="only the --pack packs (no fixtures, no tiny packs)"
    )
    ap.add_argument("--quick-only", action="store_true", help="skip the --full runs")
    ap.add_argument(
        "--device", choices=("cuda", "cpu"), default="cuda", help="cpu: the same runs on the CPU path"
    )
    args = ap.parse_args()

    import torch

    if args.device == "cuda":
        if not torch.cuda.is_available():
            print("verify_gpu: no CUDA device", file=sys.stderr)
            return 2
        from sparkctl_exl3 import ops

        if ops.cuda_kernel() is None:
            print(
                "verify_gpu: the CUDA extension is not built (python3 -m sparkctl_exl3.cuda build)",
                file=sys.stderr,
            )
            return 2
    os.environ.setdefault("SPARKCTL_STATE_DIR", tempfile.mkdtemp(prefix="verify-gpu-state-"))
    from sparkctl.verify.run import failure_line, verify

    extra = []
    for item in args.pack:
        name, sep, where = item.partition("=")
        if not sep or not name or not (Path(where) / "config.json").is_file():
            print(
                f"verify_gpu: --pack takes NAME=DIR with a config.json in DIR, got {item!r}", file=sys.stderr
            )
            return 2
        extra.append((name, Path(where)))
    packs = []
    if not args.no_builtin:
        work = Path(tempfile.mkdtemp(prefix="verify-gpu-"))
        packs = [
            (d.name, d / "model")
            for d in sorted(FIXTURES.iterdir())
            if (d / "model" / "config.json").is_file()
        ]
        packs += tiny_packs(work)
    packs += extra
    if args.only:
        packs = [(n, p) for n, p in packs if n in args.only]
    results, ok = [], True
    for name, model in packs:
        for full in (False,) if args.quick_only else (True, False):
            t0 = time.monotonic()
            try:
                rec = verify(model, name=name, full=full, device=args.device)
            except Exception as exc:  # one pack that cannot run is that pack's failure; go on with the others
                ok = False
                print(
                    f"{name:24s} {'full' if full else 'quick':5s} ERROR {type(exc).__name__}: {exc}",
                    flush=True,
                )
                results.append({"pack": name, "full": full, "error": f"{type(exc).__name__}: {exc}"})
                continue
            ok &= rec.ok
            rows = [c for c in rec.checks if c.layer == "kernels" and c.worst is not None]
            worst = max(rows, key=lambda c: (c.worst or 0) / (c.bound or 1), default=None)
            what = (
                f"worst {worst.what} {worst.worst:.3g} (bound {worst.bound:.3g})"
                if worst
                else "no kernel rows"
            )
            print(
                f"{name:24s} {rec.mode:5s} {'PASS' if rec.ok else 'FAIL'} {what}; read {rec.bytes_read} B "
                f"in {time.monotonic() - t0:.1f} s {failure_line(rec)}",
                flush=True,
            )
            d = rec.to_dict()
            d.pop("digests", None)
            results.append({"pack": name, "full": full, **d})
    report = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "ok": ok,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"verify_gpu: {'PASS' if ok else 'FAIL'}; wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
