"""Loss masks by render boundary: golden files for SmolLM2 (ChatML), Llama-3 and Qwen3 (<think>).

Regenerate goldens with `EAGLEWIRE_UPDATE_GOLDEN=1 python -m pytest tests/data/test_template.py`, then
read the diff: ⟦…⟧ marks the tokens trained on.
"""

import os
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from eaglewire.data.template import TemplateMismatch, render_with_mask
from eaglewire.target.loader import resolve_target

DATA = Path(__file__).parents[1] / "data"
CONV = [
    {"role": "user", "content": "What is 2+2?"},
    {"role": "assistant", "content": "2+2 = 4."},
    {"role": "user", "content": "And 3+3?"},
    {"role": "assistant", "content": "3+3 = 6."},
]


@pytest.fixture(scope="module")
def smol_tok():
    return AutoTokenizer.from_pretrained(resolve_target(None)[1])


@pytest.fixture(scope="module")
def llama3_tok():
    tok = AutoTokenizer.from_pretrained(resolve_target(None)[1])
    tok.add_special_tokens(
        {
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "additional_special_tokens": ["<|start_header_id|>", "<|end_header_id|>"],
        }
    )
    tok.chat_template = (DATA / "templates" / "llama3.jinja").read_text()
    return tok


@pytest.fixture(scope="module")
def qwen3_tok():
    tok = AutoTokenizer.from_pretrained(resolve_target(None)[1])
    tok.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": ["<think>", "</think>"]})
    tok.chat_template = (DATA / "templates" / "qwen3.jinja").read_text()
    return tok


def _marked(tok, rendered) -> str:
    out, inside = [], False
    for tid, m in zip(rendered.input_ids, rendered.loss_mask):
        if m and not inside:
            out.append("⟦")
        if not m and inside:
            out.append("⟧")
        inside = bool(m)
        out.append(tok.decode([tid]))
    return "".join(out) + ("⟧" if inside else "")


def _golden(name: str, text: str) -> None:
    path = DATA / "golden" / f"{name}.txt"
    if os.environ.get("EAGLEWIRE_UPDATE_GOLDEN"):
        path.write_text(text, encoding="utf-8")
    assert text == path.read_text(encoding="utf-8"), f"golden {name} differs"


def test_smollm2_chatml(smol_tok):
    (r,) = render_with_mask(smol_tok, CONV)
    _golden("smollm2_two_turns", _marked(smol_tok, r))
    assert r.input_ids == smol_tok.apply_chat_template(CONV, tokenize=True, return_dict=True)["input_ids"]
    masked = smol_tok.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m])
    assert masked == "2+2 = 4.<|im_end|>3+3 = 6.<|im_end|>"  # answers + end-of-turn, no template glue


def test_llama3(llama3_tok):
    (r,) = render_with_mask(llama3_tok, CONV)
    _golden("llama3_two_turns", _marked(llama3_tok, r))
    masked = llama3_tok.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m])
    assert masked == "2+2 = 4.<|eot_id|>3+3 = 6.<|eot_id|>"
    assert r.input_ids[0] == llama3_tok.bos_token_id


def test_qwen3_single_turn_thinking_block_is_trained(qwen3_tok):
    (r,) = render_with_mask(qwen3_tok, CONV[:2])
    _golden("qwen3_single_turn", _marked(qwen3_tok, r))
    masked = qwen3_tok.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m])
    assert masked == "<think>\n\n</think>\n\n2+2 = 4.<|im_end|>"


def test_qwen3_no_thinking_prompt_excludes_empty_think(qwen3_tok):
    (r,) = render_with_mask(qwen3_tok, CONV[:2], template_kwargs={"enable_thinking": False})
    _golden("qwen3_single_turn_no_thinking", _marked(qwen3_tok, r))
    masked = qwen3_tok.decode([t for t, m in zip(r.input_ids, r.loss_mask) if m])
    assert masked == "2+2 = 4.<|im_end|>"


def test_qwen3_multi_turn_history_rewrite_raises(qwen3_tok):
    with pytest.raises(TemplateMismatch, match="assistant turn 1 differently inside later history") as err:
        render_with_mask(qwen3_tok, CONV)
    assert "<think>" in str(err.value) and "--split-turns" in str(err.value)


def test_qwen3_split_turns(qwen3_tok):
    samples = render_with_mask(qwen3_tok, CONV, split_turns=True)
    assert len(samples) == 2
    _golden("qwen3_split_turns", "\n=====\n".join(_marked(qwen3_tok, s) for s in samples))
    last = qwen3_tok.decode([t for t, m in zip(samples[1].input_ids, samples[1].loss_mask) if m])
    assert last == "<think>\n\n</think>\n\n3+3 = 6.<|im_end|>"  # only the final turn is trained in each


def test_data_show_cli(tmp_path):
    import json

    from typer.testing import CliRunner

    from eaglewire.cli.app import app

    p = tmp_path / "c.jsonl"
    p.write_text(json.dumps({"id": "x", "messages": CONV}))
    r = CliRunner().invoke(app, ["data", "show", "--data", str(p)])
    assert r.exit_code == 0, r.output
    assert "x: " in r.output and "trained on" in r.output
