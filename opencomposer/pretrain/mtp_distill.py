"""Self-distillation of the MTP modules onto a frozen trunk: make the model's own draft heads
agree with it, for MTP speculative decoding (engine/speculative.py).

The demo's MTP module is trained only briefly during pretraining and not at all in SFT, so
after SFT it drafts for a model that no longer exists (greedy acceptance ~0.1). This tool
trains the MTP modules alone, the trunk frozen (embeddings, blocks, final norm and lm_head,
which the MTP modules share, get no gradient), on token sequences such as rendered agent
trajectories, with mtp.py's "distill" objective (Composer 2 report §3):

    L = (1/D) sum_{k=1..D} mean_i KL( p_main(. | x_<=i+k) || p_k(. | h_i^{k-1}, x_{i+1..i+k}) )

over the positions the policy generates (`masks`: the SFT loss mask, 1 on assistant tokens),
p_main being the trunk's own next-token distribution at position i+k: the MTP heads learn to
predict what the model will say, not what the data says, which is what acceptance measures.
Depth k's chain reads the previous depth's hidden exactly as drafting does (mtp_logits), so
errors compound in training as they do when drafting.

`num_modules` can exceed the checkpoint's: new depths start as copies of the deepest trained
module (it already maps (hidden, token) to the next hidden; noise would start from nothing)
and config.num_mtp_modules grows with them. `mtp_agreement` reports, per depth, the fraction of
positions whose depth-k argmax equals the main head's argmax for the same token, given the
true tokens before it: the greedy acceptance rate of depth k when the drafts before it were
accepted (the chained rate a_1 a_2 ... a_k is what speculation sees).

Covered: batches of random windows of the sequences (right-padded, pads masked), AdamW on
the MTP parameters with warmup and cosine decay, a held-out split for the agreement report.
Left out: generating the training sequences with the model itself (sampling them from the
engine would match the acceptance setting even better; rendered trajectories are what the
pipeline has), and distributed training.

    python -m opencomposer.pretrain.mtp_distill --model DIR --data trajectories.jsonl --out DIR [--modules D]
        [--steps N] [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import random
import time
from pathlib import Path
from typing import Callable, Sequence

import torch

from opencomposer.model.model import MTPModule, Transformer
from opencomposer.model.mtp import mtp_loss


def add_mtp_modules(model: Transformer, num_modules: int) -> None:
    """Grow the model to num_modules MTP depths: each new one a copy of the deepest existing
    module (or freshly initialised when there is none)."""
    while len(model.mtp) < num_modules:
        if len(model.mtp):
            module = copy.deepcopy(model.mtp[-1])
        else:
            module = MTPModule(model.config)
            module.apply(model._init_weights)
        model.mtp.append(module.to(next(model.parameters()).dtype))
    model.config.num_mtp_modules = len(model.mtp)


def _batch(sequences, masks, idx: list[int], seq_len: int, rng: random.Random, pad_id: int):
    """Random windows of seq_len tokens of the chosen sequences: ids [B, L], mask [B, L]."""
    ids_BL = torch.full((len(idx), seq_len), pad_id, dtype=torch.long)
    mask_BL = torch.zeros(len(idx), seq_len)
    for b, j in enumerate(idx):
        seq, m = sequences[j], masks[j]
        start = rng.randrange(0, max(1, len(seq) - seq_len + 1))
        window = seq[start:start + seq_len]
        ids_BL[b, :len(window)] = torch.tensor(window)
        mask_BL[b, :len(window)] = torch.tensor(m[start:start + len(window)], dtype=torch.float32)
    return ids_BL, mask_BL


@torch.no_grad()
def mtp_agreement(model: Transformer, sequences: Sequence[Sequence[int]], masks: Sequence[Sequence[int]] | None = None,
                  seq_len: int = 512) -> list[float]:
    """Per depth k: the fraction of (masked) positions i where depth k's argmax at i equals the
    main head's argmax at i+k (both predicting token i+k+1), teacher-forced on the sequences."""
    masks = masks or [[1] * len(s) for s in sequences]
    hits = [0.0] * len(model.mtp)
    total = [0.0] * len(model.mtp)
    for seq, m in zip(sequences, masks):
        for s0 in range(0, max(1, len(seq) - 1), seq_len):
            ids_1L = torch.tensor([seq[s0:s0 + seq_len]])
            mask_L = torch.tensor(m[s0:s0 + seq_len], dtype=torch.float32)
            out = model(ids_1L)
            main_L = out.logits[0].argmax(-1)
            for k, logits in enumerate(model.mtp_logits(ids_1L, out.hidden), start=1):
                n = logits.shape[1]  # positions i = 0..n-1 predict token i+k+1, as main at i+k
                if n <= 0:
                    continue
                w = mask_L[k + 1:k + 1 + n]
                hits[k - 1] += float(((logits[0].argmax(-1) == main_L[k:k + n]).float() * w).sum())
                total[k - 1] += float(w.sum())
    return [h / max(t, 1.0) for h, t in zip(hits, total)]


