"""remove-ln math: FakeLN vs LayerNorm, σ tracking, special tokens, schedule, exports, DLA, resume."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from toolkit.core.context import RunContext
from toolkit.core.errors import BadInputError
from toolkit.remove_ln.analyze import direct_logit_attribution
from toolkit.remove_ln.export import (
    has_no_layernorm,
    load_folded,
    save_folded,
    to_folded,
    to_plain,
)
from toolkit.remove_ln.fakeln import (
    FakeLayerNorm,
    SpecialTokens,
    check_supported,
    convert,
    measure_sigmas,
    remove_all,
)
from toolkit.remove_ln.schedule import KINDS, apply_schedule, build_schedule
from toolkit.remove_ln.train import RemoveLNConfig, lr_factor, model_fingerprint, train

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_gpt2(seed: int = 0, layers: int = 2):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=97, n_positions=32, n_embd=32, n_layer=layers, n_head=4, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config).eval()


def token_ids(seed: int = 1, batch: int = 3, length: int = 16) -> torch.Tensor:
    ids = torch.randint(1, 97, (batch, length), generator=torch.Generator().manual_seed(seed))
    ids[0, 5] = ids[1, 9] = 0  # EOT tokens
    return ids


def removed_model(seed: int = 0):
    """A fully LN-free FakeLN model with distinct σ per path and perturbed γ, β (so the folds are exercised)."""
    model = tiny_gpt2(seed)
    handle = convert(model, eot_id=0)
    measure_sigmas(handle, [token_ids(2)])
    remove_all(handle)
    generator = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for fake in handle.all():
            fake.sigma_avg.mul_(1 + 0.5 * torch.rand((), generator=generator))
            fake.weight.add_(0.2 * torch.randn(fake.weight.shape, generator=generator))
            fake.bias.add_(0.2 * torch.randn(fake.bias.shape, generator=generator))
    return model, handle


def test_real_fakeln_is_layernorm_and_fake_with_true_std_too():
    norm = nn.LayerNorm(16)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    fake = FakeLayerNorm(norm, SpecialTokens(None), "ln")
    x = torch.randn(2, 5, 16) * 3 + 1
    assert torch.allclose(fake(x), torch.nn.functional.layer_norm(x, (16,), norm.weight, norm.bias, norm.eps),
                          atol=1e-6)
    token = x[:1, :1]
    fake.fake.fill_(True)
    fake.sigma_avg.fill_(torch.sqrt(token.var(-1, unbiased=False) + norm.eps).item())
    assert torch.allclose(fake(token), norm(token), atol=1e-5)


def test_converted_model_matches_original_before_removal():
    model = tiny_gpt2()
    ids = token_ids()
    reference = model(ids).logits
    convert(model, eot_id=0)
    assert torch.allclose(model(input_ids=ids).logits, reference, atol=1e-5)


@pytest.mark.parametrize("mode", ["recompute_on_real", "recompute_on_fake", "initial"])
def test_sigma_ema_tracks_only_when_the_mode_says(mode):
    norm = nn.LayerNorm(8)
    specials = SpecialTokens(None)
    fake = FakeLayerNorm(norm, specials, "ln", momentum=0.9, sigma_mode=mode).train()
    x = torch.randn(2, 6, 8) * 2
    specials.observe(torch.ones(2, 6, dtype=torch.long))
    token_std = torch.sqrt(x.var(-1, unbiased=False) + norm.eps)
    regular = token_std[:, 1:].mean().item()  # position 0 is special
    fake(x)
    expected = 0.9 * 1.0 + 0.1 * regular if mode != "initial" else 1.0
    assert fake.sigma_avg.item() == pytest.approx(expected, rel=1e-5)
    assert fake.sigma_special.item() == pytest.approx(0.9 + 0.1 * token_std[:, 0].mean().item() if mode != "initial"
                                                      else 1.0, rel=1e-5)
    fake.fake.fill_(True)
    before = fake.sigma_avg.item()
    fake(x)
    moved = fake.sigma_avg.item() != pytest.approx(before, rel=1e-7)
    assert moved == (mode == "recompute_on_fake")


def test_special_tokens_keep_their_own_sigma_until_their_stage():
    norm = nn.LayerNorm(8)
    specials = SpecialTokens(eot_id=0)
    fake = FakeLayerNorm(norm, specials, "ln").eval()
    fake.fake.fill_(True)
    fake.sigma_avg.fill_(2.0)
    fake.sigma_special.fill_(10.0)
    x = torch.randn(1, 4, 8)
    ids = torch.tensor([[5, 0, 5, 5]])
    centered = x - x.mean(-1, keepdim=True)

    def scales():
        specials.observe(ids)
        return (centered / fake(x))[0, :, 0]  # γ = 1, β = 0

    assert torch.allclose(scales(), torch.tensor([10.0, 10.0, 2.0, 2.0]))
    specials.keep_eot.fill_(False)
    assert torch.allclose(scales(), torch.tensor([10.0, 2.0, 2.0, 2.0]))
    specials.keep_bos.fill_(False)
    assert torch.allclose(scales(), torch.tensor([2.0, 2.0, 2.0, 2.0]))


def test_schedule_covers_every_ln_once_in_order_and_flips_on_its_step():
    layers, steps = 4, 60
    events = build_schedule(layers, steps)
    names = [e.name for e in events]
    assert len(names) == len(set(names)) == 3 * layers + 3
    assert [e.step for e in events] == sorted({e.step for e in events})  # strictly increasing
    assert [e.kind for e in events][::layers][:3] == ["ln_2", "ln_1_qk", "ln_1_v"] and names[-3:] == list(KINDS[3:])
    assert events[0].step == round(20 / 300 * steps) and events[-1].step < steps
    model = tiny_gpt2(layers=layers)
    handle = convert(model, eot_id=0)
    flags = {f.name: f for f in handle.all()}
    for event in events:
        apply_schedule(handle, events, event.step - 1)
        target = flags.get(event.name)
        before = bool(target.fake) if target is not None else not bool(getattr(handle.specials, f"keep_{event.kind}"))
        apply_schedule(handle, events, event.step)
        after = bool(target.fake) if target is not None else not bool(getattr(handle.specials, f"keep_{event.kind}"))
        assert (before, after) == (False, True), event
    assert handle.fully_removed()


def test_paper_schedule_for_gpt2_small_is_reproduced():
    steps = {e.name: e.step for e in build_schedule(12, 300)}
    assert steps["blocks.0.ln_2"] == 20 and steps["blocks.11.ln_2"] == 42
    assert steps["blocks.0.ln_1_qk"] == 44 and steps["blocks.0.ln_1_v"] == 68 and steps["blocks.11.ln_1_v"] == 101
    assert (steps["ln_f"], steps["eot"], steps["bos"]) == (104, 106, 116)


def test_too_few_steps_for_the_schedule_is_refused():
    with pytest.raises(BadInputError, match="too few"):
        build_schedule(12, 60)


def test_lr_schedule_is_cosine_with_min_lr():
    config = RemoveLNConfig(model="m", steps=300)
    assert lr_factor(0, config) == pytest.approx(1 / 20)
    assert lr_factor(19, config) == pytest.approx(1.0)
    assert lr_factor(300, config) == pytest.approx(0.5)


def test_plain_and_folded_exports_match_fakeln_logits(tmp_path):
    from transformers import GPT2LMHeadModel

    model, handle = removed_model()
    ids = token_ids(3)
    reference = model(input_ids=ids).logits
    plain = to_plain(handle)
    assert (plain(ids).logits - reference).abs().max() < 1e-4
    plain.save_pretrained(tmp_path / "plain")
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "plain").eval()
    assert type(reloaded) is GPT2LMHeadModel
    assert (reloaded(ids).logits - reference).abs().max() < 1e-4
    folded = to_folded(handle)
    assert has_no_layernorm(folded)
    assert (folded(ids).logits - reference).abs().max() < 1e-4
    save_folded(folded, None, tmp_path / "folded", {"form": "folded"}, "card")
    assert (load_folded(tmp_path / "folded")(ids).logits - reference).abs().max() < 1e-4


def test_fold_matches_explicit_matrix_product():
    """Independent reference for one fold: x @ C diag(γ/σ) W + (b + β W) with C = I - 11ᵀ/d built explicitly."""
    from toolkit.remove_ln.export import _fold_into

    d, out = 6, 5
    generator = torch.Generator().manual_seed(0)
    w, b, gamma, beta = (torch.randn(d, out, generator=generator), torch.randn(out, generator=generator),
                         torch.randn(d, generator=generator), torch.randn(d, generator=generator))
    folded_w, folded_b = _fold_into(w, b, gamma, beta, torch.tensor(1.7))
    centering = torch.eye(d) - torch.ones(d, d) / d
    assert torch.allclose(folded_w, centering @ torch.diag(gamma / 1.7) @ w, atol=1e-6)
    assert torch.allclose(folded_b, b + beta @ w, atol=1e-6)


def test_export_refuses_a_model_with_layernorm_still_active():
    model = tiny_gpt2()
    handle = convert(model, eot_id=0)
    with pytest.raises(BadInputError, match="still active"):
        to_plain(handle)


def test_dla_sums_to_logits_on_ln_free_but_not_on_original():
    _, handle = removed_model()
    ids = token_ids(4)
    for exported in (to_plain(handle), to_folded(handle)):
        result = direct_logit_attribution(exported, ids)
        assert result["max_abs_err"] < 1e-4
    assert direct_logit_attribution(tiny_gpt2(), ids)["max_abs_err"] > 1e-3


def test_llama_and_other_architectures_are_refused(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    with pytest.raises(BadInputError, match="RMSNorm"):
        check_supported(AutoModelForCausalLM.from_pretrained(tiny_llama_dir))


class StopAfter(RunContext):
    """A context whose progress bar raises after n steps, like a killed job."""

    stop_after: int | None = None

    def progress(self, iterable, total=None, description=""):
        for count, item in enumerate(iterable):
            if self.stop_after is not None and count == self.stop_after:
                raise KeyboardInterrupt
            yield item


def test_resume_continues_exactly_and_refuses_another_model(tmp_path):
    config = RemoveLNConfig(model="m", steps=24, batch_size=2, seqlen=8, checkpoint_every=4,
                            start_fraction=0.1, end_fraction=0.9)
    ids = torch.randint(0, 97, (400,), generator=torch.Generator().manual_seed(0))
    events = build_schedule(2, config.steps, config.start_fraction, config.end_fraction)

    def fresh():
        model = tiny_gpt2()
        return model, convert(model, eot_id=0), model_fingerprint(tiny_gpt2(), config)

    model_a, handle_a, fingerprint = fresh()
    train(model_a, ids, config, StopAfter(out=tmp_path / "a"), 8, fingerprint, "ln_free", handle_a, events)
    model_b, handle_b, _ = fresh()
    killed = StopAfter(out=tmp_path / "b")
    killed.stop_after = 10
    with pytest.raises(KeyboardInterrupt):
        train(model_b, ids, config, killed, 8, fingerprint, "ln_free", handle_b, events)
    model_b, handle_b, _ = fresh()
    train(model_b, ids, config, StopAfter(out=tmp_path / "b", resume=True), 8, fingerprint, "ln_free", handle_b,
          events)
    for (name, a), b in zip(model_a.state_dict().items(), model_b.state_dict().values()):
        assert torch.equal(a, b), name
    other = model_fingerprint(tiny_gpt2(seed=5), config)
    with pytest.raises(BadInputError, match="another model"):
        train(tiny_gpt2(), ids, config, StopAfter(out=tmp_path / "b", resume=True), 8, other, "ln_free")
