"""Context extension: pretrain at a short length, extend with YaRN to 4x, keep the short-sequence loss.

The criterion, and why it is this one: a ~0.7M-parameter model trained for a few dozen CPU
steps has learned token statistics, not long-range structure, so its loss barely depends on
position and "better on long sequences than before extension" would be a coin flip decided
by a handful of optimizer steps. What must hold at any scale, and would fail if the extension
broke the model (wrong YaRN frequencies or attention scale, RoPE not switched, a phase that
damages the weights), is checked instead:
  * the extended model's loss on short sequences is within 0.05 nats of the model before
    extension (it keeps what it learned);
  * on 4x longer sequences (past the original max_position_embeddings) its loss is finite and
    within 0.05 nats of its short-sequence loss and of the unextended model's long-sequence loss;
  * its config is YaRN with factor 4 over the original length, so it loads and serves as such.
"""

from __future__ import annotations

import math

import pytest
import torch

from opencomposer.model import load_pretrained
from opencomposer.pretrain.config import parse_config
from opencomposer.pretrain.data import TokenCorpus
from opencomposer.pretrain.train import PretrainLoss, evaluate, train

SHORT, LONG = 32, 128


@pytest.mark.slow
def test_yarn_extension_keeps_short_loss_and_handles_long_sequences(make_config):
    base = make_config(
        phases=[{"name": "main", "steps": 20, "seq_len": SHORT, "batch_size": 8, "lr": 3e-3, "warmup_steps": 3},
                {"name": "extend", "steps": 4, "seq_len": LONG, "batch_size": 2, "lr": 1e-3, "warmup_steps": 1,
                 "yarn_factor": LONG / SHORT}],
        checkpoint={"every_steps": 20, "keep_last": 3}, eval_every=100)
    base["model"]["max_position_embeddings"] = SHORT
    cfg = parse_config(base)
    train(cfg)
    corpus = TokenCorpus.build(cfg.data)

    def losses(model):
        runner = PretrainLoss(model, cfg.mtp)
        return (evaluate(runner, corpus.val, SHORT, 32, 8, use_mtp=False)["eval_loss_main"],
                evaluate(runner, corpus.val, LONG, 8, 8, use_mtp=False)["eval_loss_main"])

    before = load_pretrained(f"{cfg.run.out_dir}/checkpoints/step_0000020/model")
    after = load_pretrained(f"{cfg.run.out_dir}/model")
    assert before.config.rope_scaling is None
    assert after.config.rope_scaling == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": SHORT}
    assert after.config.max_position_embeddings == LONG
    short0, long0 = losses(before)
    short1, long1 = losses(after)
    print(f"before: short {short0:.4f} long {long0:.4f}; after: short {short1:.4f} long {long1:.4f}")
    assert short1 <= short0 + 0.05
    assert math.isfinite(long1) and long1 <= short1 + 0.05 and long1 <= long0 + 0.05
    with torch.no_grad():  # 8x the original length still runs
        logits = after(torch.randint(16, 4096, (1, 8 * SHORT))).logits
    assert torch.isfinite(logits).all()
