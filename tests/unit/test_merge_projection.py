"""Dimensionality-matching projections beyond MLPs: CNN channel matching and function-preserving GPT-2 widening;
the LM scores of the GPT-2 merge zoo."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

import pytest
import torch

from toolkit.merge.digits import DigitsCNN
from toolkit.merge.projection import duplicate_index, project, weight_matching, widen_gpt2

pytestmark = pytest.mark.usefixtures("one_thread")


def _cnn_state(channels: int, depth: int = 2, seed: int = 0) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in DigitsCNN(channels, depth).state_dict().items()}


def _cnn_out(channels: int, state: dict, x: torch.Tensor, depth: int = 2) -> torch.Tensor:
    net = DigitsCNN(channels, depth)
    net.load_state_dict(state)
    with torch.no_grad():
        return net(x)


def _permute_channels(state: dict, p0: torch.Tensor, p1: torch.Tensor) -> dict:
    """Channels of conv 0 permuted by p0, of conv 1 by p1; the head's 16-column channel blocks follow p1."""
    head = state["head.weight"].view(10, -1, 16)[:, p1].reshape(10, -1)
    return {"convs.0.weight": state["convs.0.weight"][p0], "convs.0.bias": state["convs.0.bias"][p0],
            "convs.1.weight": state["convs.1.weight"][p1][:, p0], "convs.1.bias": state["convs.1.bias"][p1],
            "head.weight": head, "head.bias": state["head.bias"]}


def test_conv_channel_matching_recovers_a_known_permutation():
    state = _cnn_state(6)
    p0, p1 = torch.randperm(6, generator=torch.Generator().manual_seed(1)), torch.tensor([3, 0, 5, 1, 4, 2])
    permuted = _permute_channels(state, p0, p1)
    x = torch.rand(5, 64)
    assert torch.allclose(_cnn_out(6, permuted, x), _cnn_out(6, state, x), atol=1e-5)  # same function
    matches = weight_matching(permuted, state)
    assert torch.equal(p0[matches[0]], torch.arange(6)) and torch.equal(p1[matches[1]], torch.arange(6))
    aligned = project(permuted, state, align=True)
    assert all(torch.equal(aligned[k], state[k]) for k in state)


def test_conv_widening_preserves_the_function():
    small, big, x = _cnn_state(3, seed=1), _cnn_state(5, seed=2), torch.rand(7, 64)
    for align in (False, True):
        widened = project(small, big, align=align)
        assert {k: v.shape for k, v in widened.items()} == {k: v.shape for k, v in big.items()}
        assert torch.allclose(_cnn_out(5, widened, x), _cnn_out(3, small, x), atol=1e-5)


def test_conv_channel_matching_is_optimal_on_a_tiny_case():
    """One conv layer: the assignment must maximise the inner product over all injective maps (brute force)."""
    src, tgt = _cnn_state(3, depth=1, seed=3), _cnn_state(4, depth=1, seed=4)

    def score(assign):
        total = 0.0
        for slot, unit in enumerate(assign):
            if unit < 0:
                continue
            total += float((tgt["convs.0.weight"][slot] * src["convs.0.weight"][unit]).sum())
            total += float(tgt["convs.0.bias"][slot] * src["convs.0.bias"][unit])
            total += float((tgt["head.weight"][:, slot * 16:(slot + 1) * 16]
                            * src["head.weight"][:, unit * 16:(unit + 1) * 16]).sum())
        return total

    best = -math.inf
    for slots in itertools.permutations(range(4), 3):
        assign = [-1] * 4
        for unit, slot in enumerate(slots):
            assign[slot] = unit
        best = max(best, score(assign))
    assert score(weight_matching(src, tgt)[0].tolist()) == pytest.approx(best, rel=1e-6)


def _gpt2(width: int, heads: int = 2, seed: int = 0, layers: int = 2):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=width, n_layer=layers, n_head=heads,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
    for p in model.parameters():  # larger than the default init, so every path matters to the logits
        p.data.normal_(0.0, 0.3)
    return model


