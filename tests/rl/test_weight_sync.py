"""Weight sync: after a sync the engine computes the trainer's logits; the delta path sends fewer
bytes when few tensors changed and ends with identical weights; the disk path writes a complete,
loadable checkpoint per version through the server's /update_weights_from_disk."""

from __future__ import annotations

import copy

import pytest
import torch
from fastapi.testclient import TestClient

from opencomposer.rl.config import TrainConfig
from opencomposer.engine.engine import Engine
from opencomposer.engine.server import create_app
from opencomposer.engine.types import GenerationRequest, SamplingParams
from opencomposer.errors import InferenceError
from opencomposer.model import load_pretrained
from opencomposer.model.tokenizer import bundled_tokenizer
from opencomposer.rl.rewards import RewardConfig
from opencomposer.rl.trainer import Trainer
from opencomposer.rl.weight_sync import DiskSync, InPlaceSync

from trainer_util import random_groups, tiny_model

IDS = torch.tensor([[1, 5, 9, 300, 17, 42, 7]])


def trained(freeze_embeddings=False, steps=1):
    """A tiny model after `steps` trainer steps (the engine holds a copy of its initial weights)."""
    model = tiny_model()
    engine = Engine(copy.deepcopy(model), max_slots=4, max_len=64)
    if freeze_embeddings:
        model.embed_tokens.weight.requires_grad_(False)
        model.lm_head.weight.requires_grad_(False)
    trainer = Trainer(model, TrainConfig(router_replay=False, optim={"lr": 1e-3}), reward=RewardConfig(kl_coef=0.0))
    for i in range(steps):
        trainer.step(random_groups(seed=i))
    return model, trainer, engine


def logits(model):
    with torch.no_grad():
        return model.eval()(IDS).logits


def assert_same_logits(engine_model, model):
    """Equal up to float rounding: the engine runs its own (prepacked oneDNN) kernels on the same weights."""
    torch.testing.assert_close(logits(engine_model), logits(model), atol=1e-5, rtol=1e-5)


def assert_same_weights(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("delta", [False, True])
def test_in_place_sync_makes_the_engine_compute_the_trainers_logits(delta):
    model, trainer, engine = trained()
    assert not torch.allclose(logits(engine.model), logits(model), atol=1e-3)
    stats = InPlaceSync(engine, delta=delta).sync(model, trainer.version)
    assert engine.policy_version == trainer.version == stats.version == 1
    assert_same_weights(engine.model, model)
    assert_same_logits(engine.model, model)
    # and generation reports the trainer's log-probabilities, under the new version
    r = engine.generate_batch([GenerationRequest(IDS[0].tolist(), SamplingParams(max_new_tokens=3, seed=1))])[0]
    full = torch.tensor([IDS[0].tolist() + r.output_ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(full).logits[0, IDS.shape[1] - 1:-1].float(), -1)
    want = lp.gather(-1, torch.tensor(r.output_ids)[:, None]).squeeze(-1)
    torch.testing.assert_close(torch.tensor(r.logprobs), want, atol=1e-5, rtol=0)
    assert r.policy_versions == [1, 1, 1]
    engine.stop()


def test_delta_sends_only_changed_tensors_and_ends_identical():
    model, trainer, engine = trained(freeze_embeddings=True)
    sync = InPlaceSync(engine, delta=True)
    first = sync.sync(model, trainer.version)
    assert first.bytes_sent == first.bytes_full  # nothing synced yet: everything goes
    trainer.step(random_groups(seed=7))
    second = sync.sync(model, trainer.version)
    frozen = 2 * model.embed_tokens.weight.numel() * 4  # embeddings + lm_head, float32
    assert second.bytes_sent <= second.bytes_full - frozen
    assert second.tensors_sent < second.tensors_total
    assert_same_weights(engine.model, model)
    # full sync moves everything every time, for the same result
    model2, trainer2, engine2 = trained(freeze_embeddings=True)
    full = InPlaceSync(engine2, delta=False)
    full.sync(model2, trainer2.version)
    trainer2.step(random_groups(seed=7))
    assert full.sync(model2, trainer2.version).bytes_sent == second.bytes_full
    assert_same_weights(engine2.model, engine.model)


def test_nothing_changed_sends_nothing():
    model, trainer, engine = trained()
    sync = InPlaceSync(engine)
    sync.sync(model, 1)
    again = sync.sync(model, 2)
    assert again.bytes_sent == 0 and again.tensors_sent == 0 and engine.policy_version == 2


def serve(engine):
    tok = bundled_tokenizer()
    app = create_app(engine, tok, max_len=64, vocab_size=tok.vocab_size, update_from_disk=engine.update_weights_from_disk)
    return TestClient(app)


def test_disk_sync_through_the_server_route(tmp_path):
    model, trainer, engine = trained(freeze_embeddings=True)
    sync = DiskSync("http://testserver", tmp_path / "sync", delta=True, client=serve(engine))
    first = sync.sync(model, trainer.version)
    assert engine.policy_version == 1
    assert_same_logits(engine.model, model)
    trainer.step(random_groups(seed=3))
    second = sync.sync(model, trainer.version)
    assert engine.policy_version == 2
    assert_same_weights(engine.model, model)
    assert second.bytes_sent < second.bytes_full == first.bytes_full
    v1, v2 = tmp_path / "sync" / "v1", tmp_path / "sync" / "v2"
    # unchanged shards are the previous version's files (hard links), not copies
    emb = "embed_tokens.weight.safetensors"
    assert (v1 / emb).stat().st_ino == (v2 / emb).stat().st_ino
    # each version directory is a complete HF checkpoint on its own
    assert_same_weights(load_pretrained(v2), model)


def test_disk_sync_keeps_the_last_directories_and_reports_refusals(tmp_path):
    model, trainer, engine = trained()
    sync = DiskSync("http://testserver", tmp_path / "sync", client=serve(engine), keep=2)
    for v in (1, 2, 3):
        sync.sync(model, v)
    assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["v2", "v3"]

    class Refusing:
        def post(self, url, json, timeout):
            return type("R", (), {"status_code": 400, "content": b"x", "text": "bad",
                                  "json": lambda self: {"success": False, "message": "config differs"}})()

    with pytest.raises(InferenceError, match="config differs"):
        DiskSync("http://x", tmp_path / "s2", client=Refusing()).sync(model, 1)
