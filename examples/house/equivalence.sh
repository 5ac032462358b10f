#!/usr/bin/env bash
# Same commands, tiny inputs, two trees: are the outputs bit-identical? (issue #28: "behaviour and figures unchanged")
#
#   examples/house/equivalence.sh BEFORE_TREE AFTER_TREE [WORK_DIR]
#
# Each tree is a checkout (e.g. `git worktree add /work/before 703be14`) with .venv (a link to a built venv will do)
# and the compiled toolkit/_C*.so. Commands run as `PYTHONPATH=TREE TREE/.venv/bin/python -m cli.main ...` from
# inside the tree, one at a time, on the CPU, one thread, each with a private ICLRKIT_ZOO_DIR / ICLRKIT_CACHE_DIR /
# HF_HOME under WORK_DIR (nothing read from or written to ~/.cache; the edit covariance cache is per run, so the
# second tree cannot reuse the first's). Inputs are written once by make_inputs.py (no iclrkit code) and shared.
# ONLY="case case ..." runs a subset; ROWS=FILE writes the table rows there (default: results.json beside this script). A flag one tree lacks is spelled per tree (see KVQ below). compare_runs.py prints the table; exit 1 if any differs.
set -u
BEFORE=$(cd "$1" && pwd); AFTER=$(cd "$2" && pwd); WORK=${3:-/tmp/iclrkit-equivalence}
HERE=$(cd "$(dirname "$0")" && pwd)
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
rm -rf "$WORK/runs" "$WORK/private"; mkdir -p "$WORK"
[ -f "$WORK/inputs/pairs.jsonl" ] || nice -n 10 "$AFTER/.venv/bin/python" "$HERE/make_inputs.py" "$WORK/inputs" 2>/dev/null
IN=$WORK/inputs

cli() {  # cli TREE ARGS...: the tree's own code, checked
  (cd "$1" && PYTHONPATH="$1" nice -n 10 "$1/.venv/bin/python" -m cli.main "${@:2}")
}
has_flag() {  # has_flag TREE FLAG SUBCOMMAND...
  cli "$1" "${@:3}" --help 2>/dev/null | grep -q -- "$2"
}

SMALL="--nsamples 4 --seqlen 32 --set eval_windows=2 --set eval_max_length=32 --dtype float32"
LM="-m $IN/llama -d $IN/text.txt --eval-data $IN/text.txt"
EDIT="-m $IN/gpt2 -d $IN/facts.jsonl --batch-size 2 --steps 4 --set cov_tokens=512 --set cov_seqlen=32
      --set context_prefixes=1 --set prefix_tokens=3 --set fluency_samples=1 --set fluency_tokens=5"
UNL="-m $IN/gpt2 -f $IN/forget.json -r $IN/retain.jsonl --max-length 24 --epochs 1 --batch-size 2 --lr 1e-3
     --max-steps 3"
FT="$IN/llama-ft1,$IN/llama-ft2"
# name | arguments (KVQ: the tree's spelling of the pre-#27 KV quantizer, empty where the flag does not exist)
CASES=(
  "compress-gptq|compress gptq $LM $SMALL --no-rotate --a-bits 16 --kv-bits 16"
  "compress-obr|compress obr $LM $SMALL --no-rotate --a-bits 16 --kv-bits 16"
  "compress-rtn|compress rtn $LM $SMALL --no-rotate --a-bits 16 --kv-bits 16"
  "compress-rtn-a8kv8|compress rtn $LM $SMALL --no-rotate --a-bits 8 --kv-bits 8 KVQ"
  "compress-obr-rotated|compress obr $LM $SMALL --rotate --a-bits 16 --kv-bits 16"
  "edit-memit|edit memit $EDIT"
  "edit-eamet|edit eamet $EDIT"
  "unlearn-prism|unlearn prism $UNL --probe-layer 1 --set probe_epochs=2"
  "unlearn-npo|unlearn npo $UNL"
  "unlearn-ga|unlearn ga $UNL"
  "merge-average|merge average -m $FT"
  "merge-task-arithmetic|merge task-arithmetic -m $FT --base $IN/llama --scaling 0.5"
  "merge-ties|merge ties -m $FT --base $IN/llama --density 0.5"
  "steer-pcms|steer pcms -m $IN/llama -d $IN/pairs.jsonl --layer 1"
  "eval-ppl|eval ppl -m $IN/llama -d $IN/text.txt --max-length 32 --max-windows 4"
  "segment-mbunet-train|segment mbunet train --data procedural --variant masked --set n_images=10 --size 32
   --width 8 --set depth=2 --steps 6 --set probe_images=2 --set batch_size=4"
  # added for issue 43 (every room's plug-in point): the other registered methods of the rooms it touched
  "compress-magnitude|compress magnitude $LM $SMALL --no-rotate --a-bits 16 --kv-bits 16 --w-bits 4"
  "compress-wanda|compress wanda $LM $SMALL --no-rotate --a-bits 16 --kv-bits 16"
  "compress-sparsegpt|compress sparsegpt $LM $SMALL --no-rotate --a-bits 16 --kv-bits 16"
  "unlearn-rmu|unlearn rmu $UNL --layer 1"
  "steer-ums|steer ums -m $IN/llama -d $IN/pairs.jsonl --layer 1"
  "steer-ilcs|steer ilcs -m $IN/llama -d $IN/pairs.jsonl --layer 1"
  "merge-padded|merge padded -m $FT --target $IN/llama"
  "merge-ties-mergekit-yaml|merge mergekit $IN/ties.yml"
  "explain-fame|explain fame -m zoo:digits-mlp -n 2 --epsilon 0.02"
  "explain-verix|explain verix -m zoo:digits-mlp -n 2 --epsilon 0.02"
)
# the mergekit YAML case reads this file (both trees the same)
[ -f "$IN/ties.yml" ] || printf 'merge_method: ties\nbase_model: %s\nmodels:\n  - model: %s\n    parameters: {weight: 1.0, density: 0.4}\n  - model: %s\n    parameters: {weight: 0.5, density: 0.6}\nparameters: {lambda: 0.9}\n' \
  "$IN/llama" "$IN/llama-ft1" "$IN/llama-ft2" > "$IN/ties.yml"

