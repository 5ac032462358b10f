"""Edit requests from CounterFact / zsRE files in the ROME-MEMIT schema, EasyEdit's schema, or a simple JSONL.

Every record becomes an `EditRequest` whose `prompt` holds the subject slot `{}`: "The mother tongue of {} is".
Accepted shapes (detected per record):
- ROME/MEMIT CounterFact: `requested_rewrite{prompt, subject, target_new{str}, target_true{str}}`,
  `paraphrase_prompts`, `neighborhood_prompts` (answered by the true object), `generation_prompts`.
- zsRE (MEND/MEMIT): `subject, src, alt, answers, rephrase, loc, loc_ans`.
- EasyEdit: `prompt, subject, target_new, ground_truth, rephrase_prompt, locality_prompt, locality_ground_truth`.
- KnowEdit (EasyEdit's benchmark files): the EasyEdit keys (WikiBio: `text, labels, concept`) with nested
  `locality{Relation_Specificity, Forgetfulness: [{prompt, ground_truth}]}` (-> neighbourhood prompts) and
  `portability{Reasoning, Subject_Aliasing, Logical_Generalization: [...]}` (-> portability prompts, answered by
  the edited knowledge); a ground_truth may be a string, a list of aliases or a list of alias lists (the first
  alias is the answer scored).
MQuAKE (several edits + multi-hop questions per record) is refused with a clear error.
- Simple JSONL: `prompt, subject, target_new[, target_true, paraphrases, neighborhood[{prompt, answer}]]`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from toolkit.core.errors import BadInputError

SLOT = "{}"


@dataclass
class EditRequest:
    prompt: str  # contains the subject slot "{}"
    subject: str
    target_new: str
    target_true: str | None = None
    paraphrases: list[str] = field(default_factory=list)
    neighborhood: list[tuple[str, str]] = field(default_factory=list)  # (prompt, answer the edit must not change)
    generation_prompts: list[str] = field(default_factory=list)
    portability: list[tuple[str, str]] = field(default_factory=list)  # (prompt, answer after the edit)
    record_id: str = ""

    @property
    def text(self) -> str:
        return self.prompt.replace(SLOT, self.subject, 1)


def _text(value) -> str | None:
    if isinstance(value, dict):
        value = value.get("str")
    if isinstance(value, list):
        value = value[0] if value else None
    return None if value is None else str(value)


def _first_alias(value) -> str | None:
    """KnowEdit answers: "x", ["x", "alias"], [["x", "alias"], ["y"]] -> "x"."""
    while isinstance(value, list):
        if not value:
            return None
        value = value[0]
    if isinstance(value, dict):
        value = value.get("str")
    return None if value is None else str(value)


def _nested(section, where: str, name: str) -> list[tuple[str, str]]:
    """KnowEdit's {kind: [{prompt, ground_truth}, ...]} (prompt may itself be a list) -> (prompt, answer) pairs."""
    if section is None:
        return []
    if not isinstance(section, dict):
        raise BadInputError(f"{where}: '{name}' must be an object of {{kind: [{{prompt, ground_truth}}]}}")
    pairs = []
    for kind, items in section.items():
        for item in items if isinstance(items, list) else [items]:
            if not isinstance(item, dict) or "prompt" not in item or "ground_truth" not in item:
                raise BadInputError(f"{where}: {name}.{kind} entries need 'prompt' and 'ground_truth'")
            prompts = item["prompt"] if isinstance(item["prompt"], list) else [item["prompt"]]
            answer = _first_alias(item["ground_truth"])
            if answer is not None and answer.strip():
                pairs += [(str(p), answer) for p in prompts]
    return pairs


def _as_list(value) -> list[str]:
    if value is None:
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _slot_prompt(prompt: str, subject: str, where: str) -> str:
    if SLOT in prompt:
        return prompt
    if not subject or subject not in prompt:
        raise BadInputError(f"{where}: subject {subject!r} not found in prompt {prompt!r}")
    return prompt.replace(subject, SLOT, 1)


