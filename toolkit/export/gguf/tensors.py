"""The model's tensors as llama.cpp lays them out: each state-dict tensor under its gguf name, Q4_0 where quantized
(`Rows`), with the row rearrangements a layout asks for (q/k permutation, q/k/v regrouping, the attention-scale
fold), (1 + w) norms offset, fused experts split into llama.cpp's stacked expert tensors."""

from __future__ import annotations

import numpy as np
import torch

from toolkit.core.errors import BadInputError
from toolkit.export.gguf.layouts import text_config
from toolkit.export.gguf.metadata import query_scale, rope_factors
from toolkit.export.gguf.q4_0 import BLOCK, grid_block_scales


def permute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """HF q/k row order → llama.cpp's: within each head, the RoPE half-pairs (i, i+d/2) become adjacent rows."""
    return rows.reshape(n_head, 2, rows.shape[0] // n_head // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def regroup_qkv(rows: np.ndarray, kv_heads: int, heads: int, head_dim: int) -> np.ndarray:
    """Rows of a q/k/v projection grouped per KV head ([q × heads/kv, k, v] per group; per head when kv = heads)
    → [all q | all k | all v]."""
    per = heads // kv_heads
    grouped = rows.reshape(kv_heads, per + 2, head_dim, *rows.shape[1:])
    q = grouped[:, :per].reshape(heads * head_dim, *rows.shape[1:])
    k = grouped[:, per].reshape(kv_heads * head_dim, *rows.shape[1:])
    v = grouped[:, per + 1].reshape(kv_heads * head_dim, *rows.shape[1:])
    return np.concatenate([q, k, v], axis=0)


class Rows:
    """One tensor on its way into the file: Q4_0 (codes + block scales, rows first) or float (rows first)."""

    def __init__(self, codes=None, scales=None, value=None, float32: bool = False):
        self.codes, self.scales, self.value = codes, scales, value
        self.float32 = float32  # a float tensor F16 cannot hold exactly (folded rotations)

    def map_rows(self, fn) -> Rows:
        if self.codes is not None:
            return Rows(fn(self.codes), fn(self.scales))
        return Rows(value=fn(self.value), float32=self.float32)

    def scale_rows(self, c: float) -> Rows:
        if self.codes is not None:
            return Rows(self.codes, self.scales * np.float32(c))
        return Rows(value=(self.value.astype(np.float64) * c).astype(np.float32), float32=True)

    @staticmethod
    def stack(parts: list[Rows]) -> Rows:
        if all(p.codes is not None for p in parts):
            return Rows(np.stack([p.codes for p in parts]), np.stack([p.scales for p in parts]))
        return Rows(value=np.stack([p.value if p.value is not None else p.dequantized() for p in parts]))

    def dequantized(self) -> np.ndarray:
        return self.codes.astype(np.float32) * np.repeat(self.scales.astype(np.float32), BLOCK, axis=-1)


def _norm_offsets(view) -> dict[str, float]:
    """Full module path → the offset of its scale ((1 + w) norms: 1.0), for every norm of the model."""
    from toolkit.models.layout import is_norm
    from toolkit.models.norms import norm_info

    offsets = {}
    for index in range(len(view)):
        for path, info in view.layout(index).norms.items():
            offsets[f"{view.block_path(index)}.{path}"] = info.offset
    for name, module in view.model.named_modules():
        if name and name not in offsets and is_norm(module) and getattr(module, "weight", None) is not None \
                and not name.startswith(view.layers_path + "."):
            offsets[name] = norm_info(name, module).offset
    return offsets


def name_for(names, name: str, decoder: str) -> str | None:
    """gguf's name for a state-dict tensor: as it is, without the decoder's own prefix (BLOOM's `transformer.`), or
    with a multimodal wrapper's text-decoder prefix (model.language_model.) read as the plain `model.`."""
    candidates = [name]
    if decoder and name.startswith(decoder + "."):
        rest = name[len(decoder) + 1:]
        candidates += [rest, f"model.{rest}"]
    for candidate in candidates:
        found = names.get_name(candidate, try_suffixes=(".weight", ".bias"))
        if found is not None:
            return found
    return None


def _kind(gguf_name: str) -> str:
    """blk.3.attn_q.weight → attn_q; output_norm.weight → output_norm."""
    parts = gguf_name.split(".")
    return parts[2] if parts[0] == "blk" else parts[0]


def _expert_tensors(name: str, tensor: torch.Tensor, grids: dict, view) -> list[tuple[str, Rows]]:
    """A fused expert parameter → llama.cpp's stacked tensors (gate_up [E, 2I, H] → ffn_gate_exps + ffn_up_exps
    [E, I, H]; down [E, H, I] → ffn_down_exps), each expert Q4_0 where it was quantized."""
    import gguf

    block = int(name[len(view.layers_path) + 1:].split(".", 1)[0])
    param = name.rsplit(".", 1)[1]
    experts = tensor.shape[0]
    parts = []
    for e in range(experts):
        grid = grids.get(e)
        if grid is not None:
            parts.append(Rows(grid.codes.numpy(), grid_block_scales(grid)))
        else:
            parts.append(Rows(value=tensor[e].detach().float().cpu().numpy()))
    if any(p.codes is None for p in parts) and any(p.codes is not None for p in parts):
        parts = [Rows(value=p.dequantized()) if p.codes is not None else p for p in parts]
    stacked = Rows.stack(parts)

    def named(kind) -> str:
        return gguf.TENSOR_NAMES[kind].format(bid=block) + ".weight"

    if param == "down_proj":
        return [(named(gguf.MODEL_TENSOR.FFN_DOWN_EXP), stacked)]
    half = tensor.shape[1] // 2
    return [(named(gguf.MODEL_TENSOR.FFN_GATE_EXP), stacked.map_rows(lambda r: r[:, :half])),
            (named(gguf.MODEL_TENSOR.FFN_UP_EXP), stacked.map_rows(lambda r: r[:, half:]))]


class ModelTensors:
    """A quantized model's state dict as llama.cpp's tensors for one architecture: `collect()` → [(gguf name, Rows)]
    in state-dict order (then rope_freqs), and the tensors outside the text decoder that are not written."""

    def __init__(self, q, arch: str, layout, dims: dict):
        import gguf

        from toolkit.export.compressed_tensors import _folded_down_proj

        view = q.view
        self.q, self.arch, self.layout, self.dims = q, arch, layout, dims
        model_arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch]
        self.names = gguf.get_tensor_name_map(model_arch, dims["layers"])
        self.folded = _folded_down_proj(q)
        self.offsets = _norm_offsets(view)
        self.c = query_scale(text_config(q.model.config), layout, dims)
        self.decoder = view.layers_path.rsplit(".", 1)[0] if "." in view.layers_path else ""
        first = view.block_path(0)
        self.has_q_norm = any(  # Gemma 3's q-norm takes the attention-scale fold
            _kind(name_for(self.names, f"{first}.{path}.weight", self.decoder) or "x") == "attn_q_norm"
            for path in view.layout(0).qk_norms)
        head = view.lm_head
        self.head_names = {n for n, m in q.model.named_modules() if m is head and head is not None}
        self.modules = dict(q.model.named_modules())
        self.expert_grids: dict[str, dict[int, object]] = {}  # fused parameter → {expert: grid}
        for path, grid in q.linears.items():
            _, slot = view.resolve(path)
            if slot.kind == "expert":
                self.expert_grids.setdefault(view.param_name(path), {})[slot.expert] = grid

    def collect(self) -> tuple[list[tuple[str, Rows]], list[str]]:
        import gguf

        tensors: list[tuple[str, Rows]] = []
        skipped, seen = [], set()
        for name, tensor in self.q.model.state_dict().items():
            param = name.rsplit(".", 1)[1]
            if tensor.data_ptr() in seen and tensor.numel():
                continue  # a tied head: llama.cpp reuses token_embd
            seen.add(tensor.data_ptr())
            if name in self.expert_grids or (tensor.dim() == 3 and param in ("gate_up_proj", "down_proj")):
                tensors += _expert_tensors(name, tensor, self.expert_grids.get(name, {}), self.q.view)
                continue
            gguf_name = name_for(self.names, name, self.decoder)
            if gguf_name is None:
                skipped.append(self._unnamed(name))  # vision towers of multimodal wrappers, RoPE caches
                continue
            tensors.append((gguf_name, self._arranged(gguf_name, self._rows(name, tensor))))
        factors = rope_factors(text_config(self.q.model.config), self.dims["head_dim"]) \
            if self.layout.rope_factors else None
        if factors is not None:
            tensors.append((gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.ROPE_FREQS] + ".weight", Rows(value=factors)))
        return tensors, skipped

    def _unnamed(self, name: str) -> str:
        """A tensor gguf has no name for: skipped (returned) outside the text decoder or a RoPE cache, else refused."""
        module_path = name.rsplit(".", 1)[0]
        inside = not self.decoder or name.startswith(self.decoder + ".") or module_path in self.head_names
        if "rotary_emb" in name or not inside:
            return name
        raise BadInputError(f"--export gguf: no llama.cpp '{self.arch}' tensor name for {name}")

    def _rows(self, name: str, tensor: torch.Tensor) -> Rows:
        """One state-dict tensor as rows: Q4_0 where the slot is quantized, else float (a folded rotation F32)."""
        from toolkit.models.layout import _is_conv1d

        module_path, param = name.rsplit(".", 1)
        folded, offsets = self.folded, self.offsets
        if module_path in self.q.linears and param == "weight" and module_path not in folded:
            grid = self.q.linears[module_path]
            return Rows(grid.codes.numpy(), grid_block_scales(grid))
        value = folded[module_path] if module_path in folded and param == "weight" else tensor.detach().float()
        array = value.cpu().numpy().astype(np.float32)
        module = self.modules.get(module_path)
        if module is not None and _is_conv1d(module) and param == "weight" and module_path not in folded:
            array = array.T.copy()  # Conv1D stores (in, out)
        if param == "weight" and offsets.get(module_path):
            array = array + np.float32(offsets[module_path])  # (1 + w) norms: llama.cpp multiplies by w
        return Rows(value=array, float32=module_path in folded or bool(offsets.get(module_path)))

    def _arranged(self, gguf_name: str, rows: Rows) -> Rows:
        """The row rearrangements the layout asks for: q/k permutation, q/k/v regrouping, the attention-scale fold."""
        kind = _kind(gguf_name)
        layout, dims, c = self.layout, self.dims, self.c
        if layout.permute_qk and kind in ("attn_q", "attn_k"):
            heads = dims["heads"] if kind == "attn_q" else dims["kv_heads"]
            rows = rows.map_rows(lambda r: permute_rows(r, heads))
        if layout.qkv == "grouped" and kind == "attn_qkv":
            rows = rows.map_rows(lambda r: regroup_qkv(r, dims["kv_heads"], dims["heads"], dims["head_dim"]))
        if c != 1.0 and ((kind == "attn_q_norm" and self.has_q_norm) or (kind == "attn_q" and not self.has_q_norm)):
            rows = rows.scale_rows(c)
        return rows
