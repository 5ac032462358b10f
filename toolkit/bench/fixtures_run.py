"""run() for `iclrkit bench fixtures`: write the synthetic data sets into --out."""

from __future__ import annotations

from toolkit.bench.config import FixturesConfig


def run_fixtures(config: FixturesConfig, ctx) -> dict:
    from toolkit.bench import fixtures

    written = {}
    if config.which in ("all", "videomathqa"):
        written["videomathqa"] = fixtures.write_videomathqa(ctx.out / "videomathqa").name
    if config.which in ("all", "mmsearch"):
        rows, corpus = fixtures.write_mmsearch(ctx.out / "mmsearch")
        written["mmsearch"] = rows.name
        written["mmsearch_corpus"] = str(corpus.relative_to(ctx.out))
    ctx.metrics.update({"written": written, "videomathqa_questions": len(fixtures.VIDEOMATHQA_ITEMS),
                        "mmsearch_tasks": len(fixtures.MMSEARCH_TASKS)})
    return written
