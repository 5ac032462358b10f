"""MUSE-style evaluation (VerbMem, KnowMem, PrivLeak, utility) and the attacks: relearning, jailbreak prefixes and
an embedding-space perturbation attack. MUSE: https://arxiv.org/abs/2407.06460 (swj0419/muse_bench)."""

from __future__ import annotations

from typing import Optional

import torch

from toolkit.core.errors import BadInputError
from toolkit.eval.perplexity import perplexity
from toolkit.models.adapters import cache_kwarg
from toolkit.models.source import load_model
from toolkit.nn.logprobs import next_token_logprobs
from toolkit.unlearn.config import EvalConfig, RelearnConfig
from toolkit.unlearn.data import encode_documents, load_documents, load_pairs, pad_id, qa_text
from toolkit.unlearn.metrics import mia_auc, min_k_score, privleak, rouge_l
from toolkit.unlearn.train import finetune


@torch.no_grad()
def greedy(model, embeds: torch.Tensor, new_tokens: int, stop: Optional[int] = None) -> list[int]:
    """Greedy decoding from prompt embeddings (1, T, d) with the KV cache."""
    name = cache_kwarg(model)
    out = model(inputs_embeds=embeds, use_cache=True)
    generated = []
    for _ in range(new_tokens):
        token = int(out.logits[0, -1].argmax())
        if stop is not None and token == stop:
            break
        generated.append(token)
        step = torch.tensor([[token]], device=embeds.device)
        out = model(input_ids=step, use_cache=True, **{name: getattr(out, name)})
    return generated


def _ids(tokenizer, text: str, keep_last: int, device) -> torch.Tensor:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"][-keep_last:]
    if not ids:
        raise BadInputError(f"prompt has no tokens: {text[:40]!r}")
    return torch.tensor([ids], device=device)


def positions(model) -> int:
    return getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", 4096)


def _room(model, config: EvalConfig, new_tokens: int) -> int:
    return max(1, min(config.prompt_tokens, positions(model) - new_tokens))


def continue_text(model, tokenizer, prompt: str, new_tokens: int, config: EvalConfig, device,
                  delta: Optional[torch.Tensor] = None) -> str:
    ids = _ids(tokenizer, prompt, _room(model, config, new_tokens), device)
    embeds = model.get_input_embeddings()(ids)
    if delta is not None:
        embeds = embeds + delta
    return tokenizer.decode(greedy(model, embeds, new_tokens))


def verbmem(model, tokenizer, pairs, config: EvalConfig, device, template: str = "{prompt}") -> list[float]:
    """ROUGE-L F1 between the greedy continuation of each forget prompt and its true continuation."""
    return [rouge_l(continue_text(model, tokenizer, template.format(prompt=p), config.verbmem_new_tokens, config,
                                  device), gt)["f1"] for p, gt in pairs]


def knowmem(model, tokenizer, qa, icl, config: EvalConfig, device) -> float:
    """Mean ROUGE-L recall of the answer in the first line of the model's reply (MUSE KnowMem)."""
    shots = "".join(qa_text(q, a) + "\n\n" for q, a in icl)
    scores = []
    for question, answer in qa:
        reply = continue_text(model, tokenizer, (shots + qa_text(question, "")).rstrip(), config.qa_new_tokens,
                              config, device)
        scores.append(rouge_l(reply.strip().split("\n")[0], answer)["recall"])
    return 100.0 * sum(scores) / len(scores)


@torch.no_grad()
def mia_scores(model, chunks: list[torch.Tensor], k: float, device) -> list[float]:
    scores = []
    for chunk in chunks:
        ids = chunk[None].to(device)
        logp = next_token_logprobs(model(ids).logits[0], ids[0])
        scores.append(min_k_score(logp, k))
    return scores


def embedding_attack(model, tokenizer, prompt: str, gt: str, config: EvalConfig, device) -> torch.Tensor:
    """White-box soft-prompt attack: signed-gradient ascent on an L∞-bounded perturbation δ of the prompt
    embeddings that raises the likelihood of the first ground-truth tokens; returns δ."""
    ids = _ids(tokenizer, prompt, _room(model, config, max(config.verbmem_new_tokens, config.embed_target_tokens)),
               device)
    target = _ids(tokenizer, gt, 10**9, device)[:, :config.embed_target_tokens]
    embedding = model.get_input_embeddings()
    radius = config.embed_epsilon * embedding.weight.detach().std().item()
    with torch.no_grad():
        prompt_embeds, target_embeds = embedding(ids), embedding(target)
    delta = torch.zeros_like(prompt_embeds, requires_grad=True)
    step = radius / 4
    for _ in range(config.embed_steps):
        logits = model(inputs_embeds=torch.cat([prompt_embeds + delta, target_embeds], 1)).logits
        predicted = logits[0, ids.shape[1] - 1:-1].float()
        loss = torch.nn.functional.cross_entropy(predicted, target[0])
        (grad,) = torch.autograd.grad(loss, delta)
        with torch.no_grad():
            delta -= step * grad.sign()
            delta.clamp_(-radius, radius)
    return delta.detach()


