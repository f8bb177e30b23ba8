#!/bin/sh
# Rewrites docs/doctor-examples.json: every finding the doctor's tests really produce on the broken drafts they
# build (tests/conftest.py records them), the findings catalogue's rendered examples. Run from the repo root
# after changing a finding's text; tests/test_docs.py fails while a finding has no recorded example.
set -e
rm -f docs/doctor-examples.json  # afresh: a finding whose text changed leaves no stale example behind
EAGLEWIRE_RECORD_FINDINGS="$PWD/docs/doctor-examples.json" OMP_NUM_THREADS=1 python -m pytest -q -p no:randomly \
  tests/doctor/test_checks.py tests/doctor/test_measured_wiring.py tests/doctor/test_measured_wiring_dump.py tests/test_damaged_files.py \
  tests/doctor/test_block_checks.py tests/doctor/test_measured_block.py tests/doctor/test_gguf_findings.py \
  tests/doctor/test_gguf_doctor_ours.py "$@"
