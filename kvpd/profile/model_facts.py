"""Model facts for sizing from a Hugging Face `config.json` (pure mapping + one reader)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvpd.errors import ProfileError

_DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32"}


def facts_from_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The `model:` fields a config.json determines (only those it actually has)."""
    try:
        return _facts(cfg)
    except (TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        raise ProfileError(
            f"model.config: the config.json has a value of an unexpected type ({e}). Write the "
            "facts (layers, kv_heads, head_dim, ...) into `model:` instead."
        ) from None


def _attention_facts(text: dict[str, Any], out: dict[str, Any]) -> None:
    """The KV shape: a latent (MLA/SFA) rank, or KV heads x head_dim (MHA/GQA)."""
    if text.get("kv_lora_rank"):
        out["kv_lora_rank"] = int(text["kv_lora_rank"])
        out["qk_rope_head_dim"] = int(text.get("qk_rope_head_dim", 64))
        out["attention"] = "sfa" if text.get("index_topk") else "mla"
    else:
        heads = text.get("num_attention_heads")
        kv_heads = text.get("num_key_value_heads", heads)
        if kv_heads:
            out["kv_heads"] = int(kv_heads)
            out["attention"] = "gqa" if heads and kv_heads != heads else "mha"
        head_dim = text.get("head_dim") or (
            text["hidden_size"] // heads if heads and text.get("hidden_size") else None
        )
        if head_dim:
            out["head_dim"] = int(head_dim)


def _facts(cfg: dict[str, Any]) -> dict[str, Any]:
    text = cfg.get("text_config") or cfg  # multimodal configs nest the language model
    if not isinstance(text, dict):
        raise TypeError("text_config is not a mapping")
    out: dict[str, Any] = {}
    if "num_hidden_layers" in text:
        out["layers"] = int(text["num_hidden_layers"])
    _attention_facts(text, out)
    heads = text.get("num_attention_heads")
    if heads:
        out["heads"] = int(heads)
    weights = cfg.get(WEIGHTS_KEY)
    if isinstance(weights, int) and weights > 0:
        out["weights_gb"] = round(weights / 2**30, 2)
    if text.get("index_topk"):
        out["index_topk"] = int(text["index_topk"])
    if text.get("compress_ratios"):
        out["compressed"] = True
    dtype = text.get("torch_dtype") or text.get("dtype") or cfg.get("torch_dtype")
    if dtype in _DTYPES:
        out["dtype"] = _DTYPES[dtype]
    return out


def read_config(path: str, base: Path | None = None) -> dict[str, Any]:
    p = Path(path).expanduser()
    if base is not None and not p.is_absolute():
        p = base / p
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileError(
            f"model.config: {p} does not exist on this machine. Point it at a local copy of the "
            "model's config.json, or write the facts (layers, kv_heads, ...) into `model:`."
        ) from None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ProfileError(
            f"model.config: {p} is not valid JSON ({e}). Point it at the model's config.json."
        ) from None
    except OSError as e:
        raise ProfileError(
            f"model.config: cannot read {p} ({e.strerror or e}). Check the path and permissions."
        ) from None
    if not isinstance(data, dict):
        raise ProfileError(
            f"model.config: {p} is not a config.json mapping. Point it at the model's config.json."
        )
    weights = weights_bytes(p.parent)
    return {**data, WEIGHTS_KEY: weights} if weights else data


# read_config adds the weights' size found next to config.json under this key
WEIGHTS_KEY = "_kvpd_weights_bytes"


def weights_bytes(model_dir: Path) -> int | None:
    """The weights' size in the model dir: model.safetensors.index.json's metadata.total_size,
    else the sum of the *.safetensors files (None when there are none)."""
    index = model_dir / "model.safetensors.index.json"
    try:
        meta = json.loads(index.read_text(encoding="utf-8")).get("metadata") or {}
        total = meta.get("total_size")
        if isinstance(total, int) and not isinstance(total, bool) and total > 0:
            return total
    except (OSError, ValueError, AttributeError, RecursionError):
        pass
    try:
        sizes = [f.stat().st_size for f in model_dir.glob("*.safetensors") if f.is_file()]
    except OSError:
        return None
    return sum(sizes) or None
