"""The prompts of DeepRAG's data synthesis (official `ICL-prompt/`, read, not copied; paraphrased and shortened).

- Decomposition (`question_decompose.txt`): the synthesis prompt under which the model writes its own sub-questions
  and answers them in-chain; a few worked examples follow the instruction (`few_shot`).
- Reader (`intermediate_answer.txt`): answers a sub-question from retrieved passages only, with the
  "[No related Info]" rule; a retrieval child whose reader answer is "[No related Info]" is pruned from the tree.
- Inference (`instruction.txt`) is `toolkit.rag.trace.INSTRUCTION`: what the trained model is prompted with.
"""

from __future__ import annotations

NO_INFO = "[No related Info]"

DECOMPOSE_INSTRUCTION = (
    "Decompose the question into simple sub-questions and answer them one by one. Write each sub-question after "
    "\"Follow up:\" and its answer after \"Intermediate answer:\"; end with \"So the final answer is:\".\n"
)

READER_INSTRUCTION = (
    "Answer the question directly and concisely from the context. If the context lacks relevant information, "
    f"respond with {NO_INFO}.\n"
)

READER_PROMPT = READER_INSTRUCTION + "{context}\nQuestion: {subquery}\nAnswer:"  # {context} {subquery}

# The context-free parametric prompt of our earlier synthesis (not the paper: the paper answers in-chain).
STANDALONE_PARAMETRIC_PROMPT = "Question: {subquery}\nAnswer:"
