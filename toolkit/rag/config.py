"""DeepRAG's configs, one per `iclrkit rag deeprag` command (torch-free: the CLI builds its options from these
fields). Paper https://arxiv.org/abs/2502.01142, official code https://github.com/gxy-gxy/DeepRAG."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field, field_validator

from toolkit.core.config import BaseConfig
from toolkit.core.fields import data_field, model_field
from toolkit.llm.config import LLMClientConfig
from toolkit.rag.prompts import DECOMPOSE_INSTRUCTION, READER_PROMPT, STANDALONE_PARAMETRIC_PROMPT
from toolkit.rag.trace import INSTRUCTION

Method = Literal["deeprag", "always", "never", "single"]


class IndexConfig(BaseConfig):
    """`rag deeprag index`: a BM25 (bm25s, k1=1.5, b=0.75) or dense (FAISS + all-MiniLM-L6-v2) index over a passage
    JSONL ({id, title, text} or FlashRAG {id, contents}) or over the paragraphs of a HotpotQA file."""

    corpus: str = Field(description="Passages JSONL ({id,title,text} or {id,contents}) or a HotpotQA file.")
    retriever: Literal["bm25", "dense"] = Field("bm25", description="Sparse (BM25) or dense (FAISS + MiniLM).")


class QAConfig(LLMClientConfig):
    """What `synth` and `run` share: the model that reads, the questions, the retriever, the prompt."""

    model: str = Field(description="Model: local path, hub id, zoo:NAME, or openai:MODEL@URL (an OpenAI-compatible "
                                   "server).", json_schema_extra={"short": "-m"})
    data: str = data_field(..., description="QA JSONL: HotpotQA (IRCoT or raw), FlashRAG/NQ, or "
                                            "{question, answer[s], decomposition?}.")
    index: str = Field(description="Index directory from `rag deeprag index`, or 'contexts' (BM25 over each "
                                   "question's own paragraphs).")
    top_k: int = Field(3, ge=1, description="Passages per retrieval.")
    instruction: str = INSTRUCTION  # the training / inference prompt the trajectories and pairs are written under
    few_shot: str = ""
    max_new_tokens: int = Field(32, ge=1)
    batch_size: int = Field(8, ge=1)
    limit: Optional[int] = Field(None, ge=1, description="Use only the first N questions.")


class SynthConfig(QAConfig):
    """`rag deeprag synth`: stage-I data by binary-tree search (paper §3.2, official sragsamplev2.py; top-3 passages,
    depth 6 on HotpotQA) and stage-II calibration pairs (official make_pair.py).

    Paper defaults: the model writes every sub-question under the few-shot decomposition prompt
    (`decompose=model`), answers it in-chain with the history so far (`parametric=chain`) or from retrieved
    passages under the "[No related Info]" reader instruction (`reader_prompt`), and writes the final answer; the
    path with the fewest retrievals that reaches the gold answer is kept (`policy=tree`); each of its decisions gives
    one pair, the atomic decision taken (search / answer) over the opposite one (`pairs=decision`).
    Ablations and extensions (not the paper): `decompose=gold` (the data's gold sub-questions; `auto` = gold when
    present), `parametric=standalone` (a context-free "Question/Answer" prompt), `parametric_check=evidence` (ours:
    prune a parametric answer that contradicts the model's reading of the retrieved passages), `pairs=answer`
    (ours: the parametric side of a pair carries its answer). `policy=always|never` keeps only the retrieve
    (resp. parametric) child at every node: the training data of the always-retrieve and no-retrieval baselines."""

    max_depth: int = Field(6, ge=1, description="Most sub-questions per path.")
    max_expansions: int = Field(64, ge=1)  # tree nodes expanded per question before giving up
    decompose: Literal["model", "gold", "auto"] = Field(
        "model", description="model (the paper: the model writes them under the few-shot decomposition prompt) | "
                             "gold (ablation: the data's `decomposition`) | auto (gold when present).")
    decompose_instruction: str = DECOMPOSE_INSTRUCTION  # the synthesis prompt (official question_decompose.txt)
    decompose_few_shot: str = ""  # worked examples after the decomposition instruction
    parametric: Literal["chain", "standalone"] = "chain"
    parametric_check: Literal["none", "evidence"] = "none"
    policy: Literal["tree", "always", "never"] = "tree"
    pairs: Literal["decision", "answer"] = "decision"
    parametric_prompt: str = STANDALONE_PARAMETRIC_PROMPT  # {subquery}; only with parametric=standalone
    reader_prompt: str = READER_PROMPT  # {context} {subquery}; the model may answer "[No related Info]"


class TrainConfig(BaseConfig):
    """`rag deeprag train`. Paper defaults (LLaMA-Factory, 7-8B models): stage I lr 1e-5, 1 epoch, cosine, warmup
    0.1; stage II DPO β=0.4, lr 5e-7, 8 epochs. Small models trained here need far larger rates: set them."""

    model: str = model_field()
    data: str = data_field(..., description="A `rag deeprag synth` output directory.")  # trajectories/pairs.jsonl
    stages: list[Literal["sft", "dpo"]] = ["sft", "dpo"]
    sft_epochs: float = Field(1.0, gt=0, description="Stage I epochs.")
    sft_lr: float = Field(1e-5, gt=0)
    dpo_epochs: float = Field(8.0, gt=0, description="Stage II epochs.")
    dpo_lr: float = Field(5e-7, gt=0)
    dpo_beta: float = Field(0.4, gt=0)
    batch_size: int = Field(4, ge=1)
    max_length: int = Field(1024, ge=16)
    warmup_ratio: float = Field(0.1, ge=0, lt=1)


class RunConfig(QAConfig):
    """`rag deeprag run`: inference (official sragsftv2.py: temperature 0, top-3 passages, max 6 steps on HotpotQA)
    for DeepRAG and the baselines, with EM/F1 and retrievals per question."""

    methods: list[Method] = Field(["deeprag"], description="Comma list of deeprag, always, never, single.")
    max_steps: int = Field(6, ge=1, description="Most sub-questions per answer.")
    passage_words: Optional[int] = Field(None, ge=1)  # cut each retrieved passage to its first N words
    dataset_name: Optional[str] = None  # the name in results.json rows; default: the data file's stem

    @field_validator("methods", mode="before")
    @classmethod
    def _comma_separated(cls, value):
        """`--methods deeprag,always` (one flag or several) and `--set methods=deeprag,always` arrive as text."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            return [part.strip() for item in value for part in (item.split(",") if isinstance(item, str) else [item])
                    if not isinstance(part, str) or part.strip()]
        return value
