"""Hugging Face checkpoint I/O: config.json + sharded safetensors, as transformers' Qwen3-MoE and Qwen3.

On disk, tensor names are those of Qwen3-MoE and Qwen3 (dense) checkpoints on the Hub and of what
transformers 5 `save_pretrained` writes (a dense model has the same names less the routers and
experts; config.json says which architecture, model/config.py): `model.` + our module path, with routed experts
stored one tensor per expert and projection (`model.layers.N.mlp.experts.E.gate_proj.weight`,
`up_proj`, `down_proj`). In memory both transformers 5 and this model stack them
(gate_up_proj [E, 2F, D] = per expert cat(gate, up); down_proj [E, D, F]); reading also
accepts checkpoints that store the stacked form. MTP modules are saved as extra tensors
under `mtp.` that transformers reports as unexpected and ignores; with tied embeddings,
lm_head.weight is not written (transformers re-ties it).

Covered: sharding with model.safetensors.index.json, a single model.safetensors on read,
dtype conversion, and errors naming the tensor or key at fault. With `tokenizer=`, the
tokenizer files, chat template, generation config and tool-parser name (export.py) are
written beside the weights. Left out: other architectures' weight names, quantized checkpoints.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from opencomposer.errors import CheckpointError, ConfigError
from opencomposer.model.config import ModelConfig
from opencomposer.model.export import check_tokenizer, write_tokenizer_files
from opencomposer.model.model import Transformer
from opencomposer.model.tokenizer import Tokenizer

INDEX = "model.safetensors.index.json"
_EXPERTS = re.compile(r"layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _hf_name(name: str) -> str:
    return name if name.startswith(("lm_head.", "mtp.")) else "model." + name


def to_hf_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """Our state dict under on-disk HF names, experts split per expert (views, not copies)."""
    out = {}
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        m = _EXPERTS.fullmatch(name)
        if m is None:
            out[_hf_name(name)] = t
            continue
        prefix = f"model.layers.{m[1]}.mlp.experts"
        for e in range(t.shape[0]):
            if m[2] == "down_proj":
                out[f"{prefix}.{e}.down_proj.weight"] = t[e]
            else:
                gate, up = t[e].chunk(2, dim=0)
                out[f"{prefix}.{e}.gate_proj.weight"] = gate
                out[f"{prefix}.{e}.up_proj.weight"] = up
    return out


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B)\s*", size.upper())
    if m is None:
        raise ConfigError(f"max_shard_size {size!r}: expected bytes as an int or a string like '500MB', '5GB'")
    return int(float(m[1]) * {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9}[m[2]])


def save_pretrained(model: Transformer, path: str | Path, max_shard_size: int | str = "5GB", *,
                    tokenizer: Tokenizer | None = None) -> None:
    """Write config.json, model-0000i-of-0000n.safetensors shards and model.safetensors.index.json,
    and with `tokenizer` what serving needs beside them (export.py: tokenizer files with the chat
    template, generation_config.json, opencomposer.json; checked against the model's vocab_size).

    Previous model*.safetensors files in `path` are removed first, so a directory saved to
    twice never mixes shards of two saves.
    """
    path = Path(path)
    if tokenizer is not None:  # before any file is written
        check_tokenizer(tokenizer, model.config, path)
    path.mkdir(parents=True, exist_ok=True)
    limit = _parse_size(max_shard_size)
    tensors = to_hf_tensors(model)
    shards: list[list[str]] = [[]]
    used = 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if shards[-1] and used + nbytes > limit:
            shards.append([])
            used = 0
        shards[-1].append(name)
        used += nbytes
    for old in list(path.glob("model*.safetensors")) + [path / INDEX]:
        old.unlink(missing_ok=True)
    weight_map, total = {}, 0
    for i, names in enumerate(shards, start=1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        # clone: per-expert slices are views of one stacked tensor, which safetensors refuses.
        shard = {n: tensors[n].detach().to("cpu").contiguous().clone() for n in names}
        save_file(shard, str(path / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(names, fname))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    (path / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map},
                                         indent=2, sort_keys=True) + "\n")
    hf = model.config.to_hf_dict()
    hf["dtype"] = str(next(model.parameters()).dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    if tokenizer is not None:
        write_tokenizer_files(tokenizer, path)


def load_config(path: str | Path) -> tuple[ModelConfig, dict]:
    """ModelConfig and the raw dict of a checkpoint directory's config.json."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path} is not a directory; expected an HF checkpoint directory with config.json")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{path} has no config.json: not an HF checkpoint directory")
    try:
        raw = json.loads(cfg_file.read_text())
        return ModelConfig.from_hf_dict(raw), raw
    except (ConfigError, json.JSONDecodeError, TypeError) as e:
        raise CheckpointError(f"{cfg_file}: {e}") from e


def _open_shards(path: Path) -> dict[str, object]:
    """Tensor name -> open safetensors handle, from the index or a single model.safetensors."""
    if (path / INDEX).is_file():
        weight_map = json.loads((path / INDEX).read_text())["weight_map"]
        files = sorted(set(weight_map.values()))
    elif (path / "model.safetensors").is_file():
        files, weight_map = ["model.safetensors"], None
    else:
        raise CheckpointError(f"{path} has neither {INDEX} nor model.safetensors")
    handles = {}
    for fname in files:
        if not (path / fname).is_file():
            raise CheckpointError(f"{path / INDEX} names shard {fname}, which does not exist")
        f = safe_open(str(path / fname), framework="pt")
        for key in f.keys():
            if weight_map is None or weight_map.get(key) == fname:
                handles[key] = f
    return handles


def load_pretrained(path: str | Path, dtype: torch.dtype | None = None,
                    device: torch.device | str = "cpu") -> Transformer:
    """Load an HF Qwen3-MoE checkpoint (ours or transformers') into a Transformer in eval mode.

    dtype None keeps the checkpoint's dtype from config.json (`dtype`/`torch_dtype`; float32 if
    absent). Every tensor the config implies must be present with its shape, and no other
    tensor may be (except lm_head.weight when embeddings are tied); otherwise CheckpointError.
    """
    path = Path(path)
    config, raw = load_config(path)
    if dtype is None:
        dtype = _DTYPES.get(raw.get("dtype") or raw.get("torch_dtype"), torch.float32)
    handles = _open_shards(path)
    consumed: set[str] = set()

    def get(key: str, shape: torch.Size) -> torch.Tensor:
        if key not in handles:
            raise CheckpointError(f"{path}: tensor {key!r} is missing (config.json implies it)")
        got = tuple(handles[key].get_slice(key).get_shape())
        if got != tuple(shape):
            raise CheckpointError(f"{path}: tensor {key!r} has shape {list(got)}, config.json implies {list(shape)}")
        consumed.add(key)
        return handles[key].get_tensor(key).to(dtype)

    with torch.device("meta"):
        model = Transformer(config)
    state = {}
    for name, meta in model.state_dict().items():
        m = _EXPERTS.fullmatch(name)
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        if m is None:
            state[name] = get(_hf_name(name), meta.shape)
        elif f"model.{name}" in handles:  # already stacked on disk
            state[name] = get(f"model.{name}", meta.shape)
        elif m[2] == "down_proj":
            prefix = f"model.layers.{m[1]}.mlp.experts"
            state[name] = torch.stack([get(f"{prefix}.{e}.down_proj.weight", meta.shape[1:])
                                       for e in range(meta.shape[0])])
        else:
            prefix, half = f"model.layers.{m[1]}.mlp.experts", (meta.shape[1] // 2, meta.shape[2])
            state[name] = torch.stack([torch.cat([get(f"{prefix}.{e}.gate_proj.weight", half),
                                                  get(f"{prefix}.{e}.up_proj.weight", half)])
                                       for e in range(meta.shape[0])])
    unexpected = sorted(set(handles) - consumed - ({"lm_head.weight"} if config.tie_word_embeddings else set()))
    if unexpected:
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise CheckpointError(f"{path}: unexpected tensor(s) {unexpected[:5]}{more} not implied by config.json")
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed_tokens.weight
    return model.to(device).eval()
