"""The n-gram (PLE) lookup kernel (``csrc/exl3_ngram.cu``) against the reference, bit for bit on the decoded rows.

Needs a CUDA device (CI has none: skipped there). Every K 1..8, tables split in shards with a short last shard,
heads straddling shards, repeated and boundary rows; the op under a CUDA-graph replay with new rows; and a table
of the real model's row width at K=5, and a row index past 2^31 (outside the table: left zero).
"""

from __future__ import annotations

import pytest
import torch
from sparkctl_exl3 import ngram

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.fixture(scope="module")
def kernel():
    from sparkctl_exl3 import ngram_cuda

    if not ngram_cuda.available():
        pytest.fail(f"the n-gram kernel did not build: {ngram_cuda.unavailable_reason()}")
    return ngram_cuda


def _on(table: ngram.NgramTable, device: str) -> ngram.NgramTable:
    return ngram.NgramTable(
        shards=[s.to(device) for s in table.shards],
        head_bias=table.head_bias.to(device),
        head_offsets=table.head_offsets.to(device),
        head_vocab_sizes=table.head_vocab_sizes.to(device),
        layer_multipliers=table.layer_multipliers.to(device),
    )


def _ids(n: int, rows: int, seed: int) -> torch.Tensor:
    ids = torch.randint(0, rows, (n,), generator=torch.Generator().manual_seed(seed))
    ids[:4] = torch.tensor([0, rows - 1, 0, rows // 2])
    return ids


@pytest.mark.parametrize("bits", [1, 2, 3, 4, 5, 6, 7, 8])
def test_kernel_matches_the_reference_bit_for_bit(kernel, bits: int) -> None:
    table = ngram.random_table(5, 301, bits, shard_rows=256, seed=100 + bits)  # 6 shards, the last short
    ids = _ids(2000, table.num_rows, bits)
    want = ngram.lookup_reference(ids, table.shards, table.head_offsets, table.head_bias, table.shard_rows)
    gpu = _on(table, "cuda")
    got = kernel.lookup(ids.cuda(), gpu.shards, gpu.head_offsets, gpu.head_bias, gpu.shard_rows)
    assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))
    # the custom op dispatches CUDA tensors to the kernel
    op = torch.ops.sparkctl_exl3.ngram_lookup(ids.cuda(), gpu.shards, gpu.head_offsets, gpu.head_bias, 256)
    assert torch.equal(op.cpu().view(torch.int16), want.view(torch.int16))


def test_real_row_width_and_head_layout(kernel) -> None:
    # Qwen3.8-Flash-Next's rows: 160 positions at K=5 (51 words), heads of 150 rows over one 2400-row shard
    base = ngram.random_table(4, 600, 5, shard_rows=2400, seed=7)
    offsets = torch.tensor([0, 150, 300, 450], dtype=torch.int64)
    table = ngram.NgramTable(
        base.shards, base.head_bias, offsets, torch.full((4,), 150), base.layer_multipliers
    )
    ids = _ids(4096, table.num_rows, 8)
    want = ngram.lookup_reference(ids, table.shards, table.head_offsets, table.head_bias, table.shard_rows)
    gpu = _on(table, "cuda")
    got = kernel.lookup(ids.cuda(), gpu.shards, gpu.head_offsets, gpu.head_bias, gpu.shard_rows)
    assert torch.equal(got.cpu().view(torch.int16), want.view(torch.int16))
    far = torch.tensor([(1 << 31) + 5], dtype=torch.int64)
    moved = kernel.lookup(far.cuda(), gpu.shards, gpu.head_offsets, gpu.head_bias, gpu.shard_rows)
    assert not moved.any()  # a row past the table reads nothing


def test_lookup_replays_in_a_cuda_graph(kernel) -> None:
    table = _on(ngram.random_table(3, 500, 5, shard_rows=1500, seed=3), "cuda")
    ids = torch.zeros(64, dtype=torch.int64, device="cuda")
    torch.ops.sparkctl_exl3.ngram_lookup(
        ids, table.shards, table.head_offsets, table.head_bias, 1500
    )  # warm-up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.sparkctl_exl3.ngram_lookup(
            ids, table.shards, table.head_offsets, table.head_bias, 1500
        )
    new = _ids(64, table.num_rows, 11)
    ids.copy_(new.cuda())
    graph.replay()
    cpu = _on(table, "cpu")
    want = ngram.lookup_reference(new, cpu.shards, cpu.head_offsets, cpu.head_bias, 1500)
    assert torch.equal(out.cpu().view(torch.int16), want.view(torch.int16))
