"""Tiny inputs for equivalence.sh, written once and read by both trees' runs (so the inputs cannot differ).

    python make_inputs.py DIR

DIR/text.txt          40 kB of Python's own documentation (pydoc topics: in every CPython, no download)
DIR/gpt2, DIR/llama   untrained 2-block models, width 32 (the shapes of tests/conftest.py's tiny_gpt2/llama_dir),
                      with a byte-level BPE of 300 ids trained here on the same text
DIR/llama-ft1, -ft2   the Llama plus small seeded perturbations (stand-ins for fine-tunes, for merge)
DIR/facts.jsonl       3 facts (edit), DIR/forget.json + DIR/retain.jsonl (unlearn), DIR/pairs.jsonl (steer)

Needs only torch, transformers and tokenizers: no iclrkit code, so neither tree makes the inputs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def tokenizer(text: str):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    s = "<|endoftext|>"
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=s, eos_token=s, unk_token=s, pad_token=s,
                                   model_max_length=1024)


def main(root: Path) -> None:
    from pydoc_data.topics import topics

    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    root.mkdir(parents=True, exist_ok=True)
    full = "\n\n".join(topics[k] for k in sorted(topics))
    text = full[:40_000]
    (root / "text.txt").write_text(text)
    tok = tokenizer(full[:200_000])

    def save(model, name):
        model.eval().save_pretrained(root / name)
        tok.save_pretrained(root / name)
        return model

    torch.manual_seed(0)
    save(GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=128, n_embd=32, n_layer=2, n_head=4,
                                    bos_token_id=0, eos_token_id=0)), "gpt2")
    torch.manual_seed(0)
    llama = save(LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=128, bos_token_id=0, eos_token_id=0)),
                 "llama")
    base = {k: v.clone() for k, v in llama.state_dict().items()}
    for seed in (1, 2):
        gen = torch.Generator().manual_seed(seed)
        llama.load_state_dict({k: v + 0.02 * torch.randn(v.shape, generator=gen) for k, v in base.items()})
        save(llama, f"llama-ft{seed}")

    facts = [{"prompt": "The value of {} is", "subject": "object", "target_new": "return", "target_true": "class",
              "paraphrases": ["What is object? It is"],
              "neighborhood": [{"prompt": "The value of type is", "answer": "class"}]},
             {"prompt": "A list is made of", "subject": "list", "target_new": "strings"},
             {"prompt": "Import {} from", "subject": "module", "target_new": "package"}]
    (root / "facts.jsonl").write_text("\n".join(json.dumps(r) for r in facts))
    docs = [text[i:i + 300] for i in range(0, 3000, 300)]
    (root / "forget.json").write_text(json.dumps(docs[:4]))
    (root / "retain.jsonl").write_text("\n".join(json.dumps({"text": d}) for d in docs[4:8]))
    pairs = [("the error raised an exception and the program crashed", "the function returned a value and printed it"),
             ("an exception was raised because the file failed", "a value was returned because the file existed"),
             ("the import failed with an error in the module", "the import worked with a name in the module"),
             ("raise an error when the argument is wrong", "return a result when the argument is right")]
    (root / "pairs.jsonl").write_text("".join(json.dumps({"undesired": u, "neutral": n}) + "\n" for u, n in pairs)
                                      + json.dumps({"neutral": "a class defines methods and attributes"}) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
