"""``cast_keeping_fp32`` keeps in float32 what diffusers' ``from_pretrained(torch_dtype=...)``
keeps: every parameter with a name part in ``_keep_in_fp32_modules`` (it matches parameter
names), the blocks' and the head's ``scale_shift_table`` included."""

import pytest
import torch

pytest.importorskip("diffusers")

from jbkv_cli.models.wan.tiny import tiny_parts


@pytest.mark.parametrize("cls", ["WanTransformer3DModel", "SkyReelsV2Transformer3DModel"])
def test_cast_keeping_fp32_keeps_every_float32_parameter(cls):
    import diffusers

    transformer, *_ = tiny_parts(getattr(diffusers, cls), 0, torch.bfloat16)
    keep = set(transformer._keep_in_fp32_modules)
    assert "scale_shift_table" in keep
    for name, param in transformer.named_parameters():
        want = torch.float32 if keep & set(name.split(".")) else torch.bfloat16
        assert param.dtype == want, name
    assert transformer.scale_shift_table.dtype == torch.float32
    assert transformer.blocks[0].scale_shift_table.dtype == torch.float32
    assert transformer.blocks[0].attn1.to_q.weight.dtype == torch.bfloat16
