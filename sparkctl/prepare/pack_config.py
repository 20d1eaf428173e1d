"""config.json as the `exl3` vLLM plugin reads it, derived from what the pack's tensors say.

Only `quantization_config.quant_method` selects the plugin (and `bits`, `head_bits`, `codebook`,
`version` are informational: SPEC 1.4), but three things published packs get wrong make vLLM load
the wrong thing, silently or with an error that points elsewhere:

- the EXL3 declaration missing, under `text_config` only, or a stale one of the base model (an fp8
  `quantization_config` left in `text_config` wins over `--quantization exl3`, and the load OOMs);
- `tie_word_embeddings: true` kept from the base model although the converter wrote a separate
  (quantized) `lm_head` (exllamav3 1.4.1 wrote the misspelt `tied_word_embeddings` instead);
- nothing says where the n-gram (PLE) table lives or how it is packed, so a loader that does not look
  allocates it dense (about 95 GiB for Qwen3.8-Flash-Next instead of 30.4 packed).

`rewrite_config` returns the new config and one line per change; the file in the download is never
edited (the prepare stage writes the result into its overlay).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from sparkctl.prepare.headers import Header

NGRAM_ROW_DIM = 160  # exllamav3's n-gram rows are one 160-wide ring each
_SHARD = re.compile(r"^(?P<prefix>.+?)(?:\.shard_(?P<n>\d+))?\.trellis$")


@dataclass(frozen=True)
class NgramTable:
    """An exllamav3 `exl3_ngram_trellis` table as its header describes it."""

    file: str
    prefix: str  # module key, e.g. model.language_model.layers.1.ple.ple_embedding.ngram_embedding
    bits: int  # K: (row words - 1) * 16 / 160
    rows: int
    shard_rows: int
    num_shards: int
    num_heads: int
    packed_bytes: int

    @property
    def dense_bf16_bytes(self) -> int:
        return self.rows * NGRAM_ROW_DIM * 2

    def to_config(self) -> dict[str, Any]:
        return {
            "format": "exl3_ngram_trellis",
            "file": self.file,
            "module": self.prefix,
            "bits": self.bits,
            "row_dim": NGRAM_ROW_DIM,
            "rows": self.rows,
            "rows_per_shard": self.shard_rows,
            "num_shards": self.num_shards,
            "num_heads": self.num_heads,
            "packed_bytes": self.packed_bytes,
        }


def find_ngram_table(headers: list[Header]) -> NgramTable | None:
    """The n-gram table: `<prefix>[.shard_N].trellis` rows next to `<prefix>.head_offsets`."""
    for h in headers:
        for name in h.tensors:
            if not name.endswith(".head_offsets"):
                continue
            prefix = name[: -len(".head_offsets")]
            shards = sorted(
                (int(m["n"] or 0), t)
                for n, t in h.tensors.items()
                if (m := _SHARD.match(n)) and m["prefix"] == prefix
            )
            if not shards:
                continue
            first = shards[0][1]
            if len(first.shape) != 2:
                continue
            words = first.shape[1]
            bits = (words - 1) * 16 // NGRAM_ROW_DIM
            return NgramTable(
                file=h.path.name,
                prefix=prefix,
                bits=bits,
                rows=sum(t.shape[0] for _, t in shards),
                shard_rows=first.shape[0],
                num_shards=len(shards),
                num_heads=h.tensors[name].shape[0] if h.tensors[name].shape else 0,
                packed_bytes=sum(t.nbytes for _, t in shards),
            )
    return None


def _modules(headers: list[Header]) -> dict[str, set[str]]:
    groups: dict[str, set[str]] = {}
    for h in headers:
        for name in h.tensors:
            prefix, _, leaf = name.rpartition(".")
            groups.setdefault(prefix, set()).add(leaf)
    return groups


def exl3_codebooks(headers: list[Header]) -> set[str]:
    """Codebooks of the EXL3 linear layers, by their per-tensor markers (SPEC 1.1)."""
    books: set[str] = set()
    for leaves in _modules(headers).values():
        if {"trellis", "suh", "svh"} <= leaves:
            books.add("mul1" if "mul1" in leaves else "mcg" if "mcg" in leaves else "3inst")
    return books


def _is_exl3(qc: Any) -> bool:
    return isinstance(qc, dict) and str(qc.get("quant_method", "")).lower() == "exl3"


def rewrite_config(config: dict[str, Any], headers: list[Header]) -> tuple[dict[str, Any], list[str]]:
    """The config the plugin needs for this pack, and what changed (empty: the pack's config is fine)."""
    cfg = copy.deepcopy(config)
    changes: list[str] = []
    books = exl3_codebooks(headers)
    table = find_ngram_table(headers)
    if not books and table is None:
        return cfg, []  # not an EXL3 pack: nothing for the plugin to read
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else None
    top = cfg.get("quantization_config")
    nested = text.get("quantization_config") if text is not None else None

    if _is_exl3(top):
        if top["quant_method"] != "exl3":
            top["quant_method"] = "exl3"
            changes.append("quantization_config.quant_method lower-cased to exl3")
    elif _is_exl3(nested):
        cfg["quantization_config"] = copy.deepcopy(nested)
        cfg["quantization_config"]["quant_method"] = "exl3"
        changes.append("quantization_config copied from text_config to the top level")
    else:
        was = top.get("quant_method") if isinstance(top, dict) else None
        qc: dict[str, Any] = {"quant_method": "exl3"}
        if isinstance(top, dict):
            qc["original_quantization_config"] = top
        cfg["quantization_config"] = qc
        changes.append(
            f"quantization_config declares quant_method exl3 (was {was or 'missing'}): "
            "the tensors are EXL3 (.trellis/.suh/.svh)"
        )
    if text is not None and isinstance(nested, dict) and not _is_exl3(nested):
        del text["quantization_config"]
        changes.append(
            f"text_config.quantization_config ({nested.get('quant_method', '?')}) removed: "
            "vLLM would apply it to the EXL3 tensors"
        )
    qc = cfg["quantization_config"]

    if len(books) == 1:
        (book,) = books
        if qc.get("codebook") != book:
            changes.append(
                f"quantization_config.codebook {qc.get('codebook')!r} -> {book!r} (tensor markers)"
            )
            qc["codebook"] = book

    if table is not None:
        desc = table.to_config()
        if qc.get("ngram_embedding") != desc:
            qc["ngram_embedding"] = desc
            changes.append(
                f"quantization_config.ngram_embedding: {table.rows:,} rows x {NGRAM_ROW_DIM} at K={table.bits} "
                f"in {table.file} ({_gib(table.packed_bytes)} packed; dense bf16 would be "
                f"{_gib(table.dense_bf16_bytes)})"
            )

    has_head = any(name.startswith("lm_head.") for h in headers for name in h.tensors)
    if has_head:
        for where, block in (("", cfg), ("text_config.", text)):
            if block is not None and block.get("tie_word_embeddings") is True:
                block["tie_word_embeddings"] = False
                changes.append(f"{where}tie_word_embeddings true -> false: the pack stores its own lm_head")
    if "tied_word_embeddings" in cfg:
        del cfg["tied_word_embeddings"]
        changes.append("misspelt tied_word_embeddings (exllamav3 1.4.1) removed")
    return cfg, changes


def _gib(n: int) -> str:
    if n < 1 << 30:
        return f"{n / (1 << 20):.1f} MiB"
    return f"{n / (1 << 30):.1f} GiB"
