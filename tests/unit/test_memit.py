"""MEMIT math against independent references: least squares, torch's Adam, norm projection."""

import torch

from toolkit.edit.keys import default_layers
from toolkit.edit.solve import MaskedAdam, closed_form_update, project_norm


def test_closed_form_equals_augmented_least_squares():
    torch.manual_seed(0)
    d_in, d_out, n, lam = 12, 7, 5, 3.0
    K, R = torch.randn(d_in, n, dtype=torch.float64), torch.randn(d_out, n, dtype=torch.float64)
    X = torch.randn(d_in, 40, dtype=torch.float64)
    C = X @ X.t() / 40
    update = closed_form_update(K, R, C, lam)
    # min ‖ΔW K − R‖² + λ‖ΔW L‖² with C = L Lᵀ, as one stacked least-squares problem in ΔWᵀ
    L = torch.linalg.cholesky(C)
    A = torch.cat([K.t(), lam ** 0.5 * L.t()])
    B = torch.cat([R.t(), torch.zeros(d_in, d_out, dtype=torch.float64)])
    reference = torch.linalg.lstsq(A, B).solution.t()
    assert torch.allclose(update, reference, atol=1e-9)


def test_closed_form_maps_keys_to_residuals_when_lambda_small():
    torch.manual_seed(1)
    K, R = torch.randn(16, 4), torch.randn(6, 4)
    update = closed_form_update(K, R, torch.eye(16), 1e-8)
    assert torch.allclose(update.float() @ K, R, atol=1e-4)


def test_project_norm_scales_only_rows_outside():
    delta = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    out = project_norm(delta, torch.tensor([1.0, 1.0]))
    assert torch.allclose(out[0].norm(), torch.tensor(1.0))
    assert torch.allclose(out[0] / out[0].norm(), delta[0] / 5)
    assert torch.equal(out[1], delta[1])


def test_masked_adam_equals_torch_adam_per_row_and_freezes_inactive_rows():
    torch.manual_seed(2)
    target = torch.randn(3, 5)
    param = torch.zeros(3, 5)
    reference = torch.zeros(1, 5, requires_grad=True)
    torch_adam = torch.optim.Adam([reference], lr=0.1)
    adam = MaskedAdam(param.shape, lr=0.1)
    active = torch.tensor([True, False, True])
    for _ in range(6):
        adam.step(param, 2 * (param - target), active)
        torch_adam.zero_grad()
        ((reference - target[:1]) ** 2).sum().backward()
        torch_adam.step()
    assert torch.allclose(param[0], reference.detach()[0], atol=1e-6)
    assert torch.equal(param[1], torch.zeros(5))


def test_default_layers():
    assert default_layers(30) == [3, 4]
    assert default_layers(4) == [1, 2]
    assert default_layers(2) == [0, 1]
