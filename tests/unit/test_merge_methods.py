"""The registered merges beyond average / task arithmetic / TIES, each against an independent reference written
from its definition (Python floats, entry by entry), and the seed control of the random drops (DARE, DELLA).
The comparison with real mergekit is a benchmark (examples/merge-mergekit), not a test: mergekit is no dependency."""

from __future__ import annotations

import math

import pytest
import torch

from toolkit.merge import kernels
from toolkit.merge.common import Site, layer_positions, merge_states
from toolkit.merge.config import (
    BreadcrumbsConfig,
    DareConfig,
    DellaConfig,
    DellaLinearConfig,
    ModelStockConfig,
    SlerpConfig,
)

NAME = "model.layers.1.mlp.down_proj.weight"


def _states(seed=0, n=3, shape=(6, 8)):
    g = torch.Generator().manual_seed(seed)
    base = {NAME: torch.randn(*shape, generator=g, dtype=torch.float64)}
    models = [{NAME: base[NAME] + torch.randn(*shape, generator=g, dtype=torch.float64)} for _ in range(n)]
    return base, models


def _merge_reference(base, kept, weights, consensus, normalize, lam):
    """Σ or sign-consensus merge of the weighted kept task vectors, entry by entry."""
    out = []
    for i in range(len(base)):
        column = [w * t[i] for w, t in zip(weights, kept)]
        if consensus:
            sign = 1 if sum(column) >= 0 else -1
            keep = [(c, w) for c, w in zip(column, weights) if (c > 0) - (c < 0) == sign]
        else:
            keep = list(zip(column, weights))
        total = sum(c for c, _ in keep)
        divisor = sum(w for _, w in keep)
        if normalize:
            total /= divisor if (divisor != 0 if consensus else abs(divisor) >= 1e-8) else 1.0
        out.append(base[i] + lam * total)
    return out


def _rescaled(tau, kept):
    before, after = sum(abs(v) for v in tau), sum(abs(v) for v in kept)
    return [v * before / after for v in kept] if before >= 1e-7 and after >= 1e-7 else kept


@pytest.mark.parametrize("method", ["dare-ties", "dare-linear"])
def test_dare_against_its_definition(method):
    base, models = _states(1)
    weights, density, lam, seed = [1.0, 0.5, 0.7], 0.6, 0.9, 11
    config = DareConfig(method=method, base="b", weights=weights, density=density, scaling=lam)
    merged = merge_states(config, models, base, seed=seed)[NAME].reshape(-1).tolist()
    flat_base = base[NAME].reshape(-1).tolist()
    kept = []
    for i, m in enumerate(models):
        tau = (m[NAME] - base[NAME]).reshape(-1).tolist()
        u = torch.rand(len(tau), generator=kernels.generator(seed, NAME, i), dtype=torch.float64).tolist()
        kept.append(_rescaled(tau, [v if x < density else 0.0 for v, x in zip(tau, u)]))
    expect = _merge_reference(flat_base, kept, weights, method == "dare-ties", False, lam)
    assert merged == pytest.approx(expect, abs=1e-12)


def test_dare_drops_are_seeded_per_tensor_and_model():
    base, models = _states(2, shape=(64, 64))
    config = DareConfig(base="b", density=0.3)
    a, b, c = (merge_states(config, models, base, seed=s)[NAME] for s in (3, 3, 4))
    assert torch.equal(a, b) and not torch.equal(a, c)
    kept = kernels.random_drop(torch.ones(200, 200, dtype=torch.float64), 0.3, kernels.generator(0, NAME, 0),
                               rescale=False)
    assert abs(float(kept.mean()) - 0.3) < 0.01  # each entry kept with probability density
    rescaled = kernels.random_drop(torch.ones(200, 200, dtype=torch.float64), 0.3, kernels.generator(0, NAME, 0))
    assert float(rescaled.abs().sum()) == pytest.approx(200 * 200)  # L1 norm restored


