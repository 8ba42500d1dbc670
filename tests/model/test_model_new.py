"""`opencomposer model new`: the checkpoint loads in transformers (model and tokenizer) with our logits
and ids, carries its serving files, runs `opencomposer eval --policy engine:DIR`; bad input stops with
the fix."""

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from opencomposer.cli import app
from opencomposer.errors import CheckpointError, ConfigError
from opencomposer.model import load_pretrained, save_pretrained
from opencomposer.model.chat import encode_messages
from opencomposer.model.export import check_tokenizer
from opencomposer.model.new import new_checkpoint
from opencomposer.model.tokenizer import load_tokenizer


SMOKE = Path(__file__).resolve().parents[2] / "tasks" / "suites" / "smoke"


def model_new(*args):
    return CliRunner().invoke(app, ["model", "new", *map(str, args)])


@pytest.mark.parametrize("arch,vocab,fmt", [
    ("qwen3_moe", "qwen", "opencomposer"), ("qwen3", "bundled", "opencomposer"), ("qwen3", "deepseek", "opencomposer"),
    ("qwen3_moe", "qwen", "qwen3"), ("qwen3", "qwen", "qwen3_coder"), ("qwen3", "bundled", "qwen3"),
    ("qwen3_moe", "deepseek", "qwen3_coder")])
def test_model_new_loads_in_transformers_with_the_same_logits_and_ids(arch, vocab, fmt, tmp_path):
    import transformers

    r = model_new("--arch", arch, "--vocab", vocab, "--format", fmt, "--set", "num_hidden_layers=1", "--out", tmp_path)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output)
    assert summary["architecture"] == ("Qwen3MoeForCausalLM" if arch == "qwen3_moe" else "Qwen3ForCausalLM")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json", "opencomposer.json"):
        assert (tmp_path / name).is_file(), name
    ours, tok = load_pretrained(tmp_path), load_tokenizer(checkpoint=tmp_path)
    assert ours.config.num_hidden_layers == 1 and tok.chat_format == fmt
    if vocab == "qwen":
        assert ours.config.vocab_size == 151936 and tok.special["<|im_end|>"] == 151645
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path)
    text = "def f(x):\n    return x + 1  # 中文 🙂\n"
    ids = tok.encode(text)
    assert hf_tok(text, add_special_tokens=False).input_ids == ids
    with torch.no_grad():
        torch.testing.assert_close(hf(torch.tensor([ids])).logits, ours(torch.tensor([ids])).logits, atol=1e-4, rtol=0)
    generation = json.loads((tmp_path / "generation_config.json").read_text())
    assert tok.special["<|im_end|>"] in generation["eos_token_id"]  # the turn end stops generate and vLLM
    assert hf.generation_config.eos_token_id == generation["eos_token_id"]
    # the exported template, as transformers applies it, gives opencomposer's ids
    conversation = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "fix f.py 中文"}]
    want = encode_messages(tok, conversation, add_generation_prompt=True)
    assert hf_tok.apply_chat_template(conversation, tokenize=True, add_generation_prompt=True,
                                      return_dict=False) == want
    meta = json.loads((tmp_path / "opencomposer.json").read_text())
    assert meta["chat_format"] == fmt and meta["tool_parser"] == {"opencomposer": "opencomposer", "qwen3": "hermes",
                                                                  "qwen3_coder": "qwen3_coder"}[fmt]
    if vocab == "qwen" and fmt != "opencomposer":
        assert summary["added_tokens"] == [] and tok.vocab_size == 151669  # Qwen3's own tokens at their own ids


def test_model_new_checkpoint_runs_opencomposer_eval(tmp_path):
    from opencomposer.harness.trajectory import read_jsonl

    ckpt = tmp_path / "ckpt"
    assert model_new("--arch", "qwen3_moe", "--vocab", "qwen", "--format", "opencomposer", "--out", ckpt).exit_code == 0
    (tmp_path / "agent.yaml").write_text("max_turns: 2\nmax_new_tokens: 8\ntemperature: 0\n")
    r = CliRunner().invoke(app, ["eval", "--suite", str(SMOKE), "--policy", f"engine:{ckpt}", "--out", str(tmp_path / "run"), "--tasks",
                                 "dates*", "--agent-config", str(tmp_path / "agent.yaml"), "--no-progress"])
    assert r.exit_code == 0, r.output
    row = json.loads((tmp_path / "run" / "results.json").read_text())["rows"][0]
    assert row["status"] == "done" and row["turns"] == 2
    seg = read_jsonl(tmp_path / "run" / "trajectories.jsonl")[0].segments[0]
    assert sum(seg.loss_mask) == 16 and max(seg.token_ids) >= 4096  # sampled from Qwen's 151,936 ids


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--arch", "llama", "--vocab", "bundled", "--format", "opencomposer"], "unknown --arch 'llama'; known: qwen3, qwen3_moe"),
    (["--arch", "qwen3", "--vocab", "gpt2", "--format", "opencomposer"], "unknown --vocab 'gpt2'; known: qwen, deepseek, bundled"),
    (["--arch", "qwen3", "--vocab", "bundled", "--format", "chatml"], "unknown chat format 'chatml'; known formats: opencomposer, qwen3, qwen3_coder"),
    (["--arch", "qwen3", "--vocab", "bundled", "--format", "opencomposer", "--set", "vocab_size=1000"],
     "the tokenizer has 4096 ids but the model's vocab_size is 1000"),
    (["--arch", "qwen3", "--vocab", "bundled", "--format", "opencomposer", "--set", "hidden_sise=8"], "unknown key"),
    (["--arch", "qwen3", "--vocab", "bundled", "--format", "opencomposer", "--set", "num_experts=4",
      "--set", "num_experts_per_tok=2", "--set", "moe_intermediate_size=8"], "change --arch"),
])
def test_bad_input_stops_with_the_fix(args, message, tmp_path):
    r = model_new(*args, "--out", tmp_path / "x")
    assert r.exit_code == 1 and message in r.output, r.output
    assert not (tmp_path / "x").exists()  # nothing half-written


def test_a_checkpoint_whose_tokenizer_lacks_the_formats_tokens_stops_with_the_fix(tmp_path):
    from opencomposer.model.vocab import qwen3_tokenizer

    new_checkpoint(tmp_path, arch="qwen3", vocab="bundled", chat_format="opencomposer", overrides=["num_hidden_layers=1"])
    model = load_pretrained(tmp_path)
    qwen = qwen3_tokenizer()
    qwen.config["chat_format"] = "opencomposer"  # Qwen's vocabulary has no <|bos|>, <|system|>, ...
    with pytest.raises(CheckpointError, match=r"<\|bos\|>.*(opencomposer model new|with_structure_tokens)"):
        check_tokenizer(qwen, model.config.__class__(**{**model.config.to_dict(), "vocab_size": 151936}))
    with pytest.raises(CheckpointError, match="the tokenizer has 151669 ids but the model's vocab_size is 4096"):
        save_pretrained(model, tmp_path / "again", tokenizer=qwen)
    assert not (tmp_path / "again").exists()
    qwen.config["chat_format"] = "nonesuch"
    with pytest.raises((ConfigError, CheckpointError), match="nonesuch"):
        check_tokenizer(qwen, model.config.__class__(**{**model.config.to_dict(), "vocab_size": 151936}))
