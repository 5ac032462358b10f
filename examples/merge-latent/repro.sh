#!/usr/bin/env bash
# LS-Merge on the digits merge zoo: writes runs/repro-merge-latent/results.json and prints the table (~15 min on
# one core of a shared 2-core machine; tiny matmuls run single-threaded because extra threads only spin there).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
BIN=.venv/bin/iclrkit
R=runs/repro-merge-latent
EX=examples/merge-latent
rm -rf "$R/merges"  # no stale rows from earlier runs
mkdir -p "$R/merges"
Q="-q"

$BIN $Q merge zoo --config $EX/zoo.yaml -o $R/zoo --overwrite > /dev/null
Z=$R/zoo/models
$BIN $Q merge latent train -m $Z --target $Z/w64-s0-5to9 --config $EX/vae.yaml -o $R/vae --overwrite > /dev/null

merge_pair () {  # pair-name model-A model-B same-size(yes|no) [unit-matching(yes|no)]; uses $Z and $VAE
  local P=$R/merges/$1 A=$Z/$2 B=$Z/$3
  mkdir -p "$P"
  if [ "$4" = yes ]; then
    $BIN $Q merge average -m $A,$B -o $P/average --overwrite > /dev/null
  else
    $BIN $Q merge padded -m $A,$B --target $B -o $P/padded_average --overwrite > /dev/null
  fi
  if [ "${5:-yes}" = yes ]; then
    $BIN $Q merge padded -m $A,$B --target $B --align -o $P/unit-matched_average --overwrite > /dev/null
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

VAE=$R/vae
merge_pair shared-init-64+64 w64-s0-0to4 w64-s0-5to9 yes
merge_pair independent-init-64+64 w64-s1-0to4 w64-s0-5to9 yes
merge_pair mixed-width-32+64 w32-s2-0to4 w64-s0-5to9 no
P=$R/merges/shared-init-64+64
$BIN $Q merge task-arithmetic -m $Z/w64-s0-0to4,$Z/w64-s0-5to9 --base $Z/w64-s0-backbone -o $P/task_arithmetic --overwrite > /dev/null
$BIN $Q merge ties -m $Z/w64-s0-0to4,$Z/w64-s0-5to9 --base $Z/w64-s0-backbone -o $P/ties --overwrite > /dev/null

# CNN family (same width only: the unit-matching projection covers MLP chains), its own VAE
$BIN $Q merge zoo --config $EX/cnn-zoo.yaml -o $R/cnn-zoo --overwrite > /dev/null
Z=$R/cnn-zoo/models VAE=$R/cnn-vae
$BIN $Q merge latent train -m $Z --config $EX/vae.yaml --stage1-steps 1500 --stage2-steps 1000 -o $VAE \
  --overwrite > /dev/null
merge_pair cnn-shared-init-8+8 c8-s0-0to4 c8-s0-5to9 yes no
merge_pair cnn-independent-init-8+8 c8-s1-0to4 c8-s0-5to9 yes no

.venv/bin/python $EX/collect.py $R