def distill_mtp(model: Transformer, sequences: Sequence[Sequence[int]], *, masks: Sequence[Sequence[int]] | None = None,
                num_modules: int | None = None, steps: int = 300, batch_size: int = 8, seq_len: int = 512,
                lr: float = 2e-3, warmup: int = 20, heldout: float = 0.1, pad_id: int = 0, seed: int = 0,
                log: Callable[[str], None] | None = print) -> dict:
    """Train model.mtp in place by self-distillation onto the frozen trunk (module docstring).

    sequences: token-id lists; masks: 1 where a position counts as a target (default all).
    Returns {"agreement_before", "agreement_after"} per depth on the held-out sequences, the
    final training loss and the wall time.
    """
    masks = list(masks) if masks is not None else [[1] * len(s) for s in sequences]
    rng = random.Random(seed)
    order = list(range(len(sequences)))
    rng.shuffle(order)
    n_held = max(1, int(len(order) * heldout)) if len(order) > 1 else 0
    held, train = order[:n_held], order[n_held:] or order
    if num_modules:
        add_mtp_modules(model, num_modules)
    if not len(model.mtp):
        raise ValueError("the model has no MTP modules: pass num_modules >= 1")
    held_seqs, held_masks = [sequences[j] for j in held], [masks[j] for j in held]
    was_training = model.training
    model.eval()
    before = mtp_agreement(model, held_seqs, held_masks, seq_len)
    params = list(model.mtp.parameters())
    for p in model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    t0, loss = time.perf_counter(), float("nan")
    for step in range(steps):
        scale = (step + 1) / warmup if step < warmup else 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        ids_BL, mask_BL = _batch(sequences, masks, [rng.choice(train) for _ in range(batch_size)], seq_len, rng, pad_id)
        with torch.no_grad():
            out = model(ids_BL)  # the trunk: frozen, no graph
        total, per_depth = mtp_loss(model.mtp_logits(ids_BL, out.hidden), ids_BL, mode="distill",
                                    main_logits=out.logits, loss_mask=mask_BL)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        loss = total.item()
        if log and (step % 50 == 0 or step == steps - 1):
            log(f"mtp distill step {step}/{steps}: loss {loss:.4f} per depth "
                f"{[round(x.item(), 3) for x in per_depth]} ({time.perf_counter() - t0:.0f} s)")
    for p in model.parameters():
        p.requires_grad_(True)
    after = mtp_agreement(model, held_seqs, held_masks, seq_len)
    model.train(was_training)
    if log:
        log(f"mtp agreement per depth (held-out): before {[round(a, 3) for a in before]}, "
            f"after {[round(a, 3) for a in after]}")
    return {"agreement_before": before, "agreement_after": after, "loss": loss, "wall_s": time.perf_counter() - t0,
            "num_modules": len(model.mtp), "train_sequences": len(train), "heldout_sequences": len(held)}


def trajectory_sequences(path: str | Path, tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    """(ids, SFT loss masks) of every segment of a trajectories JSONL, rendered as SFT and RL
    see them (pretrain.sft.render)."""
    from opencomposer.harness.trajectory import read_jsonl
    from opencomposer.pretrain.sft import render

    seqs, masks = [], []
    for traj in read_jsonl(path):
        for ids, mask in render(traj, tokenizer):
            seqs.append(ids)
            masks.append(mask)
    return seqs, masks


def main(argv: Sequence[str] | None = None) -> None:
    from opencomposer.model import load_pretrained, save_pretrained
    from opencomposer.model.tokenizer import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True, help="HF-format checkpoint directory (with tokenizer.json)")
    ap.add_argument("--data", required=True, nargs="+", help="trajectories JSONL file(s)")
    ap.add_argument("--tokenizer", help="tokenizer directory or tokenizer.json (default: the model's directory)")
    ap.add_argument("--out", required=True, help="where to write the model with its distilled MTP modules")
    ap.add_argument("--modules", type=int, default=None, help="MTP depths D (default: the checkpoint's)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--all-positions", action="store_true", help="distill on every position, not only assistant tokens")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tok = load_tokenizer(args.tokenizer or args.model)
    seqs, masks = [], []
    for path in args.data:
        s, m = trajectory_sequences(path, tok)
        seqs += s
        masks += m
    model = load_pretrained(args.model, dtype=torch.float32)
    report = distill_mtp(model, seqs, masks=None if args.all_positions else masks, num_modules=args.modules,
                         steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                         pad_id=tok.pad_id or 0)
    out = Path(args.out)
    save_pretrained(model, out, tokenizer=tok)  # with its chat template and generation config
    (out / "mtp_distill.json").write_text(json.dumps({**report, "source": str(args.model), "data": args.data,
                                                      "steps": args.steps, "lr": args.lr}, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