def test_duplicate_index_keeps_blocks_in_place():
    assert duplicate_index(4, 2).tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert duplicate_index(4, 2, block=2).tolist() == [0, 1, 0, 1, 2, 3, 2, 3]


@pytest.mark.parametrize("factor", [2, 3])
def test_gpt2_widening_computes_the_same_logits(factor):
    from toolkit.merge.models import untied_state

    small, big = _gpt2(8), _gpt2(8 * factor, seed=1)
    widened = widen_gpt2(untied_state(small), heads=2, width=8 * factor)
    missing, unexpected = big.load_state_dict(widened, strict=False)
    assert missing == ["lm_head.weight"] and not unexpected  # tied to wte
    ids = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(big(ids).logits, small(ids).logits, atol=1e-4)


def test_gpt2_widening_rejects_a_non_integer_factor():
    from toolkit.core.errors import BadInputError
    from toolkit.merge.models import untied_state

    with pytest.raises(BadInputError, match="integer factor"):
        widen_gpt2(untied_state(_gpt2(8)), heads=2, width=12)


def test_next_token_scores_against_a_per_position_loop():
    from toolkit.merge.lmzoo import next_token_scores

    model = _gpt2(8)
    ids = torch.randint(0, 50, (40,), generator=torch.Generator().manual_seed(2))
    scores = next_token_scores(model, ids, seqlen=8, max_windows=4)
    nll, hits, count = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, 32, 8):
            window = ids[start:start + 8]
            logits = model(window.unsqueeze(0)).logits[0]
            for t in range(7):
                nll -= float(torch.log_softmax(logits[t].double(), -1)[window[t + 1]])
                hits += int(int(logits[t].argmax()) == int(window[t + 1]))
                count += 1
    assert scores["nll"] == pytest.approx(nll / count, rel=1e-5)
    assert scores["acc"] == pytest.approx(100.0 * hits / count)


def test_duplicate_fill_widens_without_empty_units_and_keeps_the_function():
    from toolkit.merge.digits import DigitsMLP

    small, big, x = _cnn_state(3, seed=5), _cnn_state(7, seed=6), torch.rand(6, 64)
    widened = project(small, big, align=True, fill="duplicate")
    assert torch.allclose(_cnn_out(7, widened, x), _cnn_out(3, small, x), atol=1e-5)
    assert (widened["convs.0.weight"].flatten(1).abs().sum(1) > 0).all()  # no zero channel
    torch.manual_seed(7)
    mlp_small = {k: v.detach() for k, v in DigitsMLP([64, 5, 4, 10]).state_dict().items()}
    mlp_big = {k: v.detach() for k, v in DigitsMLP([64, 12, 9, 10]).state_dict().items()}
    wide = project(mlp_small, mlp_big, align=True, fill="duplicate")
    for name in ("layers.0.weight", "layers.1.weight"):
        assert (wide[name].abs().sum(1) > 0).all()
    nets = [DigitsMLP(sizes) for sizes in ([64, 5, 4, 10], [64, 12, 9, 10])]
    nets[0].load_state_dict(mlp_small)
    nets[1].load_state_dict(wide)
    with torch.no_grad():
        assert torch.allclose(nets[1](x), nets[0](x), atol=1e-5)


# ------------------------------------------------------------------ depth matching (Net2DeeperNet)
def _plain(family: str, arch: dict, net):
    from toolkit.merge.models import PlainModel, untied_state

    return PlainModel(family=family, arch=arch, state=untied_state(net), source=f"{family}-{arch}")


def _outputs(model, x: torch.Tensor) -> torch.Tensor:
    from toolkit.merge.digits import net_from_state

    with torch.no_grad():
        return net_from_state(model.family, model.arch, model.state)(x)


