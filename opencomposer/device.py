"""Where a stage computes: the `device` field of the pretraining, SFT, RL, eval and pipeline configs.

    auto   CUDA when torch sees a GPU, else the CPU (the default: a GPU machine uses its GPU)
    cpu    the CPU even where a GPU is present
    cuda   the current CUDA device; a ConfigError where torch sees none

Each stage moves its model to the device once and its batches as they are built; the engine
and the trainer run on the device of the model they are given. On the CPU every move is a
no-op, so CPU results are the same bits with or without this field. Ray actors do not read
it: they compute on a GPU exactly when Ray gave them one (agentic.ray.*_gpus), see
rl/ray_runner.py. Left out: choosing one of several GPUs (set CUDA_VISIBLE_DEVICES), MPS/XPU.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from opencomposer.errors import ConfigError

if TYPE_CHECKING:
    import torch

DeviceName = Literal["auto", "cpu", "cuda"]
"""A config's `device` field (configs import this without importing torch)."""


def resolve_device(name: DeviceName, field: str = "device") -> "torch.device":
    """The torch.device `name` means on this machine; `field` names the config field in errors."""
    import torch

    if name == "cpu" or (name == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError(f"{field}: 'cuda', but torch sees no CUDA device (torch {torch.__version__}, "
                          f"CUDA build: {torch.version.cuda or 'none'}); use 'auto' or 'cpu'")
    return torch.device("cuda", torch.cuda.current_device())
