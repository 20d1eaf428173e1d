"""Layer 1: the pack's files against themselves and against the config the plugin reads.

Nothing here decodes a weight. What it proves: every shard the index names is present and readable, no shard is
stray, every tensor is where the index says; every EXL3 module has the tensors, dtypes and shapes of SPEC 1.1,
a valid K from its tile length, one known codebook marker, and agrees with `quantization_config.json`'s
`tensor_storage` (the K, codebook and shapes the converter recorded); every n-gram table has a valid row layout;
and, where the file sits in a Hugging Face cache, its bytes hash to the hub's sha256 (`--full`).

What it cannot prove: a flipped bit inside a trellis is still a valid trellis (SPEC 2.2). Only the hub checksum
(per file) and the digests of an earlier verification (per tensor, `run.drift`) catch that.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkctl.verify.reader import PackFileError, PackReader, read_header
from sparkctl.verify.records import FAIL, SKIP, Check

INDEX = "model.safetensors.index.json"
EXL3_LEAVES = ("trellis", "suh", "svh")
MARKER_VALUES = {"mcg": 0xCBAC1FED, "mul1": 0x83DCD12D}  # SPEC 1.1, as unsigned 32-bit
NGRAM_LEAVES = ("head_bias", "head_offsets", "head_vocab_sizes", "layer_multipliers")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
#: tensor_storage spells dtypes as torch does (exllamav3) or as safetensors does (our tiny writer)
_TORCH_DTYPES = {
    "torch.int16": "I16",
    "torch.int32": "I32",
    "torch.int64": "I64",
    "torch.float16": "F16",
    "torch.bfloat16": "BF16",
    "torch.float32": "F32",
    "torch.uint8": "U8",
}


@dataclass
class Pack:
    """A model directory as the checks see it: shards, modules by prefix, the configs."""

    model_dir: Path
    reader: PackReader
    config: dict[str, Any]
    storage: dict[str, Any]  # quantization_config.json's tensor_storage ({} when absent)
    index: dict[str, str] | None  # tensor -> file, from model.safetensors.index.json
    modules: dict[str, dict[str, str]] = field(default_factory=dict)  # prefix -> leaf -> tensor name
    ngram: set[str] = field(default_factory=set)  # prefixes of n-gram tables
    unreadable: dict[str, str] = field(default_factory=dict)  # file -> why
    qconfig: dict[str, Any] = field(default_factory=dict)  # quantization_config.json without tensor_storage

    @property
    def exl3(self) -> list[str]:
        """EXL3 linear modules (a trellis, not an n-gram table's row shard), in checkpoint order."""
        return [p for p, leaves in self.modules.items() if "trellis" in leaves and not self._in_table(p)]

    def _in_table(self, prefix: str) -> bool:
        parent, _, last = prefix.rpartition(".")
        return prefix in self.ngram or (last.startswith("shard_") and parent in self.ngram)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.reader.shards.values())

    def modules_in(self, file: str) -> list[str]:
        """Module prefixes whose tensors the index (or the file itself) puts in `file`."""
        names = [t for t, f in (self.index or {}).items() if f == file]
        shard = self.reader.shards.get(file)
        if shard is not None:
            names += list(shard.tensors)
        return sorted({n.rpartition(".")[0] for n in names})


