import numpy as np
import pytest

from toolkit.core.errors import BadInputError, ResourceError
from toolkit.llm import load_llm
from toolkit.llm.hf import HFBackend
from toolkit.llm.server import LoopbackServer


@pytest.fixture(scope="module")
def hf(tiny_llama_dir):
    return HFBackend(str(tiny_llama_dir))


def test_hf_score_equals_sum_of_generated_token_logprobs(hf):
    completion = hf.generate(["def main"], max_new_tokens=5)[0]
    scored = hf.score(["def main"], [completion.text])[0]
    assert len(completion.token_logprobs) == 5
    if scored.tokens == completion.tokens:  # retokenisation can merge tokens across the boundary
        assert scored.logprob == pytest.approx(sum(completion.token_logprobs), abs=1e-4)
    assert scored.logprob < 0 and scored.mean_logprob == pytest.approx(scored.logprob / len(scored.tokens))


def test_openai_backend_round_trips_through_loopback(hf, tmp_path):
    with LoopbackServer(reply=lambda prompt: f"echo:{prompt[-3:]}") as url:
        llm = load_llm(f"openai:loopback@{url}", cache_dir=str(tmp_path / "cache"))
        assert llm.generate(["abcdef"])[0].text == "echo:def"
        assert llm.generate(["hello"], chat=True)[0].text == "echo:llo"
        assert len(list((tmp_path / "cache").glob("*.json"))) == 2
        with pytest.raises(ResourceError, match="no prompt log-probs"):
            llm.score(["a"], ["b"])


def test_openai_scoring_matches_local_scores(hf):
    server = LoopbackServer(backend=hf)
    with server as url:
        remote = load_llm(f"openai:tiny@{url}")
        ours = remote.score(["The answer is"], [" yes"])[0]
    local = hf.score(["The answer is"], [" yes"])[0]
    assert ours.logprob == pytest.approx(local.logprob, abs=1e-4)


def test_bad_specs_and_unreachable_server():
    with pytest.raises(BadInputError):
        load_llm("openai:model-without-url")
    llm = load_llm("openai:m@http://127.0.0.1:9/v1", timeout=1.0)
    llm.retries = 0
    with pytest.raises(ResourceError, match="failed after 1 tries"):
        llm.generate(["x"])


def test_chat_score_scores_the_reply_to_the_templated_user_turn(hf):
    import copy

    tokenizer = copy.deepcopy(hf.tokenizer)
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    chat = HFBackend("tiny-chat", model=hf.model, tokenizer=tokenizer)
    templated = "<|user|>Is it raining?\n<|assistant|>"
    assert chat.format("Is it raining?", chat=True) == templated
    ours = chat.score(["Is it raining?"], [" yes"], chat=True)[0]
    assert ours.logprob == pytest.approx(chat.score([templated], [" yes"])[0].logprob, abs=1e-5)
    assert ours.logprob != pytest.approx(chat.score(["Is it raining?"], [" yes"])[0].logprob, abs=1e-3)
    completion = chat.generate(["Is it raining?"], max_new_tokens=4, chat=True)[0]
    rescored = chat.score(["Is it raining?"], [completion.text], chat=True)[0]
    if rescored.tokens == completion.tokens:
        assert rescored.logprob == pytest.approx(sum(completion.token_logprobs), abs=1e-4)


def test_openai_backend_refuses_chat_scoring_by_name(hf):
    with LoopbackServer(backend=hf) as url:
        with pytest.raises(ResourceError, match="chat score"):
            load_llm(f"openai:tiny@{url}").score(["a"], ["b"], chat=True)


def test_hf_generation_stops_early_at_a_stop_marker(hf):
    prompts = ["def main", "import os"]
    full = hf.generate(prompts, max_new_tokens=24)
    marker = full[0].text[len(full[0].text) // 2:][:2]
    assert marker.strip(), full[0].text
    stopped = hf.generate(prompts, max_new_tokens=24, stop=[marker])
    for whole, cut in zip(full, stopped, strict=True):
        assert cut.text == whole.text[:whole.text.find(marker)] if marker in whole.text else cut.text == whole.text
    assert len(stopped[0].tokens) < len(full[0].tokens) and stopped[0].finish_reason == "stop"
    assert stopped[0].token_logprobs == pytest.approx(full[0].token_logprobs[:len(stopped[0].tokens)], abs=1e-5)


@pytest.fixture(scope="module", params=["gpt2", "llama"])
def local_llm(request, tiny_gpt2_dir, tiny_llama_dir):
    return HFBackend(str(tiny_gpt2_dir if request.param == "gpt2" else tiny_llama_dir))


PROMPTS = ["Be brief.\nQuestion: is it so?\nResponse:", "Be brief.\nQuestion: a much longer question here?\nResponse:",
           "Think first.\nQuestion: why?\nResponse:"]


def reference(llm, prompts, continuations):
    return np.array([[s.logprob for s in llm.score([p] * len(continuations), continuations)] for p in prompts])


def test_cached_prefix_score_choices_match_teacher_forced_score(local_llm):
    from toolkit.llm.base import LLM
    from toolkit.llm.hf import _layout

    continuations = ["Answer: a", "Answer: b", "Answer: c"]
    # the fast path applies: the continuations differ in exactly their last token
    assert _layout(local_llm.tokenizer, PROMPTS[0], continuations) is not None
    local_llm.batch_size = 2
    fast = np.array(local_llm.score_choices(PROMPTS, continuations))
    assert fast == pytest.approx(reference(local_llm, PROMPTS, continuations), abs=1e-4)
    assert fast == pytest.approx(np.array(LLM.score_choices(local_llm, PROMPTS, continuations)), abs=1e-4)


def test_multi_token_choices_fall_back_to_score(local_llm):
    from toolkit.llm.hf import _layout

    continuations = ["Answer: positive", "Answer: neg"]
    assert _layout(local_llm.tokenizer, PROMPTS[1], continuations) is None
    fast = np.array(local_llm.score_choices(PROMPTS, continuations))
    assert fast == pytest.approx(reference(local_llm, PROMPTS, continuations), abs=1e-4)
