"""The fused one-token decode step (engine/fused.py) against the model's generic cached forward."""

from __future__ import annotations

import copy

import pytest
import torch

from opencomposer.engine import kernels
from opencomposer.engine.fused import FusedDecoder
from opencomposer.model.model import KVCache, MoE

from engine_util import tiny_model


def _both(model, packed: bool, slots: list[int], prompt_len: int = 7, seed: int = 0):
    """(generic logits, experts), (fused logits, experts) for one decode step of `slots`, each
    on its own cache holding the same prompts."""
    out = []
    for fused in (False, True):
        m = copy.deepcopy(model)
        if packed:
            kernels.prepack(m)
        cache = KVCache(m.config, max_slots=8, max_len=32)
        g = torch.Generator().manual_seed(seed)
        slots_B = torch.tensor(slots)
        with torch.inference_mode():
            # rows of different lengths: the mask and positions differ per row
            for b, s in enumerate(slots):
                ids = torch.randint(0, m.config.vocab_size, (1, prompt_len + b), generator=g)
                m(ids, cache, torch.tensor([s]))
                cache.advance([s], prompt_len + b)
            ids_B = torch.randint(0, m.config.vocab_size, (len(slots),), generator=g)
            if fused:
                out.append(FusedDecoder(m, cache, packed).decode(ids_B, slots, want_experts=True)[:2])
            else:
                o = m(ids_B[:, None], cache, slots_B, return_routed_experts=True)
                out.append((o.logits[:, 0], o.routed_experts[:, 0]))
    return out


@pytest.mark.parametrize("packed", [True, False])
@pytest.mark.parametrize("slots", [[0, 1, 2, 3, 4], [5, 1, 3], [5, 1], [2]])  # N*K >= E: dense experts
def test_fused_step_equals_generic_cached_forward(packed, slots):
    if packed and not kernels.available():
        pytest.skip("oneDNN is not available in this torch build")
    model = tiny_model(shared_expert_intermediate_size=12, attention_bias=True)
    (a, ea), (b, eb) = _both(model, packed, slots)
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    assert eb.dtype == torch.int32 and (ea == eb).all()


def test_fused_step_follows_in_place_weight_updates():
    model = tiny_model()
    kernels.prepack(model)
    cache = KVCache(model.config, max_slots=4, max_len=16)
    dec = FusedDecoder(model, cache, packed=True)
    ids_B, slots = torch.tensor([3, 4, 5, 6]), [0, 1, 2, 3]
    with torch.inference_mode():
        before = dec.decode(ids_B, slots)[0]
    moe = next(layer.mlp for layer in model.layers if isinstance(layer.mlp, MoE))
    with torch.no_grad():
        model.layers[0].self_attn.k_norm.weight.mul_(3.0)
        moe.experts.down_proj.mul_(-2.0)
    with torch.inference_mode():
        after = dec.decode(ids_B, slots)[0]
        want = model(ids_B[:, None], cache, torch.tensor(slots)).logits[:, 0]
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, want, atol=1e-5, rtol=1e-5)
