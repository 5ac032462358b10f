#!/usr/bin/env bash
# make repro-mmsearch: see examples/bench/repro.sh (shared by both benchmark harnesses) and examples/bench/RESULTS.md.
exec bash "$(dirname "$0")/../bench/repro.sh" mmsearch
