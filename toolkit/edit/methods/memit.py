"""MEMIT (Meng et al., ICLR 2023): the plain value objective, no extra loss on δ.

Paper: https://arxiv.org/abs/2210.07229 · official code: https://github.com/kmeng01/memit
The pipeline every edit method shares is toolkit/edit/run.py."""

from toolkit.core.registry import register
from toolkit.edit.config import BASE_FLAGS, MemitConfig


@register("edit", "memit", config=MemitConfig, paper="https://arxiv.org/abs/2210.07229", flags=BASE_FLAGS,
          help="MEMIT: closed-form multi-layer insertion of many facts at once.",
          epilog="Examples: iclrkit edit memit -m zoo:smollm2-135m -d zsre_mend_train-1k.json -n 100 -o runs/memit | "
                 "iclrkit edit memit -m ./gpt2 -d facts.jsonl --layers 3,4 --batch-size 100 -o out | "
                 "iclrkit edit memit -m ./gpt2-xl -d knowedit.json --config EasyEdit/hparams/MEMIT/gpt2-xl.yaml "
                 "-o out")
def memit(config: MemitConfig):
    """MEMIT optimises each δ on the target NLL, the essence KL and the weight decay only."""
    return None