for tree in "$BEFORE" "$AFTER"; do
  label=$([ "$tree" = "$BEFORE" ] && echo before || echo after)
  runs=$WORK/runs/$label; mkdir -p "$runs"
  imported=$(cd "$tree" && PYTHONPATH="$tree" "$tree/.venv/bin/python" -c "import toolkit, cli; print(toolkit.__file__)")
  [ "$imported" = "$tree/toolkit/__init__.py" ] || { echo "$label imports $imported, not $tree" >&2; exit 2; }
  echo "$label: $tree at $(git -C "$tree" rev-parse --short HEAD) (toolkit from $imported)" >&2
  kvq=""; has_flag "$tree" --kv-quant compress rtn && kvq="--kv-quant head-asym"
  for case in "${CASES[@]}"; do
    name=${case%%|*}; args=${case#*|}; args=${args//KVQ/$kvq}
    [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && continue
    priv=$WORK/private/$label/$name; mkdir -p "$priv"
    # shellcheck disable=SC2086  # word splitting of the argument string is intended
    set -- $args --device cpu --seed 0 -o "$runs/$name"
    echo "$*" > "$runs/$name.cmd"; echo "$tree" > "$runs/$name.tree"
    start=$(date +%s)
    ICLRKIT_ZOO_DIR=$priv/zoo ICLRKIT_CACHE_DIR=$priv/cache HF_HOME=$priv/hf cli "$tree" "$@" \
      > "$runs/$name.stdout" 2> "$runs/$name.stderr"
    echo $? > "$runs/$name.rc"
    echo "  $name: exit $(cat "$runs/$name.rc") in $(( $(date +%s) - start )) s" >&2
  done
done
"$AFTER/.venv/bin/python" "$HERE/compare_runs.py" "$WORK/runs/before" "$WORK/runs/after" --json "$WORK/compare.json" \
  --rows "${ROWS:-$HERE/results.json}"
status=$?

# Control for the one intended numeric change (e62a4d9, exact Hadamards): the after tree's rotated OBR with every
# OrthogonalRotation forced back to the pre-e62a4d9 construction ("kron-orthogonal", which also draws its signs for
# the online down_proj rotation) must give the before tree's weights and figures again.
if (cd "$AFTER" && PYTHONPATH="$AFTER" "$AFTER/.venv/bin/python" -c "from toolkit.compress.rotation import KRON") \
   2>/dev/null && { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" compress-obr-rotated "* ]]; }; then
  name=compress-obr-rotated; runs=$WORK/runs/after-kron; priv=$WORK/private/after-kron/$name; mkdir -p "$runs" "$priv"
  cp "$WORK/runs/after/$name.cmd" "$WORK/runs/after/$name.tree" "$runs/"
  # shellcheck disable=SC2046
  set -- $(sed "s#$WORK/runs/after/#$runs/#" "$runs/$name.cmd"); echo "$*" > "$runs/$name.cmd"
  (cd "$AFTER" && ICLRKIT_ZOO_DIR=$priv/zoo ICLRKIT_CACHE_DIR=$priv/cache HF_HOME=$priv/hf PYTHONPATH="$AFTER" \
   nice -n 10 "$AFTER/.venv/bin/python" -c "
import sys
import toolkit.compress.rotation as r
init = r.OrthogonalRotation.__init__
r.OrthogonalRotation.__init__ = lambda self, n, seed, kind='auto', signs=True: init(self, n, seed, r.KRON, signs)
sys.argv = ['iclrkit', *sys.argv[1:]]
from cli.main import main
main()" "$@" > "$runs/$name.stdout" 2> "$runs/$name.stderr"); echo $? > "$runs/$name.rc"
  echo
  echo "Control: before vs after with the kron-orthogonal rotation forced (e62a4d9's construction switched off)"
  echo
  "$AFTER/.venv/bin/python" "$HERE/compare_runs.py" "$WORK/runs/before" "$runs" --only "$name" | sed '/^$/,$d'
fi
exit $status
