"""Hook capture equals HF output_hidden_states bit for bit, on every supported architecture."""

import pytest
import torch
from tiny import ARCHS, LAYERS, VOCAB, build_target

from eaglewire.contract import to_engine
from eaglewire.capture.hooks import capture, forward_kwargs, load_capture, save_capture
from eaglewire.errors import ContractMismatch, TargetError
from eaglewire.target.loader import find_decoder_stack, wrap_model

ALL_BOUNDARIES = tuple(range(LAYERS + 1))  # 0 (embedding) .. L (pre-norm last layer output)


def _ids(b=2, t=9, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, t), generator=g)


@pytest.mark.parametrize("arch", ARCHS)
def test_capture_equals_hf_hidden_states(arch):
    target = build_target(arch)
    ids = _ids()
    mask = torch.ones_like(ids)
    mask[1, -3:] = 0  # right padding on one row
    cap = capture(target, ALL_BOUNDARIES, ids, mask, logits=True)
    H = target.hidden_size
    assert cap.taps.shape == (2, 9, len(ALL_BOUNDARIES) * H)
    with torch.no_grad():
        ref = target.model(**forward_kwargs(target, ids, mask, logits=True), output_hidden_states=True)
    hs = ref.hidden_states
    assert len(hs) == LAYERS + 1
    chunks = cap.taps.split(H, dim=-1)
    hf_index = to_engine(ALL_BOUNDARIES[:-1], "hf", LAYERS)  # the translation under test
    for b, i in zip(ALL_BOUNDARIES[:-1], hf_index):
        assert torch.equal(chunks[b], hs[i]), f"{arch}: boundary {b} != hidden_states[{i}]"
    # b = L is the residual BEFORE the final norm; HF's last entry is AFTER it.
    last = chunks[LAYERS]
    assert not torch.allclose(last, hs[LAYERS])
    assert torch.equal(target.final_norm(last), hs[LAYERS])
    assert torch.equal(cap.final_hidden, hs[LAYERS])
    assert torch.equal(cap.logits, ref.logits)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_capture_concatenates_in_contract_order_and_subsets(arch):
    target = build_target(arch)
    ids = _ids(b=1)
    full = capture(target, ALL_BOUNDARIES, ids).taps.split(target.hidden_size, dim=-1)
    sub = capture(target, (1, 3), ids).taps
    assert torch.equal(sub, torch.cat([full[1], full[3]], dim=-1))


def test_left_and_right_padding_give_unpadded_states():
    target = build_target("llama")
    ids = _ids(b=1, t=6)
    alone = capture(target, (1, 2, 4), ids).taps[0]
    pad = torch.zeros(1, 3, dtype=torch.long)
    right = capture(target, (1, 2, 4), torch.cat([ids, pad], 1), torch.tensor([[1] * 6 + [0] * 3])).taps[0, :6]
    left = capture(target, (1, 2, 4), torch.cat([pad, ids], 1), torch.tensor([[0] * 3 + [1] * 6])).taps[0, 3:]
    torch.testing.assert_close(right, alone, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(left, alone, atol=1e-5, rtol=1e-5)


def test_nested_wrapper_found_automatically():
    target = build_target("nested_kimi_like")
    assert target.layers_path == "language_model.model.layers"  # not the equally long vision_tower
    assert target.identity.architecture == "KimiLikeForConditionalGeneration"


def test_unlocatable_decoder_layers_raise_with_what_was_looked_for():
    model = build_target("llama").model
    model.model.layers = torch.nn.ModuleList(list(model.model.layers)[:2])  # no longer num_hidden_layers long
    with pytest.raises(TargetError, match="ModuleList of 4 identical decoder layers") as err:
        find_decoder_stack(model)
    assert "0 candidates" in str(err.value)


def test_capture_dump_round_trip_and_refusal(tmp_path):
    target = build_target("llama")
    ids = _ids(b=1)
    contract = target.contract((1, 2, 3))
    cap = capture(target, contract.taps, ids)
    save_capture(tmp_path / "c.safetensors", cap, contract, ids)
    tensors, found = load_capture(tmp_path / "c.safetensors", expected=contract)
    assert found == contract and torch.equal(tensors["taps"], cap.taps)
    other = target.contract((1, 2, 4))
    with pytest.raises(ContractMismatch, match="taps"):
        load_capture(tmp_path / "c.safetensors", expected=other)


def test_wrap_model_requires_text_decoder():
    class NotAModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = build_target("llama").model.config
            self.blocks = torch.nn.ModuleList(torch.nn.Linear(2, 2) for _ in range(4))

    with pytest.raises(TargetError, match="cannot locate the decoder layers"):
        wrap_model(NotAModel(), "x")
