"""ModelConfig: the size and shape of a Qwen3 decoder (MoE or dense) with DeepSeek-V3-style MTP modules.

Field names follow Hugging Face's `Qwen3MoeConfig` so that a checkpoint's config.json maps
onto this dataclass key for key. `num_experts: 0` is a dense model, Qwen3 (`Qwen3Config`,
`Qwen3ForCausalLM`: the same keys less the MoE ones, the same tensors less the routers and
experts); `arch` names which, and config.json is read and written in that architecture's layout. Two fields are ours: `shared_expert_intermediate_size`
(a Qwen2-MoE-style shared expert; Qwen3-MoE has none, so 0) and `num_mtp_modules` (D, the
number of multi-token-prediction depths). Both are written into config.json as extra keys
that transformers keeps as plain attributes and otherwise ignores.

Covered: validation with messages that name the field; conversion from and to HF config.json
dicts, in both the legacy layout the Hub uses (`rope_theta`, `rope_scaling`, `num_experts`)
and transformers 5's (`rope_parameters`, `num_local_experts`). Left out: sliding-window
attention and activations other than SiLU (a config asking for them is rejected), and RoPE
types other than the default and YaRN.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opencomposer.errors import ConfigError

# Keys a transformers config.json carries that do not change the forward pass of this model
# (training-only knobs, generation defaults, bookkeeping); reading them is not an error.
_HF_IGNORED_KEYS = {
    "architectures", "model_type", "transformers_version", "torch_dtype", "dtype", "use_cache",
    "output_router_logits", "router_aux_loss_coef", "attention_dropout", "bos_token_id",
    "eos_token_id", "pad_token_id", "max_window_layers", "sliding_window", "use_sliding_window",
    "hidden_act",
    # generic PretrainedConfig attributes, present in config.to_dict() of any transformers config
    "return_dict", "output_hidden_states", "output_attentions", "chunk_size_feed_forward",
    "is_encoder_decoder", "id2label", "label2id", "problem_type", "tokenizer_class",
}
ARCHS = {"qwen3_moe": "Qwen3MoeForCausalLM", "qwen3": "Qwen3ForCausalLM"}  # model_type -> architecture
# The keys only Qwen3-MoE has (a dense Qwen3 config.json has none of them).
_MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob",
             "decoder_sparse_step", "mlp_only_layers", "shared_expert_intermediate_size")
_YARN_KEYS = {"rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast",
              "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate"}


@dataclass
class ModelConfig:
    """Sizes of the decoder; one field per HF `Qwen3MoeConfig` key, plus our two extras."""

    vocab_size: int
    """Rows of the embedding and the output head (at least the tokenizer's vocabulary)."""
    hidden_size: int
    """D: width of the residual stream."""
    intermediate_size: int
    """Dense-MLP width (every layer of a dense model; layers listed in mlp_only_layers, MTP blocks)."""
    num_hidden_layers: int
    """Decoder layers."""
    num_attention_heads: int
    """Query heads per layer."""
    num_key_value_heads: int
    """Key/value heads; fewer than num_attention_heads is grouped-query attention."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 is a dense model (Qwen3)."""
    num_experts_per_tok: int = 0
    """K of the top-k routing (MoE only)."""
    moe_intermediate_size: int = 0
    """Width of one routed expert (MoE only)."""
    head_dim: int | None = None
    """Width of one attention head; None: hidden_size // num_attention_heads (as transformers)."""
    norm_topk_prob: bool = False
    """Renormalise the top-k routing probabilities to sum to 1."""
    decoder_sparse_step: int = 1
    """Layer i is MoE iff (i + 1) % step == 0 and i is not in mlp_only_layers."""
    mlp_only_layers: list[int] = field(default_factory=list)
    """Layers that use a dense MLP instead of experts."""
    rms_norm_eps: float = 1e-6
    """ε of every RMSNorm."""
    rope_theta: float = 10000.0
    """RoPE base frequency."""
    rope_scaling: dict[str, Any] | None = None
    """None, or a YaRN dict {"rope_type": "yarn", "factor": ...} (context extension)."""
    max_position_embeddings: int = 32768
    """Context length the RoPE frequencies are set for (YaRN's original length when rope_scaling is set)."""
    tie_word_embeddings: bool = False
    """Share the embedding matrix with the output head."""
    attention_bias: bool = False
    """Biases on the q/k/v/o projections."""
    initializer_range: float = 0.02
    """Std of the normal init of a model built from scratch."""
    shared_expert_intermediate_size: int = 0
    """Width of a Qwen2-MoE-style shared expert beside the routed ones; 0: none (Qwen3-MoE)."""
    num_mtp_modules: int = 0
    """D: DeepSeek-V3 multi-token-prediction depths (0: none)."""

    def __post_init__(self) -> None:
        if self.head_dim is None:
            self.head_dim = self.hidden_size // max(self.num_attention_heads, 1)
        self.mlp_only_layers = list(self.mlp_only_layers)
        for name in ("vocab_size", "hidden_size", "intermediate_size",
                     "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                     "decoder_sparse_step", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model config: {name} must be a positive integer, got {value!r}")
        for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
                     "shared_expert_intermediate_size", "num_mtp_modules"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"model config: {name} must be an integer >= 0, got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"model config: num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention")
        if self.head_dim % 2:
            raise ConfigError(f"model config: head_dim must be even for RoPE, got {self.head_dim}")
        if self.num_experts and not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(
                f"model config: num_experts_per_tok must be in 1..num_experts ({self.num_experts}), "
                f"got {self.num_experts_per_tok}")
        if not self.num_experts and self.shared_expert_intermediate_size:
            raise ConfigError("model config: shared_expert_intermediate_size needs routed experts (num_experts > 0); "
                              "a dense model's MLP width is intermediate_size")
        if self.num_experts and self.moe_intermediate_size < 1:
            raise ConfigError("model config: moe_intermediate_size must be a positive integer for an MoE model "
                              f"(num_experts={self.num_experts}), got {self.moe_intermediate_size!r}")
        bad = [i for i in self.mlp_only_layers if not 0 <= i < self.num_hidden_layers]
        if bad:
            raise ConfigError(f"model config: mlp_only_layers {bad} are outside 0..{self.num_hidden_layers - 1}")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0 or not self.initializer_range > 0:
            raise ConfigError("model config: rms_norm_eps, rope_theta and initializer_range must be > 0")
        self.rope_scaling = _check_rope_scaling(self.rope_scaling, self.max_position_embeddings)

    # ---- derived sizes ------------------------------------------------------------------

    @property
    def arch(self) -> str:
        """"qwen3_moe" (routed experts), or "qwen3" (dense: num_experts 0): the config.json model_type."""
        return "qwen3_moe" if self.num_experts else "qwen3"

    def is_moe_layer(self, layer_id: int) -> bool:
        """The rule transformers' Qwen3MoeDecoderLayer uses to pick a sparse or dense MLP."""
        return (layer_id not in self.mlp_only_layers and self.num_experts > 0
                and (layer_id + 1) % self.decoder_sparse_step == 0)

    @property
    def moe_layers(self) -> list[int]:
        """Main-stack layer ids with a routed MoE block; routed_experts[..., j, :] is moe_layers[j]."""
        return [i for i in range(self.num_hidden_layers) if self.is_moe_layer(i)]

    @property
    def num_cache_layers(self) -> int:
        """Attention layers that keep a KV cache: the main stack, then one per MTP module."""
        return self.num_hidden_layers + self.num_mtp_modules

    # ---- dicts: our own YAML/JSON, and HF config.json -------------------------------------

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Build from a dict with exactly our field names; unknown or missing keys are errors."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ConfigError(f"model config: unknown key(s) {unknown}; valid keys: {sorted(names)}")
        required = {f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        missing = sorted(required - set(d))
        if missing:
            raise ConfigError(f"model config: missing required key(s) {missing}")
        return cls(**d)

    @classmethod
    def from_yaml(cls, path: str | Path) -> "ModelConfig":
        import yaml

        with open(path) as f:
            d = yaml.safe_load(f)
        if not isinstance(d, dict):
            raise ConfigError(f"{path}: expected a mapping of model config keys")
        return cls.from_dict(d)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> "ModelConfig":
        """Read a transformers Qwen3-MoE or Qwen3 config.json dict (Hub layout or transformers 5 layout)."""
        d = dict(d)
        model_type = d.get("model_type", "qwen3_moe")
        if model_type not in ARCHS:
            raise ConfigError(f"config.json: model_type is {model_type!r}; supported: {', '.join(ARCHS)} "
                              f"(Qwen3MoeForCausalLM, Qwen3ForCausalLM): convert the checkpoint to one of them")
        layer_types = d.pop("layer_types", None)  # transformers 5 writes one per layer
        if layer_types is not None and set(layer_types) - {"full_attention"}:
            raise ConfigError(f"config.json: layer_types {sorted(set(layer_types))} are not supported "
                              f"(only full_attention: no sliding-window layers)")
        if d.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"config.json: hidden_act {d['hidden_act']!r} is not supported (only 'silu')")
        if d.get("use_sliding_window"):
            raise ConfigError("config.json: use_sliding_window=true is not supported by this model")
        if "num_local_experts" in d:  # transformers 5 writes the attribute_map alias
            d.setdefault("num_experts", d.pop("num_local_experts"))
        if "rope_parameters" in d:  # transformers 5: theta and scaling in one dict
            rope = dict(d.pop("rope_parameters") or {})
            if "rope_theta" in rope:
                d["rope_theta"] = rope.pop("rope_theta")
            kind = rope.get("rope_type", rope.get("type", "default"))
            d["rope_scaling"] = None if kind == "default" else rope
        known = {f.name for f in dataclasses.fields(cls)}
        if model_type == "qwen3":
            known -= set(_MOE_KEYS)
        unknown = sorted(k for k in d if k not in known and k not in _HF_IGNORED_KEYS
                         and not k.startswith("_"))
        if unknown:
            raise ConfigError(
                f"config.json: unknown key(s) {unknown}; this model reads the {model_type} keys {sorted(known)}")
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "max_position_embeddings")
        if model_type == "qwen3_moe":
            required += ("moe_intermediate_size", "num_experts", "num_experts_per_tok")
        missing = [k for k in required if k not in d]
        if missing:
            raise ConfigError(f"config.json: missing required key(s) {missing}")
        if model_type == "qwen3_moe" and not d["num_experts"]:
            raise ConfigError("config.json: a qwen3_moe model with num_experts 0 is dense: write it as "
                              "model_type qwen3 (Qwen3ForCausalLM)")
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_hf_dict(self) -> dict[str, Any]:
        """config.json for transformers' Qwen3MoeForCausalLM, or Qwen3ForCausalLM for a dense model
        (the Hub layout, read by 4.51+ and 5.x). A dense model's config has no MoE keys."""
        d = self.to_dict()
        if self.arch == "qwen3":
            for key in _MOE_KEYS:
                del d[key]
        d.update(architectures=[ARCHS[self.arch]], model_type=self.arch, hidden_act="silu",
                 use_sliding_window=False, attention_dropout=0.0)
        return d


