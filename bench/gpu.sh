#!/usr/bin/env bash
# The GPU check (issue 15): on a CUDA machine, set up as `make test` does, run the tests that run on CUDA
# (`pytest -m cuda`), time bench/step.py's GPU rows on the device against torch's fused AdamW, one run per row,
# and write a Markdown table (achieved memory bandwidth over the device's copy bandwidth) to OUT.md.
# Every part has a time budget (seconds), so the whole check ends in under 8 minutes; a row that fails or runs
# out of time becomes a note under the table, and the script goes on.
#
#   bench/gpu.sh OUT.md
#
# Settings (environment): DEVICE=cuda SIZE=124m STEPS=10 PATHS=compiled COPY_MB=512
#   ROWS="AdamW AdamW-int8 AdamW-fp8 AdamW-bf16 Lion Muon Ranger21", TEST_SECONDS=120 ROW_SECONDS=45, TESTS="-m cuda" (pytest's arguments),
#   PYTHON (default: .venv/bin/python, after `make .venv/.installed` installs what the Makefile installs).
set -euo pipefail

out=${1:?usage: bench/gpu.sh OUT.md}
cd "$(dirname "$0")/.."
DEVICE=${DEVICE:-cuda} SIZE=${SIZE:-124m} STEPS=${STEPS:-10} PATHS=${PATHS:-compiled} COPY_MB=${COPY_MB:-512}
ROWS=${ROWS:-AdamW AdamW-int8 AdamW-fp8 AdamW-bf16 Lion Muon Ranger21}
TEST_SECONDS=${TEST_SECONDS:-120} ROW_SECONDS=${ROW_SECONDS:-45} TESTS=${TESTS:--m cuda}
if [[ -z ${PYTHON:-} ]]; then
  make .venv/.installed
  PYTHON=.venv/bin/python
fi
if [[ $DEVICE != cpu ]] && ! "$PYTHON" -c "import sys, torch; sys.exit(not getattr(torch, '$DEVICE').is_available())"; then
  echo "bench/gpu.sh: torch sees no $DEVICE device (DEVICE=$DEVICE)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# the outcome of a part: its summary line, or why it has none
outcome() {  # outcome STATUS SECONDS LOG
  if [[ $1 == 124 ]]; then echo "ran out of its $2 s"; else tail -n 1 "$3" | sed 's/=//g; s/^ *//; s/ *$//'; fi
}

echo "bench/gpu.sh: tests ($TEST_SECONDS s)" >&2
status=0
# shellcheck disable=SC2086  # TESTS is a list of pytest's arguments
timeout "$TEST_SECONDS" "$PYTHON" -m pytest -q -p no:cacheprovider $TESTS >"$work/tests.log" 2>&1 || status=$?
tests="$(outcome "$status" "$TEST_SECONDS" "$work/tests.log")"
[[ $status == 0 ]] || tests="FAILED (exit $status): $tests"
tests="\`pytest $TESTS\`: $tests"
echo "  $tests" >&2

runs=() notes=()
for row in $ROWS; do
  echo "bench/gpu.sh: $row ($ROW_SECONDS s)" >&2
  status=0
  timeout "$ROW_SECONDS" "$PYTHON" bench/step.py --device "$DEVICE" --size "$SIZE" --steps "$STEPS" --paths "$PATHS" \
    --recipes "$row" --copy-mb "$COPY_MB" --warm-cache --json "$work/$row.json" >"$work/$row.log" 2>&1 || status=$?
  if [[ $status == 0 ]]; then
    runs+=("$work/$row.json")
  else
    notes+=(--note "$row: not measured, $(outcome "$status" "$ROW_SECONDS" "$work/$row.log") (exit $status)")
  fi
done
"$PYTHON" bench/_gpu_table.py --out "$out" --tests "$tests" "${notes[@]}" "${runs[@]}"
echo "bench/gpu.sh: wrote $out" >&2
