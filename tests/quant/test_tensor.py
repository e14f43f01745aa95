"""What a stored tensor holds: an exact tensor is kept in a storage of its own."""

from __future__ import annotations

import torch

from jbkv_cli.quant.tensor import RawTensor, compact


def test_a_view_is_kept_as_a_compact_copy():
    """V sliced from a fused QKV projection would keep Q and K alive: the copy holds V only."""
    qkv = torch.randn(1, 8, 3, 2, 4, generator=torch.Generator().manual_seed(0))
    v = qkv.permute(2, 0, 3, 1, 4)[2]  # [B, H, L, D], a view of the whole qkv storage
    stored = RawTensor(v)
    assert stored.data.untyped_storage().nbytes() == stored.nbytes == v.numel() * 4
    assert torch.equal(stored.dequantize(), v)
    assert stored.data.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()


def test_a_tensor_on_its_whole_storage_is_kept_as_is():
    x = torch.zeros(2, 3, 5)
    assert compact(x) is x
    assert compact(x.transpose(0, 2)).data_ptr() == x.data_ptr()  # permuted, still all of it
    assert compact(x[:, :2]).untyped_storage().nbytes() == 2 * 2 * 5 * 4
