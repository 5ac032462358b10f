"""The token file the llm-compressor peer rows read (repro.sh, gptq_side_by_side.sh): our exact calibration windows
and evaluation ids, written from the project's environment (the peer runs in .venv-bench, see peer_llmcompressor.py).

Usage: peer_tokens.py MODEL CALIB_TEXT HELDOUT_TEXT NSAMPLES SEQLEN EVAL_WINDOWS OUT.pt
"""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from toolkit.data.text import calibration_windows, load_text, tokenize  # noqa: E402
from toolkit.models.source import load_model, resolve_model_path  # noqa: E402

model, calib, heldout, n, seqlen, windows, out = sys.argv[1:8]
_, tokenizer = load_model(model, "cpu", torch.float32)
torch.save({"model_dir": str(resolve_model_path(model)),
            "calibration": calibration_windows(tokenizer, load_text(calib), int(n), int(seqlen), 0),
            "eval_ids": tokenize(tokenizer, load_text(heldout)), "max_length": 256, "windows": int(windows)}, out)