@pytest.mark.parametrize("config_cls", [DellaConfig, DellaLinearConfig])
def test_della_against_its_definition(config_cls):
    base, models = _states(3)
    weights, density, epsilon, seed = [0.8, 0.5, 1.0], 0.5, 0.2, 5
    config = config_cls(base="b", weights=weights, density=density, epsilon=epsilon)
    merged = merge_states(config, models, base, seed=seed)[NAME].reshape(-1).tolist()
    kept = []
    for i, m in enumerate(models):
        tau = (m[NAME] - base[NAME]).tolist()
        u = torch.rand(6, 8, generator=kernels.generator(seed, NAME, i), dtype=torch.float64).tolist()
        rows = []
        for row, draws in zip(tau, u):
            rank = {j: r for r, j in enumerate(sorted(range(len(row)), key=lambda j: abs(row[j])))}
            probs = [density - epsilon + 2 * epsilon * rank[j] / (len(row) - 1) for j in range(len(row))]
            rows += [v if x < p else 0.0 for v, x, p in zip(row, draws, probs)]
        flat = [v for row in tau for v in row]
        kept.append(_rescaled(flat, rows))
    expect = _merge_reference(base[NAME].reshape(-1).tolist(), kept, weights, config.method == "della",
                              config.normalize, 1.0)
    assert merged == pytest.approx(expect, abs=1e-12)


@pytest.mark.parametrize("method", ["breadcrumbs", "breadcrumbs-ties"])
def test_breadcrumbs_against_its_definition(method):
    base, models = _states(4)
    weights, density, gamma = [0.5, 0.3, 0.2], 0.7, 0.1
    config = BreadcrumbsConfig(method=method, base="b", weights=weights, density=density, gamma=gamma)
    merged = merge_states(config, models, base)[NAME].reshape(-1).tolist()
    kept = []
    for m in models:
        tau = (m[NAME] - base[NAME]).reshape(-1).tolist()
        n = len(tau)
        ranked = sorted(range(n), key=lambda j: abs(tau[j]))  # smallest first
        top, target = int(gamma * n), int(density * n)
        keep = set(ranked[n - target - top:n - top])
        kept.append([v if j in keep else 0.0 for j, v in enumerate(tau)])
    expect = _merge_reference(base[NAME].reshape(-1).tolist(), kept, weights, method.endswith("ties"), False, 1.0)
    assert merged == pytest.approx(expect, abs=1e-12)


@pytest.mark.parametrize("filter_wise", [False, True])
def test_model_stock_against_the_paper_formula(filter_wise):
    base, models = _states(5)
    merged = merge_states(ModelStockConfig(base="b", filter_wise=filter_wise), models, base)[NAME]
    rows = base[NAME].tolist() if filter_wise else [base[NAME].reshape(-1).tolist()]
    others = [m[NAME].tolist() if filter_wise else [m[NAME].reshape(-1).tolist()] for m in models]
    out = []
    for r, w0 in enumerate(rows):
        taus = [[x - y for x, y in zip(o[r], w0)] for o in others]
        cosines = []
        for i in range(len(taus)):
            for j in range(i + 1, len(taus)):
                dot = sum(a * b for a, b in zip(taus[i], taus[j]))
                norms = math.sqrt(sum(a * a for a in taus[i])) * math.sqrt(sum(b * b for b in taus[j]))
                cosines.append(dot / norms)
        cos, k = sum(cosines) / len(cosines), len(taus)
        t = k * cos / (1 + (k - 1) * cos)
        out.append([t * sum(o[r][c] for o in others) / k + (1 - t) * w0[c] for c in range(len(w0))])
    assert merged.reshape(-1).tolist() == pytest.approx([v for row in out for v in row], abs=1e-12)


def _slerp_reference(t, a, b):
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(x * x for x in b))
    dot = sum(x / na * y / nb for x, y in zip(a, b))
    if abs(dot) > 0.9995:
        return [(1 - t) * x + t * y for x, y in zip(a, b)]
    theta = math.acos(dot)
    return [(math.sin((1 - t) * theta) * x + math.sin(t * theta) * y) / math.sin(theta) for x, y in zip(a, b)]


def test_slerp_against_the_closed_form_with_a_gradient_over_the_layers():
    g = torch.Generator().manual_seed(6)
    names = [f"model.layers.{i}.mlp.up_proj.weight" for i in range(3)] + ["model.embed_tokens.weight"]
    base = {n: torch.randn(4, 5, generator=g, dtype=torch.float64) for n in names}
    other = {n: torch.randn(4, 5, generator=g, dtype=torch.float64) for n in names}
    other[names[2]] = 3 * base[names[2]]  # collinear: the linear fallback
    merged = merge_states(SlerpConfig(base="b", t=[0.2, 0.8]), [other], base)
    expect_t = {names[0]: 0.2, names[1]: 0.5, names[2]: 0.8, names[3]: 0.2}  # embeddings: the first value
    assert layer_positions(names) == {names[0]: 0.0, names[1]: 0.5, names[2]: 1.0, names[3]: 0.0}
    for n in names:
        expect = _slerp_reference(expect_t[n], base[n].reshape(-1).tolist(), other[n].reshape(-1).tolist())
        assert merged[n].reshape(-1).tolist() == pytest.approx(expect, abs=1e-12), n
    ends = merge_states(SlerpConfig(base="b", t=0.0), [other], base)
    assert all(torch.allclose(ends[n], base[n], atol=1e-12) for n in names)
    with pytest.raises(Exception, match="exactly one other model"):
        merge_states(SlerpConfig(base="b"), [other, other], base)


