"""Data parallelism around the single-device Transformer: FSDP2 sharding and DDP, in one place.

model.py stays single-device code (torchtitan's split: the model file, and its parallelisation
beside it). Pretraining (pretrain/train.py, under torchrun) and the Ray RL trainer
(rl/ray_runner.py) both wrap through here, so both shard the same units:

    fully_shard(block)    for every decoder block and every MTP module
    fully_shard(root)     last: what is left (embeddings, final norm, lm_head), where the root is
                          the model itself or a module around it (pretraining's loss module)

One unit per block means a rank holds one block's full parameters at a time during the forward
and backward. Both need an initialised torch.distributed process group. Left out: tensor,
expert and pipeline parallelism, activation checkpointing, mixed-precision policies.
"""

from __future__ import annotations

import torch
from torch import nn

from opencomposer.model.model import Transformer


def apply_fsdp(model: Transformer, root: nn.Module | None = None, mesh=None) -> nn.Module:
    """Shard `model` with FSDP2 in place: per block, per MTP module, then `root` (default: the
    model; it must contain the model). mesh: a 1-D DeviceMesh over the ranks (None: FSDP's
    default, every rank of the default process group). Returns the root."""
    from torch.distributed.fsdp import fully_shard

    root = model if root is None else root
    for block in [*model.layers, *model.mtp]:
        fully_shard(block, mesh=mesh)
    fully_shard(root, mesh=mesh)
    return root


def apply_ddp(module: nn.Module, device: torch.device, find_unused_parameters: bool = False) -> nn.Module:
    """DistributedDataParallel around `module` (gradients all-reduced; every rank holds all weights).
    find_unused_parameters: some parameters get no gradient on some steps (MTP modules before
    they are switched on), which DDP must be told to look for."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None,
               find_unused_parameters=find_unused_parameters)
