"""The n-gram (PLE) table codec: the lookup decodes only the rows asked for, bit for bit as a full
dequantization of the table does, and both follow the format's per-element definition."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from sparkctl_exl3 import ngram


def _scalar_row(words: list[int], bits: int, bias: list[float]) -> list[int]:
    """One row decoded element by element from the format's definition, in plain Python (fp16 bit patterns).

    Bit m of position i's state is stream bit ((i - m // K) mod 160) * K + m % K, stream bit b being bit
    b & 15 of word 1 + b // 16; the value is fp16(mul1(state)) * scale + bias, rounded to fp16 once.
    """
    u16 = [w & 0xFFFF for w in words]
    f16 = lambda bits16: struct.unpack("<e", struct.pack("<H", bits16))[0]  # noqa: E731
    scale = f16(u16[0])
    out = []
    for i in range(ngram.ROW_DIM):
        state = 0
        for m in range(16):
            b = ((i - m // bits) % ngram.ROW_DIM) * bits + m % bits
            state |= ((u16[1 + (b >> 4)] >> (b & 15)) & 1) << m
        x = (state * 0x83DCD12D) & 0xFFFFFFFF
        s = sum((x >> (8 * k)) & 0xFF for k in range(4))
        cb = struct.unpack("<e", struct.pack("<e", (1024 + s) * f16(0x1EEE) + f16(0xC931)))[0]
        v = np.float32(cb) * np.float32(scale) + np.float32(bias[i])  # fp32, like the kernel
        out.append(int(np.float16(v).view(np.uint16)))
    return out


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
def test_rows_follow_the_format_definition(bits: int) -> None:
    table = ngram.random_table(3, 5, bits, shard_rows=7, seed=bits)
    rows = torch.tensor([0, 4, 9, 14])
    got = table.lookup(rows).view(torch.int16).tolist()
    packed = torch.cat(table.shards)
    heads = table.heads_of(rows)
    for r, h, row in zip(rows.tolist(), heads.tolist(), got, strict=True):
        want = _scalar_row(packed[r].tolist(), bits, table.head_bias[h].float().tolist())
        assert [v & 0xFFFF for v in row] == want, (bits, r)


@pytest.mark.parametrize("bits", [2, 5, 8])
def test_lookup_matches_full_dequantization_bit_for_bit(bits: int) -> None:
    # 5 heads of 77 rows in shards of 64: heads straddle shards, the last shard is short
    table = ngram.random_table(5, 77, bits, shard_rows=64, seed=10 + bits)
    full = table.dequantize_all(chunk_rows=50)
    assert full.shape == (385, ngram.ROW_DIM)
    ids = torch.randint(0, table.num_rows, (4, 33), generator=torch.Generator().manual_seed(bits))
    ids[0, :3] = torch.tensor([0, 384, 0])  # the ends, and a repeat
    got = table.lookup(ids)
    assert got.shape == (4, 33, ngram.ROW_DIM) and got.dtype == torch.float16
    assert torch.equal(got.view(torch.int16), full[ids].view(torch.int16))


def test_pack_and_unpack_are_inverse_for_consistent_states() -> None:
    bits = 3
    g = torch.Generator().manual_seed(3)
    symbols = torch.randint(0, 1 << bits, (6, ngram.ROW_DIM), generator=g)
    states = torch.zeros_like(symbols)
    for j in range((15 + bits) // bits):  # state i = its symbol, then i-1's, ... (tail-biting)
        states |= torch.roll(symbols, j, dims=1) << (j * bits)
    states &= 0xFFFF
    scales = torch.rand(6, generator=g).to(torch.float16)
    packed = ngram.pack_rows(states, scales, bits)
    assert packed.shape == (6, ngram.words_per_row(bits)) == (6, 31)
    back, back_scales = ngram.unpack_rows(packed)
    assert torch.equal(back, states) and torch.equal(back_scales.view(torch.int16), scales.view(torch.int16))


def test_saved_table_loads_packed(tmp_path: Path) -> None:
    table = ngram.random_table(4, 50, 5, shard_rows=64)
    ngram.save_table(tmp_path / "ngram_embedding.safetensors", "m.layers.1.ple.ngram_embedding", table)
    loaded = ngram.load_table(tmp_path / "ngram_embedding.safetensors")
    assert [s.shape for s in loaded.shards] == [s.shape for s in table.shards]
    assert loaded.resident_bytes == 200 * 51 * 2 < loaded.dense_bytes == 200 * 160 * 2
    ids = torch.arange(200)
    assert torch.equal(loaded.lookup(ids).view(torch.int16), table.dequantize_all()[ids].view(torch.int16))


def test_bad_input_is_refused() -> None:
    table = ngram.random_table(2, 10, 4, shard_rows=8)
    with pytest.raises(IndexError):
        table.lookup(torch.tensor([20]))
    with pytest.raises(ValueError, match="not a 160-wide n-gram ring"):
        ngram.bits_of(30)
    with pytest.raises(ValueError, match="same number of rows"):
        ngram.NgramTable(
            shards=[table.shards[0][:4], table.shards[0]],
            head_bias=table.head_bias,
            head_offsets=torch.tensor([0, 6]),
            head_vocab_sizes=torch.tensor([6, 6]),
            layer_multipliers=table.layer_multipliers,
        )


def test_lookup_is_an_opaque_op_torch_compile_traces() -> None:
    table = ngram.random_table(3, 40, 4, shard_rows=50, seed=7)
    ids = torch.tensor([3, 119, 3, 60])
    direct = torch.ops.sparkctl_exl3.ngram_lookup(ids, table.shards, table.head_offsets, table.head_bias, 50)

    def embed(rows: torch.Tensor) -> torch.Tensor:
        return ngram.ngram_lookup(rows, table.shards, table.head_offsets, table.head_bias, 50).float() * 2

    compiled = torch.compile(embed, fullgraph=True, backend="eager")
    assert torch.equal(compiled(ids), direct.float() * 2)
    assert torch.equal(direct.view(torch.int16), table.dequantize_all()[ids].view(torch.int16))
