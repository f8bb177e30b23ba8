"""The three kinds of target against the protocols code is typed with (eaglewire.target.protocol): a loaded
target is every one, its weights read by name build a draft (TargetTensors), and a boundaries dump's stand-in
is a TargetInfo only, so a function typed for more states that it needs a target that loads."""

from __future__ import annotations

import inspect
from typing import Protocol

import torch
from tiny import build_model, build_target

from eaglewire.capture.boundaries import sample_target
from eaglewire.capture.boundary_file import DumpTarget, loaded, save_boundaries
from eaglewire.target.protocol import RunnableTarget, TargetInfo, TargetTensors
from eaglewire.target.weights import load_target_weights


def _members(proto: type) -> set[str]:
    """The names a protocol asks for (its own and its bases'), methods, properties and attributes."""
    out: set[str] = set()
    for cls in proto.__mro__:
        if cls in (object, Protocol) or not getattr(cls, "_is_protocol", False):
            continue
        out |= {n for n in [*vars(cls), *getattr(cls, "__annotations__", {})] if not n.startswith("_")}
    return out


def conforms(obj: object, proto: type) -> bool:
    """Every member of `proto` is on `obj`, looked up without running it (isinstance on Python 3.11 runs each
    property, and a tokenizer-less target's pad_id rightly raises)."""

    def has(name: str) -> bool:
        try:
            inspect.getattr_static(obj, name)
        except AttributeError:
            return False
        return True

    return all(has(n) for n in _members(proto))


def test_the_member_check_sees_a_missing_member():
    assert {"pad_id", "model", "head_rows", "layer_parameters", "identity"} <= _members(RunnableTarget)
    assert "model" not in _members(TargetTensors) and "text_config" not in _members(TargetInfo)

    class Half:
        name = "half"

    assert not conforms(Half(), TargetInfo)


def test_a_loaded_target_is_every_protocol():
    target = build_target("llama")
    assert conforms(target, RunnableTarget) and conforms(target, TargetTensors) and conforms(target, TargetInfo)
    assert loaded(target)


def test_weights_read_by_name_build_a_draft(tmp_path):
    build_model("qwen3").save_pretrained(tmp_path / "q3")
    weights = load_target_weights(str(tmp_path / "q3"), with_tokenizer=False)
    assert conforms(weights, TargetTensors) and isinstance(weights, TargetTensors)
    assert weights.head_rows(torch.tensor([0, 3])).shape == (2, weights.hidden_size)


def test_the_dump_stand_in_is_a_target_info_only(tmp_path):
    target = build_target("llama")
    bounds = sample_target(target, [torch.arange(1, 9)], new_tokens=0, score_prompt=True)
    path = save_boundaries(
        bounds, tmp_path / "b.safetensors", target.identity, chat_template_sha256=target.chat_template_sha256
    )
    stand_in = DumpTarget.from_file(path)
    assert conforms(stand_in, TargetInfo) and stand_in.identity == target.identity
    assert not conforms(stand_in, TargetTensors) and not conforms(stand_in, RunnableTarget)
    assert not loaded(stand_in) and not loaded(None)
