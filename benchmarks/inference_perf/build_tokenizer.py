"""Build a small local tokenizer for inference-perf, offline: ``python build_tokenizer.py DIR``.

Runs in the inference-perf environment (Python >= 3.12, with ``tokenizers`` and ``transformers``).
inference-perf always loads a Hugging Face tokenizer (``AutoTokenizer.from_pretrained``) to build
prompts and count tokens; given a model name it would download one from the Hub. A local directory
needs no network: this trains a 2000-token byte-level BPE on the Shakespeare text that inference-perf
ships (a few seconds) and saves ``tokenizer.json`` + ``tokenizer_config.json`` into DIR.
"""

from __future__ import annotations

import importlib.resources
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

VOCAB_SIZE = 2000
END = "<|endoftext|>"


def build(directory: Path) -> None:
    corpus = (importlib.resources.files("inference_perf") / "assets" / "shakespeare.txt").read_text("utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[END],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([corpus], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token=END, bos_token=END, unk_token=END, model_max_length=32768
    )
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    build(Path(sys.argv[1]))