def open_pack(model_dir: Path) -> Pack:
    """Read every shard's header and the configs (a few KiB to MiB: no tensor data)."""
    from sparkctl.errors import UserError

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise UserError(f"{model_dir}: no config.json here; is this a model directory?")
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{model_dir / 'config.json'}: not readable JSON ({exc})") from None
    storage: dict[str, Any] = {}
    qconfig: dict[str, Any] = dict(config.get("quantization_config") or {})
    qpath = model_dir / "quantization_config.json"
    if qpath.is_file():
        try:
            qfile = json.loads(qpath.read_text())
            storage = qfile.pop("tensor_storage", None) or {}
            qconfig.update(qfile)
        except (OSError, ValueError) as exc:
            raise UserError(f"{qpath}: not readable JSON ({exc})") from None
    index = None
    if (model_dir / INDEX).is_file():
        try:
            index = dict(json.loads((model_dir / INDEX).read_text())["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{model_dir / INDEX}: not a safetensors index ({exc})") from None
    pack = Pack(model_dir, PackReader(), config, storage, index, qconfig=qconfig)
    for path in sorted(model_dir.glob("*.safetensors")):
        try:
            pack.reader.add(read_header(path))
        except (OSError, PackFileError) as exc:
            pack.unreadable[path.name] = str(exc)
    for name in pack.reader.where:
        prefix, _, leaf = name.rpartition(".")
        pack.modules.setdefault(prefix, {})[leaf] = name
    pack.ngram = {p for p, leaves in pack.modules.items() if "head_offsets" in leaves}
    return pack


# -- files vs index ----------------------------------------------------------------------------------


def check_files(pack: Pack) -> Check:
    c = Check(
        "pack", "files vs index", note="shards present, readable, none stray, tensors where the index says"
    )
    files = {p.name for p in pack.model_dir.glob("*.safetensors")}
    c.checked = len(files)
    for file, why in sorted(pack.unreadable.items()):
        c.fail(_few(pack.modules_in(file)) or file, f"shard {file} unreadable: {why}")
    if pack.index is not None:
        wanted = set(pack.index.values())
        for file in sorted(wanted - files):
            mods = pack.modules_in(file)
            c.fail(
                _few(mods) or file, f"shard {file} named by the index is missing ({len(mods)} modules in it)"
            )
        for file in sorted(files - wanted):
            shard = pack.reader.shards.get(file)
            if shard is not None and _only_ngram(shard.tensors, pack):
                continue  # the n-gram table's own file (exllamav3 keeps it outside the index)
            c.fail(_few(pack.modules_in(file)) or file, f"stray shard {file}: not in {INDEX}")
        for tensor, file in sorted(pack.index.items()):
            shard = pack.reader.shards.get(file)
            if shard is not None and tensor not in shard.tensors:
                c.fail(
                    tensor.rpartition(".")[0],
                    f"{tensor}: the index puts it in {file}, which does not hold it",
                )
    seen: dict[str, str] = {}
    for file, shard in sorted(pack.reader.shards.items()):
        for tensor in shard.tensors:
            if tensor in seen:
                c.fail(tensor.rpartition(".")[0], f"{tensor} is stored twice ({seen[tensor]} and {file})")
            seen[tensor] = file
    if not files:
        c.fail(str(pack.model_dir), "no .safetensors files")
    return c


def _only_ngram(tensors: dict[str, Any], pack: Pack) -> bool:
    return bool(tensors) and all(pack._in_table(t.rpartition(".")[0]) for t in tensors)


def _few(mods: list[str], n: int = 3) -> str:
    return ", ".join(mods[:n]) + (f" (+{len(mods) - n} more)" if len(mods) > n else "")


def kind_of(prefix: str, bits: float, layers: int) -> str:
    """The module kind a row of the table reports (routed experts are split by K: each K is its own decode)."""
    m = re.search(r"\.layers\.(\d+)\.", prefix + ".")
    parts = prefix.split(".")
    if parts[-1] in ("lm_head", "head") and "shared_head" not in parts:
        return "lm_head"
    if "mtp" in parts or "shared_head" in parts or "eh_proj" in parts or (m and int(m.group(1)) >= layers):
        return "MTP layer"
    if "shared_expert" in prefix:
        return "shared expert"
    if ".experts." in prefix:
        return f"routed experts K={bits:g}"
    if re.search(r"\.(self_attn|attn|attention|linear_attn|mixer)\.", prefix + "."):
        return "attention"
    return "dense MLP"


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config") or config


def is_mtp(pack: Pack, prefix: str) -> bool:
    layers = int(text_config(pack.config).get("num_hidden_layers") or 10**9)
    return kind_of(prefix, 0.0, layers) == "MTP layer"


# -- EXL3 modules ------------------------------------------------------------------------------------


def _k_of(length: int) -> float | None:
    """K from a tile's int16 count (SPEC 1.1/2.5), or None when no rate has that length."""
    if length % 16 == 0 and 1 <= length // 16 <= 8:
        return float(length // 16)
    if length % 16 == 8 and 1 <= length // 16 <= 7:
        return length // 16 + 0.5
    return None


@dataclass(frozen=True)
class ModuleFacts:
    """What the headers and the marker say about one EXL3 module (what the kernel layer and the table use)."""

    prefix: str
    in_features: int
    out_features: int
    bits: float
    codebook: str
    nbytes: int


def module_facts(pack: Pack, prefix: str, c: Check) -> ModuleFacts | None:
    """Check one EXL3 module's stored tensors (SPEC 1.1) and its marker; failures go into `c`."""
    leaves = pack.modules[prefix]
    where = pack.reader.where
    missing = [leaf for leaf in EXL3_LEAVES if leaf not in leaves]
    if missing:
        c.fail(prefix, f"lacks {', '.join(missing)} (an EXL3 module stores trellis, suh and svh)")
        return None
    t = where[leaves["trellis"]]
    if t.dtype != "I16" or len(t.shape) != 3:
        c.fail(prefix, f"trellis is {t.dtype} {list(t.shape)}; expected int16 [I/16, O/16, 16*K]")
        return None
    bits = _k_of(t.shape[2])
    if bits is None:
        c.fail(
            prefix,
            f"trellis tile length {t.shape[2]} is no EXL3 rate (16*K, K 1..8, or 16*K+8 for half rates)",
        )
        return None
    i, o = 16 * t.shape[0], 16 * t.shape[1]
    ok = True
    if i % 128 or o % 128 or not i or not o:
        c.fail(prefix, f"shape {i}x{o} is not a multiple of 128 on both sides (SPEC 1.3)")
        ok = False
    for leaf, size in (("suh", i), ("svh", o)):
        v = where[leaves[leaf]]
        if v.dtype not in ("F16", "BF16", "F32") or v.shape != (size,):
            c.fail(
                prefix,
                f"{leaf} is {v.dtype} {list(v.shape)}; expected fp16 [{size}] for trellis {list(t.shape)}",
            )
            ok = False
    markers = [m for m in MARKER_VALUES if m in leaves]
    codebook = "3inst"
    if len(markers) > 1:
        c.fail(prefix, f"carries both codebook markers ({', '.join(markers)})")
        return None
    if markers:
        codebook = markers[0]
        m = where[leaves[codebook]]
        if m.dtype != "I32" or math.prod(m.shape) != 1:
            c.fail(prefix, f"{codebook} marker is {m.dtype} {list(m.shape)}; expected an int32 scalar")
            return None
        value = int.from_bytes(pack.reader.raw(leaves[codebook]), "little", signed=False)
        if value != MARKER_VALUES[codebook]:
            other = next((k for k, v in MARKER_VALUES.items() if v == value), None)
            what = f"the {other} constant" if other else "no known multiplier"
            c.fail(
                prefix,
                f"{codebook} marker holds {value:#010x}, {what} (expected {MARKER_VALUES[codebook]:#010x})",
            )
            return None
    if bits != int(bits) and codebook != "mul1":
        c.fail(
            prefix,
            f"half rate K={bits} with the {codebook} codebook (half rates exist only for mul1, SPEC 2.5)",
        )
        ok = False
    nbytes = sum(where[n].nbytes for n in leaves.values())
    return ModuleFacts(prefix, i, o, bits, codebook, nbytes) if ok else None


def _storage_codebook(entry: dict[str, Any]) -> tuple[str, int | None]:
    for cb in MARKER_VALUES:
        if f"{cb}_multiplier" in entry:
            return cb, int(entry[f"{cb}_multiplier"]) & 0xFFFFFFFF
    return "3inst", None


def _quant_config(pack: Pack) -> dict[str, Any]:
    return pack.qconfig


def check_modules(pack: Pack) -> tuple[Check, dict[str, ModuleFacts]]:
    """Every EXL3 module against SPEC 1.1 and against `tensor_storage` (K, codebook, shapes, dtypes)."""
    c = Check("pack", "EXL3 modules: shape, K, codebook", note="vs SPEC 1.1 and quantization_config.json")
    facts: dict[str, ModuleFacts] = {}
    qm = str((pack.config.get("quantization_config") or {}).get("quant_method", "")).lower()
    if qm != "exl3" and not (pack.model_dir / "quantization_config.json").is_file():
        c.fail(
            "config.json", f"quant_method is {qm or 'absent'}, not exl3: the plugin would not load this pack"
        )
    for prefix in pack.exl3:
        c.checked += 1
        f = module_facts(pack, prefix, c)
        if f is None:
            continue
        facts[prefix] = f
        entry = pack.storage.get(prefix)
        if not pack.storage:
            continue
        mtp_bits = _quant_config(pack).get("mtp_bits")
        if entry is None and is_mtp(pack, prefix) and mtp_bits is not None:
            # exllamav3 keeps MTP layers out of tensor_storage and records only their rate (--mtp_bits)
            if float(mtp_bits) != f.bits:
                c.fail(
                    prefix,
                    f"MTP module holds K={f.bits:g} but quantization_config.json says mtp_bits {mtp_bits}",
                )
            continue
        if not isinstance(entry, dict) or entry.get("quant_format") != "exl3":
            c.fail(prefix, "stored as EXL3 but quantization_config.json's tensor_storage does not say exl3")
            continue
        k = entry.get("bits_per_weight")
        if k is None or float(k) != f.bits:
            c.fail(
                prefix, f"trellis holds K={f.bits:g} but quantization_config.json says bits_per_weight {k}"
            )
        cb, mult = _storage_codebook(entry)
        if cb != f.codebook:
            c.fail(prefix, f"marker says codebook {f.codebook} but quantization_config.json says {cb}")
        elif mult is not None and mult != MARKER_VALUES[cb]:
            c.fail(
                prefix,
                f"quantization_config.json's {cb}_multiplier {mult:#010x} is not {MARKER_VALUES[cb]:#010x}",
            )
        for tensor, want in (entry.get("stored_tensors") or {}).items():
            info = pack.reader.where.get(tensor)
            if info is None:
                c.fail(prefix, f"{tensor} is in quantization_config.json but in no shard")
                continue
            shape = tuple(int(d) for d in want.get("shape", []))
            dtype = _TORCH_DTYPES.get(str(want.get("dtype")), str(want.get("dtype")))
            if shape != info.shape or dtype != info.dtype:
                c.fail(
                    prefix,
                    f"{tensor} is {info.dtype} {list(info.shape)}, quantization_config.json says {dtype} {list(shape)}",
                )
    for prefix, entry in sorted(pack.storage.items()):
        if isinstance(entry, dict) and entry.get("quant_format") == "exl3" and prefix not in pack.modules:
            c.checked += 1
            c.fail(prefix, "quantization_config.json lists it as EXL3 but no shard stores it")
    return c, facts


# -- n-gram tables -----------------------------------------------------------------------------------


def check_ngram(pack: Pack) -> Check:
    """The n-gram (PLE) tables' row layout: row width -> K, shards, heads (exllamav3's exl3_ngram_trellis)."""
    c = Check("pack", "n-gram table layout", note="row width, shards, head offsets and bias")
    if not pack.ngram:
        c.verdict, c.note = SKIP, "no n-gram table in this pack"
        return c
    from sparkctl_exl3 import ngram

    where = pack.reader.where
    for prefix in sorted(pack.ngram):
        c.checked += 1
        leaves = pack.modules[prefix]
        missing = [leaf for leaf in ("head_bias", "head_offsets") if leaf not in leaves]
        shards = []
        while f"{prefix}.shard_{len(shards)}.trellis" in where:
            shards.append(where[f"{prefix}.shard_{len(shards)}.trellis"])
        if not shards and "trellis" in leaves:
            shards = [where[leaves["trellis"]]]
        if missing or not shards:
            c.fail(
                prefix,
                f"incomplete n-gram table: no {', '.join(missing + ([] if shards else ['shard_0.trellis']))}",
            )
            continue
        widths = {s.shape[1] if len(s.shape) == 2 else -1 for s in shards}
        if len(widths) != 1 or any(s.dtype != "I16" for s in shards):
            c.fail(
                prefix,
                f"row shards must be int16 [rows, words] of one width, got {[list(s.shape) for s in shards]}",
            )
            continue
        bias = where[leaves["head_bias"]]
        if len(bias.shape) != 2:
            c.fail(prefix, f"head_bias is {list(bias.shape)}, expected [heads, row_dim]")
            continue
        dim = bias.shape[1]
        if ngram.bits_of_or_none(widths.pop(), dim) is None:
            c.fail(prefix, f"rows of {shards[0].shape[1]} words are no {dim}-wide ring at K 1..8")
            continue
        rows = [s.shape[0] for s in shards]
        if len(set(rows[:-1])) > 1 or (len(rows) > 1 and rows[-1] > rows[0]):
            c.fail(
                prefix,
                f"row shards of {rows} rows: all but the last must hold the same count, the last no more",
            )
        offsets = pack.reader.tensor(leaves["head_offsets"]).tolist()
        total = sum(rows)
        if offsets != sorted(offsets) or (offsets and (offsets[0] < 0 or offsets[-1] >= total)):
            c.fail(prefix, f"head_offsets {offsets[:6]} are not ascending starts inside the {total} rows")
        if len(offsets) != bias.shape[0]:
            c.fail(prefix, f"{len(offsets)} head offsets but head_bias has {bias.shape[0]} heads")
    return c


# -- checksums ---------------------------------------------------------------------------------------


def hub_blob_sha(path: Path) -> str | None:
    """The sha256 the Hugging Face cache names this file's blob by, or None (not in a hub cache).

    huggingface_hub stores each LFS file once as `blobs/<sha256>` and links the snapshot's name to it, so
    the link target *is* the hub's checksum of the file.
    """
    if not path.is_symlink():
        return None
    target = path.resolve()
    if target.parent.name == "blobs" and _HEX64.match(target.name):
        return target.name
    return None


def check_checksums(pack: Pack, full: bool) -> tuple[Check, int]:
    """Every shard with a hub checksum, hashed (`--full` only). Returns the check and the bytes hashed."""
    c = Check("pack", "checksums vs hub", note="sha256 of each shard vs its Hugging Face cache blob name")
    hashed = 0
    known = {name: sha for name in pack.reader.shards if (sha := hub_blob_sha(pack.model_dir / name))}
    if not known:
        c.verdict, c.note = SKIP, "not in a Hugging Face cache: no hub checksums to compare"
        return c, 0
    if not full:
        c.verdict, c.note = (
            SKIP,
            f"{len(known)} shards have hub checksums; --full hashes them (reads every byte)",
        )
        return c, 0
    for name, sha in sorted(known.items()):
        c.checked += 1
        h = hashlib.sha256()
        with open(pack.model_dir / name, "rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
                hashed += len(chunk)
        if h.hexdigest() != sha:
            mods = pack.modules_in(name)
            c.fail(
                name,
                f"sha256 {h.hexdigest()[:12]}... is not the hub's {sha[:12]}...: bytes of one of its {len(mods)} "
                "modules changed (the digests of an earlier verify name which)",
            )
    return c, hashed


def run(pack: Pack, *, full: bool) -> tuple[list[Check], dict[str, ModuleFacts], int]:
    """The pack layer: (its rows, the facts of every module that passed, bytes hashed for checksums)."""
    modules, facts = check_modules(pack)
    checks, hashed = check_checksums(pack, full)
    return [check_files(pack), modules, check_ngram(pack), checks], facts, hashed


__all__ = ["FAIL", "Pack", "ModuleFacts", "open_pack", "run"]
