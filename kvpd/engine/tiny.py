"""Build a random-weight Llama model with a locally trained tokenizer, offline and deterministic.

Runs with the ENGINE venv's python (it needs torch, transformers and tokenizers):
`python -m kvpd.engine.tiny DIR --seed 0`. `kvpd model tiny` wraps it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Before transformers is imported: nothing here may touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

RECIPE_FILE = "kvpd-model.json"
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Enough text for a few hundred merges; repeated so frequent pairs clearly win the merge order.
CORPUS = [
    "The prefill node computes the key value cache and the decode node reuses it.",
    "A quick brown fox jumps over the lazy dog while the cluster serves requests.",
    "Disaggregated serving splits prompt processing from token generation.",
    "Hello world! How are you today? I am fine, thank you, and you?",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols: {}[]()<>=+-*/_.,;:'\"#@!?",
    "Tokens flow from the proxy to the engine, blocks move from host to device.",
]
CORPUS_REPEAT = 50


@dataclass(frozen=True)
class TinySpec:
    """Everything that determines the output bytes (with the library versions)."""

    seed: int = 0
    vocab_size: int = 1024  # BPE training target; the model gets the tokenizer's actual size
    hidden_size: int = 128
    intermediate_size: int = 0  # 0: twice hidden_size
    layers: int = 2
    head_dim: int = 32  # the smallest head size the CPU attention backend accepts
    max_len: int = 2048

    def resolved(self) -> TinySpec:
        inter = self.intermediate_size or 2 * self.hidden_size
        return TinySpec(**{**asdict(self), "intermediate_size": inter})

    @property
    def heads(self) -> int:
        return self.hidden_size // self.head_dim

    def check(self) -> None:
        if self.hidden_size % self.head_dim:
            raise ValueError(f"hidden size {self.hidden_size} is not a multiple of {self.head_dim}")
        if self.heads % 2:
            raise ValueError(f"hidden size / head dim = {self.heads} heads must be even (GQA 2:1)")
        if not 32 <= self.head_dim <= 512:
            raise ValueError("head dim must lie in 32..512 (vLLM CPU attention)")
        if self.vocab_size < 512:
            raise ValueError("vocab size must be at least 512 (256 bytes + merges + specials)")


def build_tokenizer(spec: TinySpec) -> Any:  # a transformers PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * CORPUS_REPEAT, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|bos|>",
        eos_token="<|eos|>",
        pad_token="<|pad|>",
        model_max_length=spec.max_len,
        chat_template=CHAT_TEMPLATE,
    )


def build_model(spec: TinySpec, tokenizer: Any) -> Any:  # a transformers LlamaForCausalLM
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Writing model shards" on stderr

    cfg = LlamaConfig(
        # The tokenizer's real size (fewer than the training target on this small corpus): ids
        # beyond it decode to nothing, and a random model tends to emit exactly those.
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads // 2,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_len,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(cfg)
    return model.to(torch.bfloat16).eval()


def build(out: Path, spec: TinySpec, *, force: bool = False) -> bool:
    """Write the model to `out`; False when `out` already holds exactly this build."""
    spec = spec.resolved()
    spec.check()
    recipe = {"kind": "tiny-llama", "spec": asdict(spec), "versions": _versions()}
    marker = out / RECIPE_FILE
    if not force and marker.is_file() and json.loads(marker.read_text()) == recipe:
        return False

    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and swap in, so an interrupted build never leaves a half model.
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tokenizer = build_tokenizer(spec)
        model = build_model(spec, tokenizer)
        tokenizer.save_pretrained(tmp)
        model.save_pretrained(tmp)
        (tmp / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
        # mkdtemp and safetensors create private files; engines may run as another user.
        tmp.chmod(0o755)
        for f in tmp.iterdir():
            f.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True


def _versions() -> dict[str, str]:
    import tokenizers
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvpd.engine.tiny", description=__doc__)
    p.add_argument("dir", type=Path)
    d = TinySpec()
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--vocab-size", type=int, default=d.vocab_size)
    p.add_argument("--hidden-size", type=int, default=d.hidden_size)
    p.add_argument("--intermediate-size", type=int, default=d.intermediate_size)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--head-dim", type=int, default=d.head_dim)
    p.add_argument("--max-len", type=int, default=d.max_len)
    p.add_argument("--force", action="store_true", help="rebuild even if DIR matches")
    a = p.parse_args(argv)
    spec = TinySpec(
        seed=a.seed,
        vocab_size=a.vocab_size,
        hidden_size=a.hidden_size,
        intermediate_size=a.intermediate_size,
        layers=a.layers,
        head_dim=a.head_dim,
        max_len=a.max_len,
    )
    t0 = time.monotonic()
    # Importing torch creates /tmp/torchinductor_<user>; keep that out of the shared /tmp.
    with tempfile.TemporaryDirectory(prefix="kvpd-tiny-") as scratch:
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", scratch)
        try:
            built = build(a.dir, spec, force=a.force)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    size = sum(f.stat().st_size for f in a.dir.iterdir() if f.is_file())
    verb = "built" if built else "up to date:"
    print(f"{verb} {a.dir} ({size / 1e6:.1f} MB) in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
