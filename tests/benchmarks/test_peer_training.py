"""benchmarks/peer_training/peer_training.py's equal-data invariant: the batches it hands the peer trainer are
exactly the ones eaglewire's trainer takes, step by step, for the same samples, batch size and seed."""

import argparse
from pathlib import Path

import torch

from eaglewire.data.samples import Sample
from eaglewire.train.dist import DistInfo
from eaglewire.train.loop import MicroBatches, TrainConfig

from benchmarks.peer_training.peer_training import step_batches  # conftest: the root on sys.path


def test_peer_batches_are_the_trainers_own():
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 60, (40,), generator=g).tolist()
    train = [Sample(f"s{i}", torch.arange(n), torch.ones(n, dtype=torch.long)) for i, n in enumerate(lengths)]
    a = argparse.Namespace(batch_size=4)
    steps = 7  # fewer samples than the list holds: both sides must take the first steps x batch of them
    ours = step_batches(train, steps, a)
    stream = MicroBatches(train[: steps * a.batch_size], TrainConfig(max_steps=steps, batch_size=4), DistInfo())
    theirs = [stream.get(i) for i in range(steps)]
    assert [[s.id for s in b] for b in ours] == [[s.id for s in b] for b in theirs]
    seen = [s.id for b in ours for s in b]
    assert sorted(seen) == sorted(s.id for s in train[: steps * 4])  # one pass: every sample once, fresh data


def test_every_eaglewire_arm_is_options_the_trainer_takes():
    """An arm is `eaglewire train` knob options: each flag is a knob's and its value one the option accepts,
    so no arm can silently train with a default it did not name."""
    from pydantic import TypeAdapter

    from eaglewire.norms import NORM_PRESETS
    from eaglewire.train.config import knob_fields
    from benchmarks.peer_training.peer_training import ARM_NORMS, ARMS

    knobs = {"--" + name.replace("_", "-"): annotation for name, (annotation, _) in knob_fields("cli").items()}
    for arm, opts in ARMS.items():
        assert opts[:2] == ["--norms", ARM_NORMS[arm]] and ARM_NORMS[arm] in NORM_PRESETS, arm
        for flag, value in zip(opts[::2], opts[1::2]):
            TypeAdapter(knobs[flag]).validate_strings(value)  # KeyError: no such knob; ValidationError: refused
    assert ARM_NORMS["speculators"] == "speculators"


def test_dflash_arms_train_the_same_draft():
    """--family dflash: eaglewire's options are trainer knobs, and the speculators job asks its trainer for the
    same block, mask token, taps (its numbering: HF indices), depth, all-full attention and anchors per step."""
    from pydantic import TypeAdapter

    from eaglewire.contract import to_engine
    from eaglewire.train.config import knob_fields
    from benchmarks.peer_training.peer_speculators_arm import family_cli
    from benchmarks.peer_training.peer_training import family_options, speculators_job

    taps = (3, 10, 16, 22, 29)
    a = argparse.Namespace(
        family="dflash",
        block_size=8,
        anchors=32,
        batch_size=4,
        ttt=3,
        mask_token_id=16,
        verifier=Path("v"),
        spec_layer_ids=list(to_engine(taps, "vllm", 30)),
    )
    opts = family_options("eaglewire", None, a)
    knobs = {"--" + name.replace("_", "-"): annotation for name, (annotation, _) in knob_fields("cli").items()}
    for flag, value in zip(opts[::2], opts[1::2]):
        TypeAdapter(knobs[flag]).validate_strings(value)
    ours = dict(zip(opts[::2], opts[1::2]))
    job = speculators_job(Path("r"), Path("f"), None, [["s0"]], a)
    theirs = family_cli(job)
    assert job["vocab"] is None and theirs["speculator_type"] == "dflash"
    assert (theirs["block_size"], theirs["num_layers"]) == (int(ours["--block-size"]), int(ours["--num-layers"]))
    assert theirs["mask_token_id"] == 16 and theirs["max_anchors"] == 32 * 4
    assert theirs["full_attention_indices"] == list(range(theirs["num_layers"])) and theirs["sliding_window_non_causal"]
    assert job["target_layer_ids"] == list(taps)  # speculators: HF hidden_states index = boundary
