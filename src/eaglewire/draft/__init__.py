"""The EAGLE-3 draft model and its configuration.

config.py   DraftConfig derived from the target and the wiring contract
model.py    Eagle3Draft (its `contract` is set when loaded)
dflash.py   DFlashDraft, the block drafter (z-lab's layout), its context cache and builder
dflash_contract.py  a DFlash draft's contract: its block wiring, mask token and default taps
load.py     the one strict loader, shared by the native checkpoint and every import
unroll.py   the draft unrolled k steps (shift_left, the TTT mask): training and the doctor share it
"""
