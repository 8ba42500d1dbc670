"""Inference: the engine seam's plain data (types.py), the embedded engine (engine.py, with
speculative.py, sampling.py and kernels.py), the HTTP server and the PolicyClient.

`Engine` is imported lazily, so that clients of a remote engine do not import torch.
"""

from opencomposer.engine.types import GenerationRequest, GenerationResult, InferenceEngine, SamplingParams

__all__ = ["Engine", "GenerationRequest", "GenerationResult", "InferenceEngine", "SamplingParams"]


def __getattr__(name: str):
    if name == "Engine":
        from opencomposer.engine.engine import Engine

        return Engine
    raise AttributeError(f"module 'opencomposer.engine' has no attribute {name!r}")
