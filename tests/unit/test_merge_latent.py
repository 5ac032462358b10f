"""LS-Merge math: chunking round trip, VAE training, projection, interpolation and the weight-space baselines."""

from __future__ import annotations

import itertools

import pytest
import torch

from toolkit.merge import chunking
from toolkit.merge.common import merge_states
from toolkit.merge.config import AverageConfig, TaskArithmeticConfig, TiesConfig
from toolkit.merge.digits import DigitsMLP
from toolkit.merge.latent import decode, encode, interpolate, latent_merge, slerp
from toolkit.merge.projection import lay_out, project, weight_matching
from toolkit.merge.vae import (
    LossWeights,
    VAEShape,
    WeightVAE,
    gaussian_mmd,
    kl_to_standard,
    stage_loss,
    stage_parameters,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"embed.weight": torch.randn(7, 5, generator=g), "block.0.attn.weight": torch.randn(13, 11, generator=g),
            "block.0.attn.bias": torch.randn(13, generator=g), "block.0.conv.weight": torch.randn(3, 2, 3, 3, generator=g),
            "block.0.norm.weight": torch.rand(13, generator=g) + 0.5, "head.weight": torch.randn(4, 13, generator=g) * 1e-3,
            "half.weight": torch.randn(9, 9, generator=g).half(), "steps": torch.tensor([3])}


def test_chunk_round_trip_is_bit_exact():
    state = _state()
    chunked = chunking.chunk_state(state, chunk=16, exclude=[])
    back = chunking.unchunk(chunked.tokens, chunked.slots, chunked.means, chunked.stds)
    floats = [n for n, t in state.items() if t.is_floating_point()]
    assert list(back) == floats
    for name in floats:
        assert back[name].dtype == state[name].dtype
        assert torch.equal(back[name], state[name]), name


