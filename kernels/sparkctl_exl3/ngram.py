"""The n-gram (PLE) embedding table's EXL3 row codec, and a lookup that dequantizes only the rows it needs.

Qwen3.8-Flash-Next's per-layer n-gram embedding is a hashed table of 320,001,536 rows x 160. exllamav3
(1.6.5, ``exl3_ngram_trellis`` format version 1) stores it packed: 30.4 GiB at K=5 instead of 95 GiB
dense in bf16. The format, as learnt from exllamav3's source (facts only; this is our own code):

- One row is one tail-biting trellis ring of ``ROW_DIM = 160`` positions over the mul1 codebook (the
  same codebook as EXL3 linears, SPEC 2.3), stored as ``1 + 160 * K / 16`` int16 words: word 0 is the
  row's fp16 scale (its bit pattern), words 1.. the ring's bit stream.
- The stream is **little-endian**: stream bit ``b`` is bit ``b & 15`` of word ``1 + (b >> 4)`` (unlike
  the linear trellis, which is read MSB-first, SPEC 2.1). Stream bits ``[i*K, (i+1)*K)`` are the low K
  bits of position i's 16-bit state; the state's higher bits are the symbols of positions i-1, i-2, ...
  (mod 160), K bits each. So bit m of state i is stream bit ``((i - m // K) mod 160) * K + m % K``.
- ``row[i] = fp16(decode_mul1(state_i)) * scale + head_bias[head]``, computed in fp32 and rounded to
  fp16 once. The product of two fp16 values is exact in fp32, so the result is the same whether the
  multiply and add are fused (the CUDA kernel) or not (this reference).
- The head of a row is the hash head whose row range holds it: ``head_offsets`` are the ascending
  starts of disjoint per-head ranges (``head_vocab_sizes`` long); ``head_bias`` is fp16 [heads, 160].
- Tensors, all in ``ngram_embedding.safetensors``: ``<prefix>.shard_<n>.trellis`` int16 [rows, words]
  (all shards but the last hold ``shard_rows`` rows; a single ``<prefix>.trellis`` is also allowed),
  ``<prefix>.head_bias`` fp16, ``<prefix>.head_offsets``, ``<prefix>.head_vocab_sizes`` and
  ``<prefix>.layer_multipliers`` int64 (the hashing parameters), metadata ``format``, ``version``,
  ``K``, ``codebook``, ``row_dim``, ``rows``, ``shard_rows``.

A forward pass touches a few hundred rows of the 320 million, so :meth:`NgramTable.lookup` (the custom
op ``torch.ops.sparkctl_exl3.ngram_lookup``) gathers the packed rows and decodes only those; the table
stays packed (on any device).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from . import reference

__all__ = [
    "FORMAT",
    "ROW_DIM",
    "NgramTable",
    "dequant_rows",
    "load_table",
    "lookup_reference",
    "ngram_lookup",
    "pack_rows",
    "save_table",
    "unpack_rows",
    "words_per_row",
]

FORMAT = "exl3_ngram_trellis"
FORMAT_VERSION = 1
ROW_DIM = 160
STATE_BITS = 16


def words_per_row(bits: int, dim: int = ROW_DIM) -> int:
    """int16 words per stored row: the fp16 scale, then ``dim * bits`` stream bits."""
    if not 1 <= bits <= 8 or (dim * bits) % 16:
        raise ValueError(f"n-gram rows need K in 1..8 with {dim} * K a multiple of 16, got K={bits}")
    return 1 + dim * bits // 16


def bits_of(words: int, dim: int = ROW_DIM) -> int:
    """K from a stored row width (the file's header, not its metadata, decides, as for linears)."""
    bits, rest = divmod((words - 1) * 16, dim)
    if rest or not 1 <= bits <= 8:
        raise ValueError(f"a row of {words} int16 words is not a {dim}-wide n-gram ring at K in 1..8")
    return bits


def bits_of_or_none(words: int, dim: int = ROW_DIM) -> int | None:
    """:func:`bits_of`, or None where no K fits (for callers that word their own error)."""
    try:
        return bits_of(words, dim)
    except ValueError:
        return None


@cache
def _state_bit_positions(bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For every (position i, state bit m): the stream word (after the scale) and the bit in it."""
    i = torch.arange(dim).view(dim, 1)
    m = torch.arange(STATE_BITS).view(1, STATE_BITS)
    stream_bit = torch.remainder(i - m // bits, dim) * bits + m % bits
    return stream_bit >> 4, stream_bit & 15


def pack_rows(states: torch.Tensor, scales: torch.Tensor, bits: int) -> torch.Tensor:
    """int16 [N, words] rows from per-position states (only their low K bits are stored) and fp16 scales."""
    n, dim = states.shape
    words = words_per_row(bits, dim)
    codes = states.to(torch.int64) & ((1 << bits) - 1)
    stream = (codes.unsqueeze(-1) >> torch.arange(bits)) & 1  # [N, dim, K]: stream bit i*K + k
    stream = stream.reshape(n, words - 1, 16) << torch.arange(16)
    packed = stream.sum(-1)
    packed = torch.where(packed >= 0x8000, packed - 0x10000, packed).to(torch.int16)
    scale_words = scales.to(torch.float16).contiguous().view(torch.int16).view(n, 1)
    return torch.cat((scale_words, packed), dim=1).contiguous()


def unpack_rows(packed: torch.Tensor, dim: int = ROW_DIM) -> tuple[torch.Tensor, torch.Tensor]:
    """(states int64 [N, dim] in 0..65535, scales fp16 [N]) of packed rows."""
    if packed.dtype != torch.int16 or packed.dim() != 2:
        raise ValueError(f"packed n-gram rows are int16 [N, words], got {packed.dtype} {list(packed.shape)}")
    bits = bits_of(packed.shape[1], dim)
    word, shift = (t.to(packed.device) for t in _state_bit_positions(bits, dim))
    stream = packed[:, 1:].to(torch.int64) & 0xFFFF  # uint16 values
    bit = (stream[:, word] >> shift) & 1  # [N, dim, 16]
    states = (bit << torch.arange(STATE_BITS, device=packed.device)).sum(-1)
    scales = packed[:, 0].contiguous().view(torch.float16)
    return states, scales


def dequant_rows(packed: torch.Tensor, heads: torch.Tensor, head_bias: torch.Tensor) -> torch.Tensor:
    """fp16 [N, 160] values of packed rows whose hash heads are ``heads`` (int [N])."""
    states, scales = unpack_rows(packed, head_bias.shape[-1])
    values = reference.decode_table("mul1", packed.device)[states].float()
    out = values * scales.float().unsqueeze(1) + head_bias.float()[heads.long()]
    return out.to(torch.float16)


@dataclass
class NgramTable:
    """A packed n-gram table: shards of int16 rows plus the per-head bias and hashing parameters."""

    shards: list[torch.Tensor]
    head_bias: torch.Tensor  # fp16 [heads, 160]
    head_offsets: torch.Tensor  # int64 [heads], ascending starts of each head's rows
    head_vocab_sizes: torch.Tensor  # int64 [heads]
    layer_multipliers: torch.Tensor  # int64 [ngram_size], hashing (kept for the model's id computation)

    def __post_init__(self) -> None:
        if not self.shards:
            raise ValueError("an n-gram table needs at least one shard")
        widths = {s.shape[1] for s in self.shards}
        if len(widths) != 1 or any(s.dtype != torch.int16 for s in self.shards):
            raise ValueError("n-gram shards must be int16 with one row width")
        first = self.shards[0].shape[0]
        if any(s.shape[0] != first for s in self.shards[:-1]) or self.shards[-1].shape[0] > first:
            raise ValueError("all n-gram shards but the last must hold the same number of rows")
        self.bits = bits_of(widths.pop(), self.head_bias.shape[-1])
        self.shard_rows = first
        self.num_rows = sum(s.shape[0] for s in self.shards)
        heads = self.head_offsets.shape[0]
        if self.head_bias.shape[0] != heads or self.head_vocab_sizes.shape[0] != heads:
            raise ValueError("head_bias, head_offsets and head_vocab_sizes must have one entry per head")
        if int((self.head_offsets + self.head_vocab_sizes).max()) > self.num_rows:
            raise ValueError(f"the heads' row ranges run past the table's {self.num_rows} rows")

    @property
    def resident_bytes(self) -> int:
        """Bytes the packed table occupies (what stays on the device)."""
        return sum(s.numel() * s.element_size() for s in self.shards)

    @property
    def dense_bytes(self) -> int:
        """Bytes a dense bf16 copy would take (what a loader that ignores the codec allocates)."""
        return self.num_rows * self.head_bias.shape[-1] * 2

    def heads_of(self, rows: torch.Tensor) -> torch.Tensor:
        offsets = self.head_offsets.to(rows.device)
        return (torch.searchsorted(offsets, rows, right=True) - 1).clamp(0, offsets.shape[0] - 1)

    def lookup(self, rows: torch.Tensor) -> torch.Tensor:
        """fp16 [*rows.shape, 160]: the table's rows at global indices ``rows``, decoding only those
        (``torch.ops.sparkctl_exl3.ngram_lookup``)."""
        flat = rows.reshape(-1).to(torch.int64)
        if flat.numel() and (int(flat.min()) < 0 or int(flat.max()) >= self.num_rows):
            raise IndexError(f"n-gram row index out of range 0..{self.num_rows - 1}")
        out = ngram_lookup(flat, list(self.shards), self.head_offsets, self.head_bias, self.shard_rows)
        return out.view(*rows.shape, self.head_bias.shape[-1])

    def dequantize_all(self, chunk_rows: int = 1 << 16) -> torch.Tensor:
        """The whole table, dense fp16: the check for :meth:`lookup` (tests only; never for a real table).

        Heads come from walking each head's row range, not from the search the lookup uses.
        """
        table = torch.cat(self.shards)
        heads = torch.zeros(self.num_rows, dtype=torch.int64)
        for h, (start, size) in enumerate(
            zip(self.head_offsets.tolist(), self.head_vocab_sizes.tolist(), strict=True)
        ):
            heads[start : start + size] = h
        parts = [
            dequant_rows(table[a : a + chunk_rows], heads[a : a + chunk_rows], self.head_bias)
            for a in range(0, self.num_rows, chunk_rows)
        ]
        return torch.cat(parts)


@torch.library.custom_op(
    "sparkctl_exl3::ngram_lookup",
    mutates_args=(),
    schema="(Tensor rows, Tensor[] shards, Tensor head_offsets, Tensor head_bias, int shard_rows) -> Tensor",
)
def ngram_lookup(
    rows: torch.Tensor,
    shards: list[torch.Tensor],
    head_offsets: torch.Tensor,
    head_bias: torch.Tensor,
    shard_rows: int,
) -> torch.Tensor:
    """fp16 [N, 160] rows of a packed table at global indices ``rows`` (int64 [N]), decoding only those.

    An opaque custom op (with a fake implementation) so a model compiled with torch.compile traces
    through the lookup, whose row de-duplication is data-dependent. Each distinct row is gathered from
    its shard and decoded once, then scattered back: the cost follows the rows looked up, never the
    table's size. The reference (:func:`lookup_reference`) on every device; importing
    ``sparkctl_exl3.ngram_cuda`` registers the CUDA kernel for CUDA tensors.
    """
    return lookup_reference(rows, shards, head_offsets, head_bias, shard_rows)


def lookup_reference(
    rows: torch.Tensor,
    shards: list[torch.Tensor],
    head_offsets: torch.Tensor,
    head_bias: torch.Tensor,
    shard_rows: int,
) -> torch.Tensor:
    """The lookup in torch ops (any device): the oracle the CUDA kernel is checked against, bit for bit."""
    device = shards[0].device
    unique, inverse = torch.unique(rows.to(torch.int64), return_inverse=True)
    shard_of = unique // shard_rows
    packed = torch.empty((unique.shape[0], shards[0].shape[1]), dtype=torch.int16, device=device)
    for s in torch.unique(shard_of).tolist():
        sel = shard_of == s
        local = (unique[sel] - s * shard_rows).to(device)
        packed[sel.to(device)] = shards[s].index_select(0, local)
    offsets = head_offsets.to(device)
    heads = (torch.searchsorted(offsets, unique.to(device), right=True) - 1).clamp(0, offsets.shape[0] - 1)
    decoded = dequant_rows(packed, heads, head_bias.to(device))
    return decoded[inverse.to(device)]


@ngram_lookup.register_fake
def _ngram_lookup_fake(
    rows: torch.Tensor,
    shards: list[torch.Tensor],
    head_offsets: torch.Tensor,
    head_bias: torch.Tensor,
    shard_rows: int,
) -> torch.Tensor:
    return head_bias.new_empty((rows.shape[0], head_bias.shape[-1]), dtype=torch.float16)


def _tensor_names(prefix: str, header: dict[str, object]) -> list[str]:
    names: list[str] = []
    while f"{prefix}.shard_{len(names)}.trellis" in header:
        names.append(f"{prefix}.shard_{len(names)}.trellis")
    if not names and f"{prefix}.trellis" in header:
        names = [f"{prefix}.trellis"]
    return names


def find_prefix(path: str | Path) -> str:
    """The table's module key in a file (the tensor name before ``.head_offsets``)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        keys = [k for k in f.keys() if k.endswith(".head_offsets")]  # noqa: SIM118 (safe_open is no dict)
    if len(keys) != 1:
        raise ValueError(f"{path}: expected one n-gram table (<prefix>.head_offsets), found {len(keys)}")
    return keys[0][: -len(".head_offsets")]


def load_table(path: str | Path, prefix: str | None = None, device: str | torch.device = "cpu") -> NgramTable:
    """Read a packed table from ``ngram_embedding.safetensors`` (kept packed)."""
    from safetensors import safe_open

    prefix = prefix or find_prefix(path)
    with safe_open(str(path), framework="pt", device=str(device)) as f:
        header = dict.fromkeys(f.keys())  # noqa: SIM118
        meta = f.metadata() or {}
        if meta.get("format", FORMAT) != FORMAT or meta.get("codebook", "mul1") != "mul1":
            raise ValueError(f"{path}: not an {FORMAT} table with the mul1 codebook ({meta})")
        names = _tensor_names(prefix, header)
        if not names:
            raise ValueError(f"{path}: no {prefix}.shard_0.trellis or {prefix}.trellis tensor")
        return NgramTable(
            shards=[f.get_tensor(n) for n in names],
            head_bias=f.get_tensor(f"{prefix}.head_bias"),
            head_offsets=f.get_tensor(f"{prefix}.head_offsets"),
            head_vocab_sizes=f.get_tensor(f"{prefix}.head_vocab_sizes"),
            layer_multipliers=f.get_tensor(f"{prefix}.layer_multipliers"),
        )


def save_table(path: str | Path, prefix: str, table: NgramTable, *, source: str = "sparkctl") -> None:
    """Write ``table`` in exllamav3's ``exl3_ngram_trellis`` layout (our own writer: tests, tiny packs)."""
    from safetensors.torch import save_file

    tensors = {
        f"{prefix}.head_bias": table.head_bias.to(torch.float16).contiguous(),
        f"{prefix}.head_offsets": table.head_offsets.to(torch.int64).contiguous(),
        f"{prefix}.head_vocab_sizes": table.head_vocab_sizes.to(torch.int64).contiguous(),
        f"{prefix}.layer_multipliers": table.layer_multipliers.to(torch.int64).contiguous(),
    }
    for n, shard in enumerate(table.shards):
        tensors[f"{prefix}.shard_{n}.trellis"] = shard.contiguous()
    metadata = {
        "format": FORMAT,
        "version": str(FORMAT_VERSION),
        "K": str(table.bits),
        "codebook": "mul1",
        "row_dim": str(table.head_bias.shape[-1]),
        "rows": str(table.num_rows),
        "shard_rows": str(table.shard_rows),
        "source": json.dumps(source),
    }
    save_file(tensors, str(path), metadata=metadata)


def random_table(
    heads: int, rows_per_head: int, bits: int, *, shard_rows: int, ngram_size: int = 3, seed: int = 0
) -> NgramTable:
    """A valid table of random rows (any stream decodes, SPEC 2.2) with realistic scales and biases."""
    g = torch.Generator().manual_seed(seed)
    rows = heads * rows_per_head
    words = words_per_row(bits)
    stream = torch.randint(-(1 << 15), 1 << 15, (rows, words - 1), generator=g, dtype=torch.int32)
    scales = (torch.rand(rows, generator=g) * 0.02 + 0.005).to(torch.float16)
    packed = torch.cat((scales.view(torch.int16).view(rows, 1), stream.to(torch.int16)), dim=1)
    return NgramTable(
        shards=list(torch.split(packed, shard_rows)),
        head_bias=(torch.randn(heads, ROW_DIM, generator=g) * 0.01).to(torch.float16),
        head_offsets=torch.arange(heads, dtype=torch.int64) * rows_per_head,
        head_vocab_sizes=torch.full((heads,), rows_per_head, dtype=torch.int64),
        layer_multipliers=torch.randint(1, 1 << 30, (ngram_size,), generator=g, dtype=torch.int64) * 2 + 1,
    )
