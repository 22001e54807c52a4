"""Decode's fused Gated DeltaNet step (`gpu/model/cpu_gdn_step.py`) against the torch form it replaces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from hybridcache.gpu.model import cpu_gdn_step, cpu_kernels, load_model
from hybridcache.gpu.state_slots import plan_slot_runs

STATUS = cpu_kernels.status()
pytestmark = pytest.mark.skipif(not STATUS.active, reason=f"CPU kernels not in use here: {STATUS.reason}")

SLOTS = [3, 0, 5]  # out of order and not consecutive


def _layer_and_planes(checkpoint: Path):
    model = load_model(checkpoint, dtype=torch.bfloat16)
    layer = model.layers[0].mixer
    states = model.new_state_slots(6)
    conv, recurrent = states.conv_planes[0], states.recurrent_planes[0]
    generator = torch.Generator().manual_seed(4)
    conv.copy_(torch.randn(conv.shape, generator=generator).to(conv.dtype))
    recurrent.copy_(torch.randn(recurrent.shape, generator=generator) * 0.1)
    return model, layer, conv, recurrent


def _steps(layer, conv, recurrent, slots, fused: bool, monkeypatch, steps: int = 4) -> list[torch.Tensor]:
    monkeypatch.setattr(cpu_gdn_step, "applies", lambda *_: fused)
    generator = torch.Generator().manual_seed(9)
    outputs = []
    for _ in range(steps):
        x = torch.randn(len(slots), layer.out_proj.shape[0], generator=generator).to(torch.bfloat16)
        outputs.append(layer.decode(x, conv, recurrent, plan_slot_runs(slots)))
    monkeypatch.undo()
    return outputs


def test_the_fused_step_computes_what_the_torch_form_does(dense_checkpoint: Path, monkeypatch):
    _, layer, conv, recurrent = _layer_and_planes(dense_checkpoint)
    torch_conv, torch_recurrent = conv.clone(), recurrent.clone()
    fused = _steps(layer, conv, recurrent, SLOTS, True, monkeypatch)
    plain = _steps(layer, torch_conv, torch_recurrent, SLOTS, False, monkeypatch)
    assert torch.equal(conv, torch_conv), "the conv history is a shift of bf16 inputs: identical"
    # fp32 states after four steps: the same arithmetic in another order, so equal to float32 rounding
    # (measured: 1.5e-8 at most, on states of about 0.5)
    assert torch.allclose(recurrent, torch_recurrent, rtol=1e-5, atol=1e-6)
    untouched = [slot for slot in range(recurrent.shape[0]) if slot not in SLOTS]
    assert torch.equal(recurrent[untouched], torch_recurrent[untouched])
    for got, expected in zip(fused, plain):
        assert got.dtype == torch.bfloat16
        assert torch.allclose(got.float(), expected.float(), rtol=2**-7, atol=2**-7)  # a bf16 ulp


def test_each_lane_is_independent_of_the_batch_and_threads(dense_checkpoint: Path, monkeypatch):
    _, layer, conv, recurrent = _layer_and_planes(dense_checkpoint)
    alone_conv, alone_recurrent = conv.clone(), recurrent.clone()
    batched = _steps(layer, conv, recurrent, SLOTS, True, monkeypatch, steps=1)[0]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        x = torch.randn(len(SLOTS), layer.out_proj.shape[0], generator=torch.Generator().manual_seed(9))
        x = x.to(torch.bfloat16)
        for lane, slot in enumerate(SLOTS):
            alone = layer.decode(x[lane : lane + 1], alone_conv, alone_recurrent, plan_slot_runs([slot]))
            assert torch.equal(alone[0], batched[lane])
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(conv, alone_conv) and torch.equal(recurrent, alone_recurrent)


def test_it_applies_to_bf16_on_the_cpu_only(dense_checkpoint: Path):
    model32 = load_model(dense_checkpoint, dtype=torch.float32)
    layer = model32.layers[0].mixer
    states = model32.new_state_slots(2)
    x = torch.zeros(1, layer.out_proj.shape[0])
    assert not cpu_gdn_step.applies(layer, x, states.conv_planes[0])
    model16 = load_model(dense_checkpoint, dtype=torch.bfloat16)
    layer16 = model16.layers[0].mixer
    assert cpu_gdn_step.applies(layer16, x.to(torch.bfloat16), model16.new_state_slots(2).conv_planes[0])


@pytest.mark.parametrize(
    ("key_heads", "value_heads", "head_dim"),
    [(1, 1, 8), (2, 4, 128)],
    ids=["channels-not-a-multiple-of-16", "conv-split-in-blocks"],
)
def test_every_conv_path_computes_what_the_torch_form_does(key_heads, value_heads, head_dim, monkeypatch):
    """Shapes the checkpoints do not have: 24 conv channels (16 vectorized, 8 by the scalar loop) and 768
    (split in parallel blocks of 512)."""
    from hybridcache.gpu.model.gated_deltanet import GatedDeltaNet

    generator = torch.Generator().manual_seed(2)

    def weight(*shape, scale=0.2):
        return (torch.randn(shape, generator=generator) * scale).to(torch.bfloat16)

    hidden, kernel = 64, 4
    conv_dim = (2 * key_heads + value_heads) * head_dim
    layer = GatedDeltaNet(
        in_proj=weight(conv_dim + value_heads * head_dim + 2 * value_heads, hidden),
        conv_weight=weight(conv_dim, kernel, scale=0.5),
        neg_a=-torch.rand(value_heads, generator=generator) - 0.1,
        dt_bias=weight(value_heads),
        norm_weight=weight(head_dim, scale=1.0),
        out_proj=weight(hidden, value_heads * head_dim),
        key_heads=key_heads,
        value_heads=value_heads,
        key_head_dim=head_dim,
        value_head_dim=head_dim,
        eps=1e-6,
    )
    conv = weight(4, conv_dim, kernel - 1, scale=1.0)
    recurrent = torch.randn(4, value_heads, head_dim, head_dim, generator=generator) * 0.1
    torch_conv, torch_recurrent = conv.clone(), recurrent.clone()
    fused = _steps(layer, conv, recurrent, [2, 0], True, monkeypatch)
    plain = _steps(layer, torch_conv, torch_recurrent, [2, 0], False, monkeypatch)
    assert torch.equal(conv, torch_conv)
    assert torch.allclose(recurrent, torch_recurrent, rtol=1e-5, atol=1e-6)
    for got, expected in zip(fused, plain):
        assert torch.allclose(got.float(), expected.float(), rtol=2**-7, atol=2**-7)