def test_chunks_never_cross_a_tensor_boundary_and_padding_is_masked():
    state = _state()
    chunked = chunking.chunk_state(state, chunk=16, exclude=["norm"])
    assert "block.0.norm.weight" not in [s.name for s in chunked.slots]
    for slot in chunked.slots:
        numel = torch.Size(slot.shape).numel()
        assert slot.n_tokens == -(-numel // 16)
        tokens = slice(slot.first_token, slot.first_token + slot.n_tokens)
        assert set(chunked.layer_ids[tokens].tolist()) == {slot.layer}
        assert chunked.positions[tokens].tolist() == list(range(slot.n_tokens))
        assert int(chunked.valid[tokens].sum()) == numel
        assert torch.all(chunked.tokens[tokens].reshape(-1)[numel:] == 0)
    # tensors of one module share a layer id; different modules do not
    by_name = {s.name: s.layer for s in chunked.slots}
    assert by_name["block.0.attn.weight"] == by_name["block.0.attn.bias"] != by_name["block.0.conv.weight"]
    # per-tensor normalisation: every encoded tensor has mean 0, std 1 over its valid entries
    for slot in chunked.slots:
        values = chunked.tokens[slot.first_token:slot.first_token + slot.n_tokens][
            chunked.valid[slot.first_token:slot.first_token + slot.n_tokens]]
        if values.numel() > 1:
            assert abs(float(values.mean())) < 1e-9 and abs(float(values.std()) - 1) < 1e-9


def test_windows_round_trip():
    chunked = chunking.chunk_state(_state(), chunk=16, exclude=[])
    win = chunking.windows(chunked, 4)
    assert win["x"].shape[1] == 4 and int(win["token_mask"].sum()) == chunked.tokens.shape[0]
    assert torch.equal(chunking.from_windows(win["x"], chunked.tokens.shape[0]), chunked.tokens.float())


def _toy_data(n_models: int = 3):
    models = [DigitsMLP([64, 8, 8, 10]) for _ in range(n_models)]
    chunks = [chunking.chunk_state(m.state_dict(), 64, ["bias"]) for m in models]
    return models, chunks


def _train(model, chunks, stage, steps, lr=3e-3):
    data = {k: torch.cat([chunking.windows(c, model.shape.window)[k] for c in chunks])
            for k in chunking.windows(chunks[0], model.shape.window)}
    params = stage_parameters(model, stage)
    optimizer = torch.optim.Adam(params, lr=lr)
    for _ in range(steps):
        loss, _ = stage_loss(model, data, stage, LossWeights(mmd=0.0))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def _rel_err(model, chunked, stage):
    decoded = decode(model, encode(model, chunked, stage, "cpu"), chunked, chunked.means, chunked.stds, stage, "cpu")
    original = chunking.unchunk(chunked.tokens, chunked.slots, chunked.means, chunked.stds)
    err = sum(float((decoded[n] - original[n]).pow(2).sum()) for n in original)
    return (err / sum(float(t.pow(2).sum()) for t in original.values())) ** 0.5


@pytest.fixture(scope="module")
def trained_toy():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    models, chunks = _toy_data()
    model = WeightVAE(VAEShape(chunk=64, window=4, d_model=32, heads=2, encoder_layers=1, decoder_layers=1,
                               latent_dim=64, compression=2))
    before = [_rel_err(model, c, 1) for c in chunks]
    _train(model, chunks, 1, 250)
    stage1 = [_rel_err(model, c, 1) for c in chunks]
    _train(model, chunks, 2, 150)
    yield model, chunks, before, stage1, [m.state_dict() for m in models]
    torch.set_num_threads(threads)


def test_vae_reconstruction_improves_with_training(trained_toy):
    model, chunks, before, stage1, _ = trained_toy
    assert max(stage1) < 0.5 * min(before)
    stage2 = [_rel_err(model, c, 2) for c in chunks]
    assert max(stage2) < min(before)


def test_stage_two_freezes_the_encoder():
    model = WeightVAE(VAEShape(chunk=16, window=4, d_model=16, heads=2, encoder_layers=1, decoder_layers=1,
                               latent_dim=8, compression=2))
    trained = {id(p) for p in stage_parameters(model, 2)}
    assert not any(id(p) in trained for p in model.encoder.parameters())
    assert all(id(p) in trained for p in model.neck_mu.parameters())
    assert not any(id(p) in {id(q) for q in stage_parameters(model, 1)} for p in model.neck_up.parameters())


def test_merging_a_model_with_itself_returns_it(trained_toy):
    model, chunks, _, stage1, _ = trained_toy
    chunked = chunks[0]
    code = encode(model, chunked, 1, "cpu")
    merged_code = interpolate([code, code], [0.5, 0.5], "linear")
    assert torch.allclose(merged_code, code, atol=1e-6)
    assert torch.allclose(interpolate([code, code], [0.5, 0.5], "slerp"), code, atol=1e-5)
    decoded_once = decode(model, code, chunked, chunked.means, chunked.stds, 1, "cpu")
    merged = decode(model, merged_code, chunked, chunked.means, chunked.stds, 1, "cpu")
    assert all(torch.allclose(merged[n], decoded_once[n], atol=1e-5) for n in merged)
    assert _rel_err(model, chunked, 1) < 0.25 and _rel_err(model, chunked, 2) < 0.5


def _merge(model, states, weights, residual, stage=2, how="linear"):
    return latent_merge(model, states, weights, 64, ["bias"], stage, how, residual, "cpu")[0]


def test_residual_correction_makes_self_merge_and_endpoints_exact(trained_toy):
    model, _, _, _, states = trained_toy
    a, b = states[0], states[1]
    for merged in (_merge(model, [a, a], [0.5, 0.5], True), _merge(model, [a, b], [1.0, 0.0], True)):
        assert all(torch.equal(merged[n], a[n]) for n in a)
    # without the correction the lossy stage-2 code does not give the parent back
    pure = _merge(model, [a, b], [1.0, 0.0], False)
    assert not torch.allclose(pure["layers.0.weight"], a["layers.0.weight"], atol=1e-3)
    assert torch.equal(pure["layers.0.bias"], a["layers.0.bias"])  # excluded tensors: weight space


def test_residual_correction_against_the_definition(trained_toy):
    model, _, _, _, states = trained_toy
    weights = [0.3, 0.7]
    merged = _merge(model, states[:2], weights, True)
    pure = _merge(model, states[:2], weights, False)
    alone = [_merge(model, [s, s], [0.5, 0.5], False) for s in states[:2]]  # decode(encode(W_i))
    for name in ("layers.0.weight", "layers.1.weight", "layers.2.weight"):
        expected = pure[name].double() + sum(w * (s[name].double() - d[name].double())
                                             for w, s, d in zip(weights, states, alone))
        assert torch.allclose(merged[name].double(), expected, atol=1e-5), name


def test_slerp_against_the_closed_form():
    a = torch.tensor([[[1.0, 0.0]]])
    b = torch.tensor([[[0.0, 1.0]]])
    mid = slerp(a, b, 0.5)
    assert torch.allclose(mid, torch.tensor([[[2 ** -0.5, 2 ** -0.5]]]), atol=1e-6)
    assert torch.allclose(slerp(a, b, 0.0), a) and torch.allclose(slerp(a, b, 1.0), b, atol=1e-6)


def test_mmd_and_kl_reference_values():
    x = torch.randn(50, 4)
    assert float(gaussian_mmd(x, x)) == pytest.approx(0.0, abs=1e-6)
    assert float(gaussian_mmd(x, x + 5)) > 0.5
    assert float(kl_to_standard(torch.zeros(3, 4), torch.zeros(3, 4))) == 0.0
    mu, logvar = torch.tensor([1.0]), torch.tensor([0.0])
    assert float(kl_to_standard(mu, logvar)) == pytest.approx(0.5)


# ------------------------------------------------------------------ projection
def _net_outputs(sizes, state, x):
    net = DigitsMLP(sizes)
    net.load_state_dict(state)
    return net(x)


def test_weight_matching_recovers_a_known_permutation():
    torch.manual_seed(1)
    net = DigitsMLP([64, 12, 10, 10])
    state = {k: v.detach() for k, v in net.state_dict().items()}
    p0, p1 = torch.randperm(12), torch.randperm(10)
    permuted = {"layers.0.weight": state["layers.0.weight"][p0], "layers.0.bias": state["layers.0.bias"][p0],
                "layers.1.weight": state["layers.1.weight"][p1][:, p0], "layers.1.bias": state["layers.1.bias"][p1],
                "layers.2.weight": state["layers.2.weight"][:, p1], "layers.2.bias": state["layers.2.bias"]}
    matches = weight_matching(permuted, state)
    assert torch.equal(p0[matches[0]], torch.arange(12)) and torch.equal(p1[matches[1]], torch.arange(10))
    aligned = project(permuted, state, align=True)
    assert all(torch.equal(aligned[k], state[k]) for k in state)


def test_widening_projection_preserves_the_function():
    torch.manual_seed(2)
    small = {k: v.detach() for k, v in DigitsMLP([64, 6, 6, 10]).state_dict().items()}
    big = {k: v.detach() for k, v in DigitsMLP([64, 9, 9, 10]).state_dict().items()}
    x = torch.randn(20, 64)
    for align in (False, True):
        widened = project(small, big, align=align)
        assert {k: tuple(v.shape) for k, v in widened.items()} == {k: tuple(v.shape) for k, v in big.items()}
        assert torch.allclose(_net_outputs([64, 9, 9, 10], widened, x), _net_outputs([64, 6, 6, 10], small, x),
                              atol=1e-5)


def test_weight_matching_is_optimal_on_a_tiny_case():
    """One hidden layer: the assignment must maximise the inner product over all injective maps (brute force)."""
    torch.manual_seed(3)
    src = {k: v.detach() for k, v in DigitsMLP([64, 3, 10]).state_dict().items()}
    tgt = {k: v.detach() for k, v in DigitsMLP([64, 4, 10]).state_dict().items()}

    def score(assign):
        total = 0.0
        for slot, unit in enumerate(assign):
            if unit < 0:
                continue
            total += float(tgt["layers.0.weight"][slot] @ src["layers.0.weight"][unit].double().float())
            total += float(tgt["layers.0.bias"][slot] * src["layers.0.bias"][unit])
            total += float(tgt["layers.1.weight"][:, slot] @ src["layers.1.weight"][:, unit])
        return total

    candidates = []
    for slots in itertools.permutations(range(4), 3):
        assign = [-1] * 4
        for unit, slot in enumerate(slots):
            assign[slot] = unit
        candidates.append(score(assign))
    found = weight_matching(src, tgt)[0].tolist()
    assert score(found) == pytest.approx(max(candidates), rel=1e-6)


# ------------------------------------------------------------------ baselines
def test_average_and_task_arithmetic():
    a, b, base = _state(1), _state(2), _state(3)
    avg = merge_states(AverageConfig(weights=[3, 1]), [a, b], None)
    assert torch.allclose(avg["embed.weight"], 0.75 * a["embed.weight"] + 0.25 * b["embed.weight"])
    assert torch.equal(avg["steps"], a["steps"])
    ta = merge_states(TaskArithmeticConfig(base="b", scaling=0.5), [a, b], base)
    expect = base["head.weight"] + 0.5 * (a["head.weight"] - base["head.weight"] + b["head.weight"] - base["head.weight"])
    assert torch.allclose(ta["head.weight"], expect, atol=1e-7)


def test_ties_against_an_elementwise_reference():
    g = torch.Generator().manual_seed(4)
    base = {"w": torch.randn(5, 4, generator=g)}
    models = [{"w": base["w"] + torch.randn(5, 4, generator=g)} for _ in range(3)]
    density, scaling = 0.4, 0.8
    merged = merge_states(TiesConfig(base="b", density=density, scaling=scaling), models, base)["w"]
    taus = [(m["w"] - base["w"]).reshape(-1).tolist() for m in models]
    keep = round(density * 20)
    trimmed = []
    for tau in taus:
        cut = sorted(abs(v) for v in tau)[-keep]
        trimmed.append([v if abs(v) >= cut else 0.0 for v in tau])
    expect = []
    for i in range(20):
        column = [t[i] for t in trimmed]
        total = sum(column)
        sign = (total > 0) - (total < 0)
        agree = [v for v in column if v != 0 and ((v > 0) - (v < 0)) == sign]
        expect.append(base["w"].reshape(-1)[i].item() + scaling * (sum(agree) / len(agree) if agree else 0.0))
    assert torch.allclose(merged.reshape(-1).double(), torch.tensor(expect, dtype=torch.float64), atol=1e-5)


def test_padded_average_pads_at_the_end_and_average_rejects_other_sizes():
    small = {"w": torch.ones(2, 3)}
    big = {"w": torch.full((3, 4), 3.0)}
    from toolkit.merge.models import PlainModel

    laid = [lay_out(PlainModel("x", {}, s), PlainModel("x", {}, big), align=False) for s in (small, big)]
    merged = merge_states(AverageConfig(), laid, None)["w"]
    assert torch.equal(merged[:2, :3], torch.full((2, 3), 2.0)) and torch.equal(merged[2], torch.full((4,), 1.5))
    from toolkit.core.errors import BadInputError

    with pytest.raises(BadInputError, match="different sizes"):
        merge_states(AverageConfig(), [small, big], None)
