"""PRISM's step on a tiny GPT-2 against a recomputation with torch.func, the probe term really acting, the probe
reading the same layer and pooling it was trained on, and --resume reproducing an uninterrupted run."""

import json

import pytest
import torch
from torch.func import functional_call

from toolkit.core.context import RunContext
from toolkit.core.errors import RunError
from toolkit.unlearn.baselines import NpoConfig, npo_objective
from toolkit.unlearn.data import collate
from toolkit.unlearn.losses import mean_nll, npo_loss, probe_weight, sequence_logprob
from toolkit.unlearn.prism import PrismConfig, forget_loss, make_probe, pooled_features, prism_objective
from toolkit.unlearn.train import Corpus, StepInputs, UnlearnConfig, mean_pool, train

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture()
def setup(tiny_gpt2_dir):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()
    forget = collate([torch.randint(1, 200, (9,)), torch.randint(1, 200, (6,))], pad=0)
    retain = collate([torch.randint(1, 200, (8,)), torch.randint(1, 200, (8,))], pad=0)
    probe = make_probe(model.config.n_embd, (8,)).requires_grad_(False)
    with torch.no_grad():
        ref = sequence_logprob(model(**forget).logits, forget["input_ids"], forget["attention_mask"]) + 0.5
    return model, forget, retain, probe, ref


def _inputs(model, forget, retain, epoch=3, epochs=10):
    params = [p for p in model.parameters() if p.requires_grad]
    return StepInputs(model=model, forget=forget, retain=retain, forget_index=[0, 1], retain_index=[0, 1], step=0,
                      epoch=epoch, epochs=epochs, backward=lambda loss: loss.backward(), params=params)


