#!/bin/bash
# Verifier for this task. Run by rl.agent.verifier AFTER the agent finishes, from a
# read-only copy of tests/; T1_* variables are set by the verifier, never by the agent.
cd "$T1_WORKSPACE" || exit 2
pytest -q -p no:cacheprovider --confcutdir="$T1_TESTS_DIR" --rootdir="$T1_TESTS_DIR" \
  --ctrf "$T1_CTRF_PATH" "$T1_TESTS_DIR"
