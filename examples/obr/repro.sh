#!/usr/bin/env bash
# OBR vs baselines at W4A4KV4 (QuaRot rotation, fake-quant activations/KV on CPU), one shared recipe per model.
# Writes runs/repro-obr/results.json {"rows":[{model, setting, method, ppl, size_mb, seconds}]} and prints a table.
# Finished runs are reused (delete runs/repro-obr or set FRESH=1 to recompute). MODELS="llama-small gpt2-small smollm2-135m".
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=runs/repro-obr
DATA=${DATA:-${ICLRKIT_DATA:-../shared/data}/wikitext-2}  # data root: $ICLRKIT_DATA, default ../shared/data
VALID=$DATA/valid.txt; TEST=$DATA/test.txt
MODELS=${MODELS:-"llama-small smollm2-135m"}
[ "${FRESH:-0}" = 1 ] && rm -rf "$OUT"
mkdir -p "$OUT"
CLI=".venv/bin/iclrkit -q"
# On a shared CPU one thread is much faster for GPTQ/SparseGPT column loops (no OpenMP spin under contention).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

run() {  # run DIR COMMAND...: skip when DIR/run.json exists
  local dir=$1; shift
  if [ -f "$dir/run.json" ]; then return; fi
  rm -rf "$dir" "$dir.partial"
  echo "== $dir" >&2
  "$@" --out "$dir" > /dev/null
}

peer() {  # peer DIR MODEL CALIB HELDOUT RECIPE: llm-compressor in its own venv on our exact token ids
  local dir=$1 model=$2 calib=$3 heldout=$4 recipe=$5
  if [ -f "$dir/run.json" ]; then return; fi
  if [ ! -x .venv-bench/bin/python ]; then  # the [bench] extra: llmcompressor pins transformers 5.17
    python3 -m venv .venv-bench && .venv-bench/bin/pip install -q torch==2.13.0 llmcompressor 2>&1 | grep -v "is ignored" || true
  fi
  echo "== $dir" >&2
  .venv/bin/python examples/obr/peer_tokens.py "$model" "$calib" "$heldout" "$NSAMPLES" "$SEQLEN" "$EVAL_WINDOWS" \
    "$OUT/$name-tokens.pt"
  local model_dir
  model_dir=$(.venv/bin/python -c "import torch; print(torch.load('$OUT/$name-tokens.pt')['model_dir'])")
  .venv-bench/bin/python examples/obr/peer_llmcompressor.py "$model_dir" "$OUT/$name-tokens.pt" "$recipe" "$dir" \
    > "$OUT/$name-peer-$recipe.log" 2>&1
}

for name in $MODELS; do
  case $name in
    llama-small)
      # LLAMA_STEPS overrides the recipe's 400 training steps (a shared, overloaded CPU cannot train 400 in time)
      STEPS=${LLAMA_STEPS:+--steps $LLAMA_STEPS}
      $CLI zoo build llama-small --data "$VALID" $STEPS > /dev/null
      key=$(.venv/bin/python -c "from toolkit.zoo.registry import variant_key; print(variant_key('$VALID', ${LLAMA_STEPS:-None}))")
      MODEL="zoo:llama-small@$key"; CAL="--nsamples 32 --seqlen 256"; EVAL_WINDOWS=64
      SETTINGS="w4a4kv4-s50 w4a4kv4-2:4" ;;
    gpt2-small)  # LayerNorm: no rotation; the zoo recipe's own text, held-out 5% split for evaluation
      MODEL="zoo:gpt2-small"; CAL="--nsamples 32 --seqlen 256"; EVAL_WINDOWS=64
      .venv/bin/python -c "