def _expected_prism_grads(model, forget, retain, probe, ref, config, gamma):
    """Independent recomputation with torch.func on a dict of parameters."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    theta = {n: p.detach().clone() for n, p in model.named_parameters()}

    def lf(params):
        out = functional_call(model, params, (), {**forget, "output_hidden_states": True})
        npo = npo_loss(sequence_logprob(out.logits, forget["input_ids"], forget["attention_mask"]), ref, config.beta)
        feats = mean_pool(out.hidden_states[config.probe_layer], forget["attention_mask"])
        return npo + gamma * torch.nn.functional.cross_entropy(probe(feats), torch.zeros(2, dtype=torch.long))

    def lr(params):
        out = functional_call(model, params, (), dict(retain))
        return mean_nll(out.logits, retain["input_ids"], retain["attention_mask"])

    def grad(fn, at):
        leaves = {n: at[n].clone().requires_grad_(n in names) for n in at}
        g = torch.autograd.grad(fn(leaves), [leaves[n] for n in names], allow_unused=True)
        return {n: (torch.zeros_like(at[n]) if x is None else x) for n, x in zip(names, g)}

    g = grad(lf, theta)
    norm = torch.sqrt(sum((x ** 2).sum() for x in g.values()))
    shifted = {n: theta[n] + (config.sam_rho * g[n] / norm if n in g else 0) for n in theta}
    gf, gr = grad(lf, shifted), grad(lr, theta)
    out = {}
    for n in names:
        f, r = gf[n], gr[n]
        f = f - (f * r).sum() / ((r * r).sum() + 1e-6) * r
        out[n] = config.npo_coeff * f + config.coeff * r
    return out


def test_prism_step_matches_a_functional_recomputation(setup):
    model, forget, retain, probe, ref = setup
    config = PrismConfig(model="x", forget="x", probe_layer=1, sam_rho=0.05, adv_gamma=0.5)
    gamma = probe_weight(config.adv_gamma, 3, 10)
    expected = _expected_prism_grads(model, forget, retain, probe, ref, config, gamma)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    logs = prism_objective(config, ref, probe, 1)(_inputs(model, forget, retain))
    assert logs["gamma"] == pytest.approx(gamma) and gamma > 0
    for name, p in model.named_parameters():
        assert torch.equal(p.detach(), before[name])  # the SAM shift is undone
        assert torch.allclose(p.grad, expected[name], atol=1e-5, rtol=1e-4), name


def test_probe_term_changes_the_loss_and_the_update(setup):
    model, forget, retain, probe, ref = setup
    low, _ = forget_loss(model, forget, ref, 0.1, probe, 1, gamma=0.0)
    high, logs = forget_loss(model, forget, ref, 0.1, probe, 1, gamma=1.0)
    assert (high - low).item() == pytest.approx(logs["probe_ce"], rel=1e-5) and logs["probe_ce"] > 0
    grads = []
    for gamma_max in (0.0, 1.0):
        model.zero_grad()
        config = PrismConfig(model="x", forget="x", probe_layer=1, adv_gamma=gamma_max)
        prism_objective(config, ref, probe, 1)(_inputs(model, forget, retain))
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert not torch.allclose(grads[0], grads[1])


def test_probe_reads_the_mean_pooled_layer_it_was_trained_on(setup):
    """Pitfalls 3 and 6: the unlearning step feeds the probe exactly the stage-1 features (same layer, mean over
    real tokens; not the last position, which is padding for the shorter row here)."""
    model, forget, retain, probe, ref = setup
    corpus = Corpus(forget=[forget["input_ids"][0], forget["input_ids"][1, :6]], pad=0)
    stage1 = pooled_features(model, corpus, corpus.forget, layer=1, device="cpu")
    seen = []
    recorder = torch.nn.Sequential(torch.nn.Identity(), probe)
    recorder[0].register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    forget_loss(model, forget, ref, 0.1, recorder, 1, gamma=1.0)
    assert torch.allclose(seen[0], stage1, atol=1e-5)
    with torch.no_grad():
        last = model(**forget, output_hidden_states=True).hidden_states[1][:, -1]
    assert not torch.allclose(seen[0][1], last[1], atol=1e-3)


def test_prism_with_sam_probe_and_projection_off_is_npo_with_retain(setup):
    model, forget, retain, probe, ref = setup
    off = PrismConfig(model="x", forget="x", sam_rho=0.0, adv_gamma=0.0, project=False)
    prism_objective(off, ref, probe, 1)(_inputs(model, forget, retain))
    a = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    npo_objective(NpoConfig(model="x", forget="x"), ref)(_inputs(model, forget, retain))
    for x, p in zip(a, model.parameters()):
        assert torch.allclose(x, p.grad, atol=1e-6)


def test_resume_continues_a_killed_run_to_the_same_weights(tiny_gpt2_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    corpus = Corpus(forget=[torch.randint(1, 200, (8,)) for _ in range(4)], pad=0)
    config = UnlearnConfig(model="x", forget="x", batch_size=2, epochs=3, lr=1e-2, checkpoint_every=2)

    def objective(crash_at=None):
        def step(s):
            if s.step == crash_at:
                raise RunError("killed")
            loss = -mean_nll(s.model(**s.forget).logits, s.forget["input_ids"], s.forget["attention_mask"])
            s.backward(loss)
            return {"loss": loss.item()}
        return step

    def fresh():
        torch.manual_seed(0)
        return AutoModelForCausalLM.from_pretrained(tiny_gpt2_dir).eval()

    def run(out, crash_at=None, resume=False):
        model = fresh()
        ctx = RunContext(out=out, resume=resume, quiet=True)
        return train(config, ctx, model, corpus, objective(crash_at), list(model.parameters()), "t")

    full = run(tmp_path / "a")
    with pytest.raises(RunError):
        run(tmp_path / "b", crash_at=5)
    assert json.loads((tmp_path / "b" / "checkpoints" / "step.json").read_text()) == {"next_step": 4}
    resumed = run(tmp_path / "b", resume=True)
    assert resumed["resumed_from"] == 4 and full["steps"] == 6
    for p, q in zip(full["model"].parameters(), resumed["model"].parameters()):
        assert torch.allclose(p, q, atol=1e-6)
