"""The toy arithmetic task for TokUR's repro: 2-digit addition in GSM8K format and a small character-level
GPT-2 trained on it briefly, so that it is right often but not always."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

CHARS = list("0123456789+=")
PROMPT_TEMPLATE = "{question}="


def addition_items(n: int, seed: int, low: int = 10, high: int = 99) -> list[dict]:
    """{"question": "23+45", "answer": "23+45=68\\n#### 68"} records."""
    rng = np.random.default_rng(seed)
    items = []
    for a, b in rng.integers(low, high + 1, size=(n, 2)):
        items.append({"question": f"{a}+{b}", "answer": f"{a}+{b}={a + b}\n#### {a + b}"})
    return items


def char_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>", unk_token="<eos>")


def train_adder(out: Path, steps: int, seed: int = 0, batch: int = 64, low: int = 10, high: int = 99,
                init: Path | None = None, log=print) -> Path:
    """Train a 2-block GPT-2 on "a+b=c<eos>" (a, b in [low, high]) for `steps` AdamW steps (continuing from
    `init` when given); loss on the answer and its EOS only."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    tokenizer = char_tokenizer()
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=16, n_embd=64, n_layer=2, n_head=4, bos_token_id=0,
                        eos_token_id=0, pad_token_id=0)
    model = GPT2LMHeadModel.from_pretrained(init) if init else GPT2LMHeadModel(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed + 1)
    for step in range(steps):
        pairs = rng.integers(low, high + 1, size=(batch, 2))
        texts = [f"{a}+{b}={a + b}" for a, b in pairs]
        ids = tokenizer(texts, padding="longest", return_tensors="pt")["input_ids"]
        ids = torch.cat([ids, torch.zeros(batch, 1, dtype=torch.long)], 1)  # EOS after the longest answer
        labels = ids.clone()
        for row, text in enumerate(texts):
            labels[row, :text.index("=") + 1] = -100  # the question is given
            labels[row, len(text) + 1:] = -100  # score one EOS, not the padding after it
        loss = model(ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 200 == 0 or step == steps - 1:
            log(f"step {step} loss {loss.item():.3f}")
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