from toolkit.data.text import embedded_text, split_text
train, test = split_text(embedded_text(), test_fraction=0.05, seed=0)
open('$OUT/embedded-train.txt', 'w').write(train); open('$OUT/embedded-heldout.txt', 'w').write(test)"
      SETTINGS="w4a16-s50 w4a4kv4-s50" ;;
    smollm2-135m)  # the real model; weight-only settings carry the llm-compressor peer rows
      MODEL="zoo:smollm2-135m"; NSAMPLES=${SMOL_NSAMPLES:-64}; SEQLEN=${SMOL_SEQLEN:-512}; EVAL_WINDOWS=32
      CAL="--nsamples $NSAMPLES --seqlen $SEQLEN"
      SETTINGS=${SMOL_SETTINGS:-"w4a16-s50 w4a4kv4-s50 w4a16"} ;;
  esac
  CALIB=$VALID; HELDOUT=$TEST
  [ "$name" = gpt2-small ] && CALIB=$OUT/embedded-train.txt && HELDOUT=$OUT/embedded-heldout.txt
  EVAL="--eval-data $HELDOUT --set eval_max_length=256 --set eval_windows=$EVAL_WINDOWS"
  COMMON="--model $MODEL --data $CALIB $CAL $EVAL --set export=packed"
  run "$OUT/$name/dense" $CLI eval ppl --model "$MODEL" --data "$HELDOUT" --max-length 256 --max-windows "$EVAL_WINDOWS"
  [ -f "$OUT/$name/w4a16/nf4-bnb/run.json" ] || .venv/bin/python examples/obr/nf4.py "$MODEL" "$HELDOUT" 256 \
    "$EVAL_WINDOWS" "$OUT/$name/w4a16/nf4-bnb" 2> /dev/null
  for setting in $SETTINGS; do
    METHODS="obr-gptq sparsegpt-gptq sparsegpt-two-stage wanda-rtn rtn-magnitude obr-rtn"
    case $setting in
      w4a4kv4-s50) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--sparsity 0.5" ;;
      w4a4kv4-2:4) Q="--w-bits 4 --a-bits 4 --kv-bits 4"; S="--nm 2:4" ;;
      w4a16-s50) Q="--w-bits 4 --a-bits 16 --kv-bits 16"; S="--sparsity 0.5"
        [ "$name" = smollm2-135m ] && METHODS="obr-gptq llmcompressor-sparsegpt+gptq sparsegpt-gptq sparsegpt-two-stage" ;;
      w4a16) Q="--w-bits 4 --a-bits 16 --kv-bits 16"; S=""; METHODS="gptq llmcompressor-gptq" ;;
    esac
    # ONLY_METHODS="obr-gptq sparsegpt-two-stage ..." keeps just those of the setting's methods (a partial run)
    if [ -n "${ONLY_METHODS:-}" ]; then
      METHODS=$(for m in $METHODS; do [[ " $ONLY_METHODS " == *" $m "* ]] && printf '%s ' "$m"; done; true)
    fi
    dir="$OUT/$name/${setting/:/-}"
    # SmolLM2 W4A4KV4 has no peer row: a smaller calibration (16 x 256) keeps its five runs within the budget
    SETTING_COMMON=$COMMON
    [ "$name" = smollm2-135m ] && [ "$setting" = w4a4kv4-s50 ] && \
      SETTING_COMMON="--model $MODEL --data $CALIB ${SMOL_A4_CAL:---nsamples 16 --seqlen 256} $EVAL --set export=packed"
    for method in $METHODS; do
      case $method in
        rtn-magnitude) run "$dir/$method" $CLI compress rtn $SETTING_COMMON $Q $S ;;
        wanda-rtn) run "$dir/$method" $CLI compress wanda $SETTING_COMMON $Q $S ;;
        sparsegpt-gptq) run "$dir/$method" $CLI compress sparsegpt $SETTING_COMMON $Q $S ;;  # joint, one pass
        sparsegpt-two-stage) run "$dir/$method" $CLI compress sparsegpt-gptq $SETTING_COMMON $Q $S ;;
        gptq) run "$dir/$method" $CLI compress gptq $SETTING_COMMON $Q $S ;;
        obr-rtn) run "$dir/$method" $CLI compress obr $SETTING_COMMON $Q $S --mode rtn ;;
        obr-gptq) run "$dir/$method" $CLI compress obr $SETTING_COMMON $Q $S --mode gptq ;;
        llmcompressor-*) peer "$dir/$method" "$MODEL" "$CALIB" "$HELDOUT" "${method#llmcompressor-}" ;;
      esac
    done
  done
done

# Served-model checks (issue 26) for the SmolLM2 W4A16-s50 setting: compressed-tensors reload, llama.cpp agreement
# (needs .venv-llamacpp: python3 -m venv .venv-llamacpp && .venv-llamacpp/bin/pip install llama-cpp-python) and
# lm-eval zero-shot columns; SERVE_CHECK=0 skips them. collect.py merges serve_check.json into results.json.
if [ "${SERVE_CHECK:-1}" = 1 ] && [ -d "$OUT/smollm2-135m/w4a16-s50" ]; then
  if [ ! -x .venv-llamacpp/bin/python ]; then
    python3 -m venv .venv-llamacpp && .venv-llamacpp/bin/pip install -q llama-cpp-python 2>&1 | grep -v "is ignored" || true
  fi
  .venv/bin/python examples/obr/serve_check.py --out "$OUT" --setting smollm2-135m/w4a16-s50 --limit 300
fi
.venv/bin/python examples/obr/collect.py "$OUT"
