"""Shared pieces that replaced per-technique copies: the JSON-lines writer (DeepRAG traces and indexes, the bench
fixtures) and DeepRAG's response log-probability (now toolkit.nn.logprobs.token_logprobs), bit for bit."""

from __future__ import annotations

import json

import torch

from toolkit.core.records import write_jsonl


def test_write_jsonl_writes_one_compact_record_a_line_through_a_rename(tmp_path):
    rows = [{"id": 1, "text": "Zürich"}, {"id": 2, "path": tmp_path}]
    path = write_jsonl(tmp_path / "sub" / "rows.jsonl", (row for row in rows))
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [rows[0], {"id": 2, "path": str(tmp_path)}]
    assert lines[0] == '{"id": 1, "text": "Zürich"}' and not list(path.parent.glob(".*.tmp"))
    assert write_jsonl(tmp_path / "empty.jsonl", []).read_text() == ""


class _Logits(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def forward(self, input_ids, attention_mask):
        return type("Out", (), {"logits": self.logits})()


def test_deeprag_sequence_logprob_equals_its_old_formula_bit_for_bit():
    from toolkit.rag.training import IGNORE, sequence_logprob

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(3, 7, 50, generator=g) * 4).to(torch.bfloat16)
    ids = torch.randint(0, 50, (3, 7), generator=g)
    labels = ids.clone()
    labels[:, :3] = IGNORE
    labels[2, 5:] = IGNORE
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    targets = labels[:, 1:]
    old = (logits[:, :-1].float().log_softmax(-1).gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
           * (targets != IGNORE)).sum(-1)
    new = sequence_logprob(_Logits(logits), batch)
    assert torch.equal(new, old)
    by_hand = [sum(float(torch.log_softmax(logits[b, t].double(), -1)[labels[b, t + 1]]) for t in range(6)
                   if labels[b, t + 1] != IGNORE) for b in range(3)]
    assert torch.allclose(new.double(), torch.tensor(by_hand, dtype=torch.float64), atol=1e-4)
