"""MTP self-distillation (pretrain/mtp_distill.py): the drafts come to agree with the frozen
trunk, the trunk does not move, new depths are added and saved."""

from __future__ import annotations

import random

import torch

from opencomposer.model import ModelConfig, Transformer, load_pretrained, save_pretrained
from opencomposer.pretrain.mtp_distill import add_mtp_modules, distill_mtp, mtp_agreement

CONFIG = dict(vocab_size=48, hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
              norm_topk_prob=True, num_mtp_modules=1, max_position_embeddings=128)


def _trained_trunk() -> tuple[Transformer, list[list[int]]]:
    """A trunk that has learnt a bigram language (next token = perm[token]), so that its
    predictions are confident, with its MTP module left at its random initialisation."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**CONFIG))
    rng = random.Random(0)
    perm = list(range(48))
    rng.shuffle(perm)
    seqs = []
    for _ in range(40):
        seq = [rng.randrange(48)]
        while len(seq) < rng.randrange(40, 64):
            seq.append(perm[seq[-1]])
        seqs.append(seq)
    trunk = [p for n, p in model.named_parameters() if not n.startswith("mtp.")]
    opt = torch.optim.AdamW(trunk, lr=1e-2)
    for step in range(40):
        ids = torch.tensor([s[:32] for s in rng.sample(seqs, 8)])
        loss = torch.nn.functional.cross_entropy(model(ids).logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), seqs


def test_distillation_raises_agreement_and_leaves_the_trunk_alone():
    model, seqs = _trained_trunk()
    trunk = {n: p.detach().clone() for n, p in model.named_parameters() if not n.startswith("mtp.")}
    report = distill_mtp(model, seqs, num_modules=2, steps=40, batch_size=8, seq_len=32, lr=1e-2, log=None)
    assert report["num_modules"] == 2 and model.config.num_mtp_modules == 2
    before, after = report["agreement_before"], report["agreement_after"]
    assert before[0] < 0.3 and before[1] < 0.3, report
    assert after[0] > 0.9 and after[1] > 0.9, report  # the second depth started as a copy of the first
    for n, p in model.named_parameters():
        if n in trunk:
            assert torch.equal(p, trunk[n]), n
    assert all(p.requires_grad for p in model.parameters())  # left as it was found


def test_added_depths_start_as_copies_and_survive_a_checkpoint(tmp_path):
    model, seqs = _trained_trunk()
    add_mtp_modules(model, 3)
    assert len(model.mtp) == 3 and model.config.num_mtp_modules == 3
    torch.testing.assert_close(model.mtp[2].eh_proj.weight, model.mtp[0].eh_proj.weight)
    assert model.mtp[2].eh_proj.weight is not model.mtp[0].eh_proj.weight
    save_pretrained(model, tmp_path / "m")
    loaded = load_pretrained(tmp_path / "m", dtype=torch.float32)
    assert loaded.config.num_mtp_modules == 3
    assert mtp_agreement(loaded, seqs[:4], seq_len=32) == mtp_agreement(model, seqs[:4], seq_len=32)
