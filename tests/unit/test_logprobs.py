"""toolkit.nn.logprobs against an independent float64 softmax, and the pad mask."""

import torch

from toolkit.nn.logprobs import next_token_logprobs, sequence_logprob, token_logprobs


def _reference(logits, ids):
    logits = logits.double()
    probs = logits.exp() / logits.exp().sum(-1, keepdim=True)
    return torch.stack([torch.stack([probs[b, t, ids[b, t + 1]].log() for t in range(ids.shape[1] - 1)])
                        for b in range(ids.shape[0])])


def test_next_token_logprobs_match_an_independent_softmax():
    torch.manual_seed(0)
    logits, ids = torch.randn(3, 7, 11), torch.randint(0, 11, (3, 7))
    torch.testing.assert_close(next_token_logprobs(logits, ids).double(), _reference(logits, ids), rtol=0,
                               atol=1e-5)
    torch.testing.assert_close(token_logprobs(logits[:, :-1], ids[:, 1:]), next_token_logprobs(logits, ids))


def test_sequence_logprob_skips_pad_tokens_and_half_precision_is_scored_in_float32():
    torch.manual_seed(1)
    logits, ids = torch.randn(2, 5, 9), torch.randint(0, 9, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    ref = _reference(logits, ids)
    expected = torch.stack([ref[0].sum(), ref[1, :2].sum()])
    torch.testing.assert_close(sequence_logprob(logits, ids, mask).double(), expected, rtol=0, atol=1e-5)
    assert next_token_logprobs(logits.half(), ids).dtype == torch.float32