def evaluate(model, tokenizer, config: EvalConfig, device) -> dict:
    """Every metric the config has data for; VerbMem/KnowMem in points (0-100), PrivLeak in %."""
    model.eval()
    pairs = load_pairs(config.verbmem, ("prompt", "gt"), config.max_items)
    metrics: dict = {"verbmem_forget": 100.0 * _mean(verbmem(model, tokenizer, pairs, config, device))}
    icl = load_pairs(config.qa_icl, ("question", "answer")) if config.qa_icl else []
    for name, path in (("knowmem_forget", config.forget_qa), ("knowmem_retain", config.retain_qa)):
        if path:
            metrics[name] = knowmem(model, tokenizer, load_pairs(path, ("question", "answer"), config.max_items),
                                    icl, config, device)
    if config.holdout:
        metrics.update(_privleak(model, tokenizer, pairs, config, device))
    if config.retain:
        text = "\n\n".join(load_documents(config.retain, config.max_items))
        ids = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        metrics["utility_ppl"] = perplexity(model, ids, max_length=min(config.max_length, positions(model)),
                                            device=device)["ppl"]
    if config.jailbreak:
        metrics.update(_jailbreaks(model, tokenizer, pairs, config, device))
    return metrics


def _privleak(model, tokenizer, pairs, config: EvalConfig, device) -> dict:
    members = load_documents(config.mia_forget, config.max_items) if config.mia_forget else [p + g for p, g in pairs]
    holdout = load_documents(config.holdout, config.max_items)

    window = min(config.max_length, positions(model))

    def auc_of(m) -> float:
        def chunks(docs):
            return [encode_documents(tokenizer, [d], window)[0] for d in docs]
        return mia_auc(mia_scores(m, chunks(members), config.min_k, device),
                       mia_scores(m, chunks(holdout), config.min_k, device))

    out = {"mia_auc": auc_of(model)}
    reference = config.reference_auc
    if reference is None and config.reference_model:
        ref_model, _ = load_model(config.reference_model, device)
        reference = auc_of(ref_model)
    if reference is not None:
        out.update({"reference_auc": reference, "privleak": privleak(out["mia_auc"], reference)})
    return out


def _jailbreaks(model, tokenizer, pairs, config: EvalConfig, device) -> dict:
    """Prefix attack: per item the best of the templates (an attacker tries all); embedding attack: δ found by
    `embedding_attack`, then greedy decoding from the perturbed prompt."""
    per_template = [verbmem(model, tokenizer, pairs, config, device, t) for t in config.templates]
    best = [max(scores) for scores in zip(*per_template)] if per_template else []
    attacked = []
    for prompt, gt in pairs:
        with torch.enable_grad():
            delta = embedding_attack(model, tokenizer, prompt, gt, config, device)
        text = continue_text(model, tokenizer, prompt, config.verbmem_new_tokens, config, device, delta)
        attacked.append(rouge_l(text, gt)["f1"])
    return {"verbmem_jailbreak_prefix": 100.0 * _mean(best) if best else None,
            "verbmem_embed_attack": 100.0 * _mean(attacked)}


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def run_eval(config: EvalConfig, ctx) -> None:
    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    ctx.metrics.update(evaluate(model, tokenizer, config, ctx.device))


def relearn(model, tokenizer, config: RelearnConfig, seed: int, device, progress=None) -> list[float]:
    """Fine-tune `model` in place on the first `fraction` of the forget documents; returns the losses."""
    docs = load_documents(config.forget)
    subset = docs[:max(1, round(config.fraction * len(docs)))]
    chunks = encode_documents(tokenizer, subset, config.train_length)
    return finetune(model, chunks, pad_id(tokenizer), config.steps, config.lr, config.batch_size, seed, device,
                    progress)


def run_relearn(config: RelearnConfig, ctx) -> None:
    from toolkit.models.save import save_model

    model, tokenizer = load_model(config.model, ctx.device, ctx.torch_dtype)
    if config.measure_before:
        ctx.metrics["before"] = evaluate(model, tokenizer, config, ctx.device)
    losses = relearn(model, tokenizer, config, ctx.seed, ctx.device, ctx.progress)
    ctx.metrics.update({"relearn_first_loss": losses[0], "relearn_last_loss": losses[-1],
                        **evaluate(model, tokenizer, config, ctx.device)})
    if ctx.out is not None:
        save_model(model, tokenizer, ctx.path("model"), technique="unlearn.relearn", source=config.model,
                   metadata={"technique": "unlearn.relearn", "steps": config.steps})
