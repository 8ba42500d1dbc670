"""The model: a Qwen3-MoE-compatible decoder with MTP modules, router replay and HF checkpoint I/O."""

from opencomposer.model.config import ModelConfig
from opencomposer.model.hf import load_pretrained, save_pretrained
from opencomposer.model.model import KVCache, ModelOutput, Transformer

__all__ = ["ModelConfig", "Transformer", "KVCache", "ModelOutput", "load_pretrained", "save_pretrained"]
