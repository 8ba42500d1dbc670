"""Where a stage computes: the `device` field of the pretraining, SFT, RL, eval and pipeline configs.

    auto   CUDA when torch sees a GPU, else the CPU (the default: a GPU machine uses its GPU)
    cpu    the CPU even where a GPU is present
    cuda   the current CUDA device; a ConfigError where torch sees none

Each stage moves its model to the device once and its batches as they are built; the engine
and the trainer run on the device of the model they are given. On the CPU every move is a
no-op, so CPU results are the same bits with or without this field. Ray actors do not read
it: they compute on a GPU exactly when Ray gave them one (agentic.ray.*_gpus), see
rl/ray_runner.py. Left out: choosing one of several GPUs (set CUDA_VISIBLE_DEVICES), MPS/XPU.

And how a training step computes there: the `dtype` field of pretraining, SFT and the RL trainer
(`autocast`), and the cast that custom kernels and autograd nodes need under it (`in_autocast_dtype`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from opencomposer.errors import ConfigError

if TYPE_CHECKING:
    import torch

DeviceName = Literal["auto", "cpu", "cuda"]
"""A config's `device` field (configs import this without importing torch)."""


ComputeDtype = Literal["float32", "bfloat16"]
"""A training config's `dtype` field (pretraining, SFT, the RL trainer)."""


def autocast(device: "torch.device", dtype: ComputeDtype):
    """The region of a training step's forward: bfloat16 autocast, or a disabled one for float32."""
    import torch

    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


def in_autocast_dtype(*tensors: "torch.Tensor") -> tuple["torch.Tensor", ...]:
    """The tensors in the autocast dtype of their device when autocast is on there, else as they are:
    for custom kernels and autograd nodes that take one dtype, which autocast does not cast for them."""
    import torch

    device = tensors[0].device.type
    if not torch.is_autocast_enabled(device):
        return tensors
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) for t in tensors)


def resolve_device(name: DeviceName, field: str = "device") -> "torch.device":
    """The torch.device `name` means on this machine; `field` names the config field in errors."""
    import torch

    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"{field}: 'cuda', but torch sees no CUDA device (torch {torch.__version__}, "
                          f"CUDA build: {torch.version.cuda or 'none'}); use 'auto' or 'cpu'")
    return torch.device("cuda", torch.cuda.current_device())
