"""The request parser (serve/chat_requests.py) with drawn input: Content-Length accepts ASCII digits only (a
Unicode digit is a 400, never a dropped connection), every accepted temperature/top_p gives the sampler finite
probabilities (the rest is a 400 naming the field), and rendering refuses more than MAX_MESSAGES messages and is
one pass over the rendered text. No server is started here: the whole-request deadline, per-connection budget,
half-close and slow-client tests are in test_slow_clients.py."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from eaglewire.decoding.tree import target_probs
from eaglewire.serve.chat_requests import MAX_MESSAGES, BadRequest, check_messages, check_params, content_length

CASES = 200  # generated cases per test in CI (pure functions: milliseconds)


@settings(max_examples=CASES, deadline=None)
@given(text=st.text(max_size=24) | st.from_regex(r"\s*[0-9\u0660-\u0669\uff10-\uff19]{1,20}\s*", fullmatch=True))
def test_content_length_is_an_ascii_integer_or_a_400(text):
    try:
        n = content_length(text)
    except BadRequest as err:
        assert err.status in (400, 413) and err.param == "Content-Length"
    else:
        assert text.strip().isascii() and n == int(text.strip())


finite = st.floats(allow_nan=False, allow_infinity=False)
numbers = finite | st.sampled_from([1e-38, 5e-324, 1e-300, 0.0, -0.0, 1e308]) | st.integers(-5, 5)


@settings(max_examples=CASES, deadline=None)
@given(temperature=numbers, top_p=numbers)
def test_accepted_sampling_values_give_finite_probabilities(temperature, top_p):
    body = {"messages": [{"role": "user", "content": "x"}], "temperature": temperature, "top_p": top_p}
    try:
        p = check_params(body, "/v1/chat/completions", 64)
    except BadRequest as err:
        assert err.status == 400 and err.param in ("temperature", "top_p")
        return
    if p.temperature == 0:  # greedy: the engine takes the argmax, the sampler is not called
        return
    logits = torch.linspace(-80.0, 80.0, 257)  # fp32 logits of a wide range
    probs = target_probs(logits, p.temperature, p.top_p)
    assert bool(torch.isfinite(probs).all()) and math.isclose(float(probs.sum()), 1.0, rel_tol=1e-4)


def test_message_count_is_capped():
    msgs = [{"role": "user", "content": ""}] * (MAX_MESSAGES + 1)
    with pytest.raises(BadRequest, match=f"at most {MAX_MESSAGES}"):
        check_messages(msgs)
    assert check_messages(msgs[:MAX_MESSAGES]) is not None
