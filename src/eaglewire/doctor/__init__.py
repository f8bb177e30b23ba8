"""eaglewire doctor: find silent wiring failures of a draft before it is deployed.

inspect.py          reads a draft directory without trusting it; the engine's rules are its export/engines.py record
config_types.py     each config number's JSON type, refused by field name before any check reads it
checks.py           the findings (error/warn/info, why, fix): names, heads, contract; CHECKS, every check in order
findings.py         the Finding record and the Report
geometry.py         head counts and every weight's shape against the config
vocab_checks.py     draft_vocab_size, lm_head rows, the d2t offsets and t2d mask (every family with its own head)
tap_checks.py       the boundaries the engine's layer ids deliver against the trained taps; fc's width
norm_checks.py      the trained norm flags against those the engine implements and its config applies
target_checks.py    the draft against the target it is served with: hidden size, rope, context, chat template
weights.py          NaN/Inf, zero norms, a copied lm_head                expect.py    predicted vs measured tau
trained_taps.py     which boundaries a draft was trained on: tap sets scored on the target's boundaries
                    (capture/boundaries.py; paired NLL, bootstrap margin)
measured_wiring.py  that score against what the engine will deliver: the `measured_wiring` finding
measured_block.py   the same for block drafters (DFlash): teacher-forced block NLL, the same rule
block_inspect.py    what the doctor reads of a block drafter (DFlash, DFlash2, DSpark): family, layout, engine rule
block_delivery.py   the boundaries an engine captures from a block drafter's config (or guesses without ids)
block_checks.py     the block drafters' findings: BLOCK_CHECKS, vocabulary and engine path, the BlockReport
block_tap_checks.py the engine's boundaries against the trained taps, missing ids, vLLM's eagle aux ids
block_slot_checks.py how the engine runs the block: RoPE, block size and knobs, mask token, attention, anchor
gguf_inspect.py     what the doctor reads of a GGUF draft: the file, its contract, the target GGUF, the release
gguf_checks.py      a GGUF draft's findings as llama.cpp loads it      gguf_measure.py  its measured wiring
measures.py         each family's measured check, keyed by family: what check and import call
measured_tau.py     our engine's tau under the engine's own knobs (tree shapes), on request
vllm_dump.py        what real vLLM delivers to an export (capture/identify.py names each state)
counters.py         a running engine's speculative counters, one reader per engine format, and their deltas
live.py, watch.py   `doctor live` (a running engine against our prediction) and `doctor watch` (the alarm)
live_positions.py   where a running engine loses acceptance: conditional acceptance per draft position
"""