@pytest.mark.parametrize("align", [False, True])
def test_mlp_deepened_and_widened_into_a_target_keeps_the_function(align):
    from toolkit.merge.deepen import deepen
    from toolkit.merge.digits import DigitsMLP
    from toolkit.merge.projection import lay_out

    torch.manual_seed(11)
    shallow = _plain("digits-mlp", {"sizes": [64, 5, 10]}, DigitsMLP([64, 5, 10]))
    target = _plain("digits-mlp", {"sizes": [64, 9, 7, 6, 10]}, DigitsMLP([64, 9, 7, 6, 10]))
    x = torch.rand(20, 64) - 0.3  # negative pixels too: the identity only relies on the post-ReLU activations
    deeper = deepen(shallow, 3)
    assert deeper.arch["sizes"] == [64, 5, 5, 5, 10]
    assert torch.allclose(_outputs(deeper, x), _outputs(shallow, x), atol=1e-5)
    projected = lay_out(shallow, target, align=align)
    assert {k: v.shape for k, v in projected.items()} == {k: v.shape for k, v in target.state.items()}
    result = _outputs(replace(target, state=projected), x)
    assert torch.allclose(result, _outputs(shallow, x), atol=1e-5)
    assert not torch.allclose(_outputs(target, x), _outputs(shallow, x), atol=1e-2)  # the check can fail


def test_cnn_deepened_with_dirac_kernels_keeps_the_function():
    from toolkit.merge.deepen import deepen
    from toolkit.merge.projection import lay_out

    torch.manual_seed(12)
    shallow = _plain("digits-cnn", {"channels": 3, "depth": 1}, DigitsCNN(3, 1))
    target = _plain("digits-cnn", {"channels": 5, "depth": 3}, DigitsCNN(5, 3))
    x = torch.rand(6, 64)
    deeper = deepen(shallow, 3)
    assert list(deeper.state) == list(DigitsCNN(3, 3).state_dict())
    assert torch.allclose(_outputs(deeper, x), _outputs(shallow, x), atol=1e-5)
    for align in (False, True):
        state = lay_out(shallow, target, align=align)
        result = _outputs(replace(target, state=state), x)
        assert torch.allclose(result, _outputs(shallow, x), atol=1e-5)


def test_gpt2_deepened_with_zero_output_blocks_computes_the_same_logits():
    """Deepened alone (2 -> 4 blocks), and deepened + widened (n_embd 8 -> 16) into a target layout."""
    from toolkit.merge.deepen import deepen
    from toolkit.merge.projection import lay_out

    shallow_net, target_net = _gpt2(8), _gpt2(16, seed=1, layers=4)
    shallow = _plain("hf-gpt2", {"n_embd": 8, "n_layer": 2, "n_head": 2}, shallow_net)
    target = _plain("hf-gpt2", {"n_embd": 16, "n_layer": 4, "n_head": 2}, target_net)
    deeper = deepen(shallow, 4)
    assert deeper.arch["n_layer"] == 4
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = shallow_net(ids).logits
        assert not torch.allclose(target_net(ids).logits, expected, atol=1e-2)  # the check can fail
    for state, net in ((deeper.state, _gpt2(8, layers=4)), (lay_out(shallow, target, align=True), target_net)):
        missing, unexpected = net.load_state_dict(state, strict=False)
        assert missing == ["lm_head.weight"] and not unexpected  # tied to wte
        with torch.no_grad():
            assert torch.allclose(net(ids).logits, expected, atol=1e-5)


def test_a_model_deeper_than_the_target_is_refused():
    from toolkit.core.errors import BadInputError
    from toolkit.merge.deepen import match_depth
    from toolkit.merge.digits import DigitsMLP

    deep = _plain("digits-mlp", {"sizes": [64, 4, 4, 10]}, DigitsMLP([64, 4, 4, 10]))
    shallow = _plain("digits-mlp", {"sizes": [64, 4, 10]}, DigitsMLP([64, 4, 10]))
    with pytest.raises(BadInputError, match="never drops layers"):
        match_depth(deep, shallow)
    assert match_depth(shallow, shallow) is shallow