def _check_rope_scaling(rs: dict[str, Any] | None, max_position_embeddings: int) -> dict[str, Any] | None:
    """Validate a YaRN dict and fill what transformers fills (rope_type, original length)."""
    if rs is None:
        return None
    if not isinstance(rs, dict):
        raise ConfigError(f"model config: rope_scaling must be null or a dict, got {rs!r}")
    rs = dict(rs)
    kind = rs.pop("type", None) or rs.get("rope_type", "default")
    if kind == "default":
        return None
    if kind != "yarn":
        raise ConfigError(f"model config: rope_scaling type {kind!r} is not supported (only 'yarn')")
    rs["rope_type"] = "yarn"
    unknown = sorted(set(rs) - _YARN_KEYS)
    if unknown:
        raise ConfigError(f"model config: unknown rope_scaling key(s) {unknown}; valid: {sorted(_YARN_KEYS)}")
    rs.setdefault("original_max_position_embeddings", max_position_embeddings)
    if rs.get("factor") is None:  # transformers derives it from the two lengths
        rs["factor"] = max_position_embeddings / rs["original_max_position_embeddings"]
    if not (isinstance(rs["factor"], (int, float)) and math.isfinite(rs["factor"]) and rs["factor"] >= 1):
        raise ConfigError(f"model config: rope_scaling.factor must be a number >= 1, got {rs['factor']!r}")
    return rs
