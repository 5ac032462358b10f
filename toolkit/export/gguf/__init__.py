"""GGUF Q4_0 export for llama.cpp (written with the `gguf` package), for every architecture llama.cpp has a loader for
among those iclrkit runs (`LAYOUTS`); the rest are refused before anything is loaded (`check_architecture`).

Q4_0 stores each run of 32 input columns of a row as an fp16 scale d and 32 unsigned 4-bit codes q, w = d·(q − 8):
exactly iclrkit's symmetric INT4 grid (codes c = q − 8 ∈ [−8, 7]). A per-channel (or grouped, group a multiple of
32) scale s maps onto it by giving every block of the row d = fp16(s) (round to nearest even) with the codes
unchanged, so the only change is that fp16 rounding of the scale: each weight moves by at most |w|·2⁻¹¹ relative,
and pruned weights (code 0 → q = 8) stay exactly zero. Scales that fp16 cannot hold (underflow/overflow) are refused.

What llama.cpp expects differs per architecture; `LAYOUTS` holds it as data (learned from llama.cpp's converter and
its loaders, not copied):
- tensor names from `gguf.get_tensor_name_map(arch, blocks)` (token_embd, blk.N.attn_q, ..., output_norm, output);
  a tied head is not written (llama.cpp reuses token_embd); a multimodal wrapper's text decoder only;
- `permute_qk`: llama.cpp's "normal" RoPE rotates adjacent pairs, transformers' rotate-half pairs (i, i + d/2): the
  q/k rows (and biases) are permuted per head (Llama, Mixtral, Granite, SmolLM3); NEOX-RoPE architectures and
  Cohere (already adjacent pairs) are written as they are;
- `qkv`: a fused q/k/v projection grouped per KV head ([q…, k, v] per group: Falcon, GPT-NeoX, BLOOM) is regrouped to
  [all q | all k | all v] (a row permutation: codes and scales move with their rows);
- norms with a (1 + w) scale (Gemma's, measured by the ModelView) are written as 1 + w (llama.cpp multiplies by w);
- fused experts (transformers 5 `gate_up_proj` [E, 2I, H], `down_proj` [E, H, I]) become ffn_gate_exps /
  ffn_up_exps [E, I, H] and ffn_down_exps [E, H, I], each expert's rows Q4_0 with its own scales;
- Gemma 2/3: llama.cpp scales attention by 1/√head_dim (1/√(hidden/heads) for the 27B shapes) where transformers uses
  query_pre_attn_scalar^-½; the ratio c is folded into q (Gemma 3: its q-norm weight, float; Gemma 2: the q rows'
  Q4_0 scales, d = fp16(c·s), exact when c is a power of two);
- metadata keys (norm eps, rope dimensions and base, sliding window and its per-layer pattern, soft-capping, logit /
  embedding / residual / attention scales, expert sizes, parallel residual) by `KEY_WRITERS`.
llama.cpp has no online rotation, so rotated down_proj linears are folded (W·Q_intᵀ) and stored F32.

The package, along its seams: `layouts` (the per-architecture data), `checks` (the gate before loading), `metadata`
(keys), `vocab` (the tokenizer), `tensors` (state dict → llama.cpp's tensors), `q4_0` (the block format, both ways),
`writer` (`save_gguf`).
"""

from toolkit.export.gguf.checks import check_architecture
from toolkit.export.gguf.layouts import LAYOUTS
from toolkit.export.gguf.q4_0 import q4_0_bytes, read_gguf_weights, read_q4_0
from toolkit.export.gguf.tensors import permute_rows
from toolkit.export.gguf.writer import check_exportable, save_gguf

__all__ = ["LAYOUTS", "check_architecture", "check_exportable", "permute_rows", "q4_0_bytes", "read_gguf_weights",
           "read_q4_0", "save_gguf"]