def test_site_reads_gradients_as_mergekit_does():
    assert Site("x", 0.0).at([1.0, 3.0, 5.0]) == 1.0
    assert Site("x", 0.75).at([1.0, 3.0, 5.0]) == pytest.approx(4.0)  # 0.75·2 = 1.5: halfway between 3 and 5
    assert Site("x", 1.0).at([1.0, 3.0, 5.0]) == 5.0 and Site("x", 0.3).at(2.5) == 2.5


def test_mergekit_numerics_compute_in_the_models_dtype():
    """bf16 TIES: float64 numerics round once; mergekit numerics compute in bf16 (different, and equal to the
    kernel run directly in bf16)."""
    from toolkit.merge.config import TiesConfig

    base, models = _states(7, shape=(32, 32))
    base = {k: v.bfloat16() for k, v in base.items()}
    models = [{k: v.bfloat16() for k, v in m.items()} for m in models]
    exact = merge_states(TiesConfig(base="b", density=0.5, weights=[1.0, 0.5, 0.7]), models, base)[NAME]
    native = merge_states(TiesConfig(base="b", density=0.5, weights=[1.0, 0.5, 0.7], numerics="mergekit"), models,
                          base)[NAME]
    taus = [kernels.magnitude(m[NAME] - base[NAME], 0.5) for m in models]
    direct = kernels.task_vector_merge(base[NAME], taus, [1.0, 0.5, 0.7], True, True, 1.0)
    assert exact.dtype == native.dtype == torch.bfloat16
    assert torch.equal(native, direct) and not torch.equal(native, exact)


def test_passthrough_stacks_block_ranges_and_the_result_loads(cli, tiny_llama_dir, tmp_path):
    """A mergekit passthrough config with slices: blocks [1, 2) of the model then [0, 2) scaled by 0.5 → 3 blocks;
    embeddings from the first slice's model, norm and head from the last's, scaled at t = 0."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config = tmp_path / "pass.yml"
    config.write_text(f"""merge_method: passthrough
slices:
  - sources: [{{model: {tiny_llama_dir}, layer_range: [1, 2]}}]
  - sources: [{{model: {tiny_llama_dir}, layer_range: [0, 2], parameters: {{scale: 0.5}}}}]
""")
    r = cli(["merge", "mergekit", config, "-o", tmp_path / "out"])
    assert r.exit_code == 0, r.stderr
    source = load_file(str(tiny_llama_dir / "model.safetensors"))
    out = {n: t for f in (tmp_path / "out" / "model").glob("*.safetensors") for n, t in load_file(str(f)).items()}
    q = "self_attn.q_proj.weight"
    assert torch.equal(out[f"model.layers.0.{q}"], source[f"model.layers.1.{q}"])
    assert torch.equal(out[f"model.layers.1.{q}"], 0.5 * source[f"model.layers.0.{q}"])
    assert torch.equal(out[f"model.layers.2.{q}"], 0.5 * source[f"model.layers.1.{q}"])
    assert torch.equal(out["model.embed_tokens.weight"], source["model.embed_tokens.weight"])
    assert torch.equal(out["model.norm.weight"], 0.5 * source["model.norm.weight"])
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "model")
    assert model.config.num_hidden_layers == 3


def test_tokenizer_sources_iclrkit_cannot_build_are_refused_on_stderr(cli, tiny_llama_dir, tmp_path):
    config = tmp_path / "union.yml"
    config.write_text(f"merge_method: linear\ntokenizer_source: union\nmodels:\n"
                      f"  - {{model: {tiny_llama_dir}, parameters: {{weight: 1}}}}\n"
                      f"  - {{model: {tiny_llama_dir}, parameters: {{weight: 1}}}}\n")
    r = cli(["merge", "mergekit", config, "-o", tmp_path / "out"])
    assert r.exit_code == 2 and "tokenizer_source 'union' is not supported" in r.stderr
    assert len(r.stderr.strip().splitlines()) <= 2 and not (tmp_path / "out").exists()
