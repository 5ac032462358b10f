#!/usr/bin/env bash
# LS-Merge on the merge zoo: writes runs/repro-merge-latent/results.json and prints the table. Three stages, each
# rewriting only its own rows: `mlp` (digits MLPs, ~13 min), `cnn` (digits CNNs, ~5 min), `gpt2` (tiny GPT-2s on
# WikiText-2 vs the embedded text, ~15 min), times on one core of a shared 2-core machine. STAGES="gpt2" bash
# repro.sh runs one stage alone and re-collects results.json from every stage's stored runs.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1  # tiny matmuls run single-threaded: extra threads only spin on a shared CPU
BIN=.venv/bin/iclrkit
R=runs/repro-merge-latent
EX=examples/merge-latent
STAGES=${STAGES:-mlp cnn gpt2}
mkdir -p "$R/merges"
Q="-q --threads 1"

merge_pair () {  # pair-name model-A model-B same-size(yes|no) [projected-average dir name|no]; uses $Z and $VAE
  local P=$R/merges/$1 A=$Z/$2 B=$Z/$3 ALIGNED=${5:-unit-matched_average}
  rm -rf "$P"  # no stale rows from earlier runs
  mkdir -p "$P"
  if [ "$4" = yes ]; then
    $BIN $Q merge average -m $A,$B -o $P/average --overwrite > /dev/null
  else
    $BIN $Q merge padded -m $A,$B --target $B -o $P/padded_average --overwrite > /dev/null
  fi
  if [ "$ALIGNED" != no ]; then  # the dimensionality-matching projection alone, averaged in weight space
    $BIN $Q merge padded -m $A,$B --target $B --align -o $P/$ALIGNED --overwrite > /dev/null
  fi
  # latent = the shipped default (reconstruction-residual corrected); latent_pure = the paper's decode alone
  $BIN $Q merge latent run --vae $VAE -m $A,$B -o $P/latent --overwrite > /dev/null
  $BIN $Q merge latent run --vae $VAE -m $A,$B --no-residual -o $P/latent_pure --overwrite > /dev/null
  $BIN $Q merge latent run --vae $VAE -m $A,$B --code full -o $P/latent_full_code --overwrite > /dev/null
  $BIN $Q merge latent run --vae $VAE -m $A,$B --code full --no-residual -o $P/latent_pure_full_code \
    --overwrite > /dev/null
  $BIN $Q merge latent run --vae $VAE -m $A,$B --interpolation slerp -o $P/latent_slerp --overwrite > /dev/null
  # parent A alone through the VAE (pure decode): what the VAE's reconstruction alone does
  $BIN $Q merge latent run --vae $VAE -m $A,$B --weights 1,0 --no-residual -o $P/latent_pure_lambda0_control \
    --overwrite > /dev/null
}

base_merges () {  # pair-name model-A model-B backbone: task arithmetic and TIES (they need the common base)
  local P=$R/merges/$1
  $BIN $Q merge task-arithmetic -m $Z/$2,$Z/$3 --base $Z/$4 -o $P/task_arithmetic --overwrite > /dev/null
  $BIN $Q merge ties -m $Z/$2,$Z/$3 --base $Z/$4 -o $P/ties --overwrite > /dev/null
}

if [[ " $STAGES " == *" mlp "* ]]; then
  $BIN $Q merge zoo --config $EX/zoo.yaml -o $R/zoo --overwrite > /dev/null
  Z=$R/zoo/models VAE=$R/vae
  $BIN $Q merge latent train -m $Z --target $Z/w64-s0-5to9 --config $EX/vae.yaml -o $VAE --overwrite > /dev/null
  merge_pair shared-init-64+64 w64-s0-0to4 w64-s0-5to9 yes
  merge_pair independent-init-64+64 w64-s1-0to4 w64-s0-5to9 yes
  merge_pair mixed-width-32+64 w32-s2-0to4 w64-s0-5to9 no
  base_merges shared-init-64+64 w64-s0-0to4 w64-s0-5to9 w64-s0-backbone
fi

if [[ " $STAGES " == *" cnn "* ]]; then  # CNNs of widths 8 and 4; output channels weight-matched to the target
  $BIN $Q merge zoo --config $EX/cnn-zoo.yaml -o $R/cnn-zoo --overwrite > /dev/null
  Z=$R/cnn-zoo/models VAE=$R/cnn-vae
  $BIN $Q merge latent train -m $Z --target $Z/c8-s0-5to9 --config $EX/vae.yaml --stage1-steps 1500 \
    --stage2-steps 1000 -o $VAE --overwrite > /dev/null
  merge_pair cnn-shared-init-8+8 c8-s0-0to4 c8-s0-5to9 yes
  merge_pair cnn-independent-init-8+8 c8-s1-0to4 c8-s0-5to9 yes
  merge_pair cnn-mixed-width-4+8 c4-s2-0to4 c8-s0-5to9 no
  base_merges cnn-shared-init-8+8 c8-s0-0to4 c8-s0-5to9 c8-s0-backbone
fi

if [[ " $STAGES " == *" gpt2 "* ]]; then  # GPT-2 widths 64 and 128; the narrow one widened by unit duplication
  $BIN $Q merge lm-zoo --config $EX/gpt2-zoo.yaml -o $R/gpt2-zoo --overwrite > /dev/null
  Z=$R/gpt2-zoo/models VAE=$R/gpt2-vae
  $BIN $Q merge latent train -m $Z --target $Z/g128-s1-embedded --config $EX/vae.yaml --stage1-steps 1500 \
    --stage2-steps 1000 -o $VAE --overwrite > /dev/null
  merge_pair gpt2-shared-init-128+128 g128-s1-wikitext2 g128-s1-embedded yes no
  merge_pair gpt2-mixed-width-64+128 g64-s0-wikitext2 g128-s1-embedded no widened_average
  base_merges gpt2-shared-init-128+128 g128-s1-wikitext2 g128-s1-embedded g128-s1-backbone
fi

.venv/bin/python $EX/collect.py $R
