"""QuaRot rotation of a model on CUDA: Q built on the weights' device (no CPU x GPU matmul), the function unchanged,
the online Hadamard hook running on the GPU in the activations' dtype."""

import torch

from toolkit.compress.rotation import rotate_model
from toolkit.models.view import view_of


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=96, intermediate_size=168, num_hidden_layers=2,
                         num_attention_heads=6, num_key_value_heads=3, max_position_embeddings=64)
    return LlamaForCausalLM(config).eval()


def test_rotate_model_on_cuda_keeps_logits():
    model = _llama().cuda()
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1)).cuda()
    with torch.no_grad():
        before = model(ids).logits
        rotate_model(view_of(model), seed=5)
        assert all(p.is_cuda for p in model.parameters())
        after = model(ids).logits
    assert (after - before).abs().max() < 1e-3


def test_rotated_bfloat16_model_runs_on_cuda():
    model = _llama().cuda().to(torch.bfloat16)
    ids = torch.randint(0, 97, (1, 16), generator=torch.Generator().manual_seed(2)).cuda()
    with torch.no_grad():
        before = model(ids).logits.float()
        rotate_model(view_of(model), seed=3)
        after = model(ids).logits.float()
    assert after.dtype == torch.float32 and torch.isfinite(after).all()
    assert (after - before).abs().max() < 0.25 * before.abs().max()