def parse_record(record: dict, where: str) -> EditRequest:
    """One record of any supported schema -> EditRequest; `where` names the record in errors."""
    if not isinstance(record, dict):
        raise BadInputError(f"{where}: each record must be a JSON object")
    if isinstance(record.get("requested_rewrite"), list) or "new_single_hops" in record:
        raise BadInputError(f"{where}: an MQuAKE record (several edits + multi-hop questions) is not supported",
                            "iclrkit edits one (subject, relation, object) per record: CounterFact, zsRE, "
                            "EasyEdit/KnowEdit or {prompt, subject, target_new}")
    if "requested_rewrite" in record:
        rewrite = record["requested_rewrite"]
        subject, prompt = str(rewrite.get("subject", "")), str(rewrite.get("prompt", ""))
        true = _text(rewrite.get("target_true"))
        request = EditRequest(prompt=prompt, subject=subject, target_new=_text(rewrite.get("target_new")) or "",
                              target_true=true, paraphrases=_as_list(record.get("paraphrase_prompts")),
                              neighborhood=[(p, true) for p in _as_list(record.get("neighborhood_prompts")) if true],
                              generation_prompts=_as_list(record.get("generation_prompts")))
    elif "src" in record and "alt" in record:
        loc = record.get("loc")
        request = EditRequest(prompt=str(record["src"]), subject=str(record.get("subject", "")),
                              target_new=_text(record["alt"]) or "", target_true=_text(record.get("answers")),
                              paraphrases=_as_list(record.get("rephrase")),
                              neighborhood=[(str(loc), _text(record["loc_ans"]))] if loc and record.get("loc_ans")
                              else [])
    elif ("prompt" in record and "target_new" in record) or ("text" in record and "labels" in record):
        if "prompt" not in record:  # KnowEdit WikiBio: text / labels / concept
            record = {**record, "prompt": record["text"], "target_new": record["labels"],
                      "subject": record.get("subject", record.get("concept", ""))}
        neighborhood = [(str(n["prompt"]), str(n["answer"])) for n in record.get("neighborhood") or []
                        if isinstance(n, dict) and "prompt" in n and "answer" in n]
        if record.get("locality_prompt") and record.get("locality_ground_truth"):
            neighborhood += [(p, _text(record["locality_ground_truth"])) for p in _as_list(record["locality_prompt"])]
        neighborhood += _nested(record.get("locality"), where, "locality")
        true = record.get("target_true", record.get("ground_truth"))
        request = EditRequest(prompt=str(record["prompt"]), subject=str(record.get("subject", "")),
                              target_new=_first_alias(record["target_new"]) or "",
                              target_true=_first_alias(true) if true is not None else None,
                              paraphrases=_as_list(record.get("paraphrases", record.get("rephrase_prompt"))),
                              neighborhood=neighborhood,
                              portability=_nested(record.get("portability"), where, "portability"))
    else:
        raise BadInputError(f"{where}: unknown fact schema (keys: {', '.join(sorted(record)[:8])})",
                            "expected CounterFact (requested_rewrite), zsRE (src, alt) or {prompt, subject, target_new}")
    if not request.subject.strip():
        raise BadInputError(f"{where}: empty subject")
    if not request.target_new.strip():
        raise BadInputError(f"{where}: empty target_new")
    request.prompt = _slot_prompt(request.prompt, request.subject, where)
    request.record_id = where
    return request


def load_facts(path: str | Path, limit: int | None = None) -> list[EditRequest]:
    """Edit requests from a .json list or a .jsonl file; errors name the file and the record."""
    path = Path(path)
    if not path.is_file():
        raise BadInputError(f"fact file not found: {path}")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInputError(f"cannot read {path}: {exc}") from None
    records: list[tuple[str, object]] = []
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadInputError(f"{path}: malformed JSON at line {exc.lineno} ({exc.msg})") from None
        records = [(f"{path.name} record {i}", r) for i, r in enumerate(data)]
    else:
        for number, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                records.append((f"{path.name}:{number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise BadInputError(f"{path}:{number}: malformed JSON ({exc.msg})") from None
    if not records:
        raise BadInputError(f"{path} has no fact records")
    if limit is not None:
        if len(records) < limit:
            raise BadInputError(f"{path} has {len(records)} facts, fewer than the {limit} asked for")
        records = records[:limit]
    return [parse_record(record, where) for where, record in records]
