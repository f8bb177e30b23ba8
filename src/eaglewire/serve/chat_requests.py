"""What the OpenAI-compatible server accepts, checked field by field before anything runs: every malformed or
unsupported request is a 4xx naming the field (never a 500, a hang or a silently ignored parameter), and chat
messages are rendered so that text a user types stays text.

Kept apart from the HTTP plumbing (eaglewire.serve.server) so each part stays readable; nothing here
touches a socket or the model.
"""

from __future__ import annotations

import json
import math
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Any

MAX_BODY_BYTES = 1 << 20  # a chat request is text: 1 MiB is thousands of pages; larger bodies get 413
MAX_SEED = (1 << 63) - 1  # torch.Generator.manual_seed takes a 64-bit seed
MAX_MESSAGES = 1024  # a chat far longer than any context window; rendering stays linear in the body below it
# Where the sampler is defined: logits / temperature overflows to inf below MIN_TEMPERATURE (fp32 logits of
# ~1e2 divided by 1e-38), and a nucleus below MIN_TOP_P is the top token (what temperature 0 asks for).
MIN_TEMPERATURE, MAX_TEMPERATURE, MIN_TOP_P = 1e-2, 100.0, 1e-6
ROLES = ("system", "user", "assistant")
MESSAGE_KEYS = {"role", "content"}
# Fields accepted as they are, and fields accepted only at the value that means "not used": anything else is
# refused, so a client never believes a parameter took effect when it did not.
COMMON = {
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "seed",
    "stream",
    "user",
    "stream_options",
}
NEUTRAL = {
    "n": (1,),
    "stop": (None, [], ""),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "parallel_tool_calls": (None,),
}


class BadRequest(Exception):
    def __init__(
        self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}


def _bad(param: str, message: str) -> BadRequest:
    return BadRequest(400, f"{param}: {message}", param=param)


def content_length(headers: list[str] | str | None, transfer: list[str] | None = None) -> int:
    """The body size a POST declares: one Content-Length, a plain non-negative integer, at most MAX_BODY_BYTES.
    Two of them, or a Transfer-Encoding (with one or without), are refused: servers and proxies disagree on
    which wins (request smuggling's classic pairs), so no reading is safe."""
    if transfer:
        raise BadRequest(
            400 if headers else 411,
            f"Transfer-Encoding: {transfer[0][:40]!r} is not accepted; send "
            "the body with one Content-Length header alone",
            param="Transfer-Encoding",
        )
    if isinstance(headers, list) and len(headers) > 1:
        raise BadRequest(
            400,
            f"Content-Length: given {len(headers)} times ({', '.join(h[:20] for h in headers[:4])}); send it once",
            param="Content-Length",
        )
    header = (headers[0] if headers else None) if isinstance(headers, list) else headers
    if header is None:
        raise BadRequest(
            411, "Content-Length: required (chunked request bodies are not accepted)", param="Content-Length"
        )
    text = header.strip()
    if not (text.isascii() and text.isdigit()) or len(text) > 19:  # '٣'.isdigit() is true, int() of it works
        raise BadRequest(
            400, f"Content-Length: must be a non-negative integer, got {header[:40]!r}", param="Content-Length"
        )
    n = int(text)
    if n > MAX_BODY_BYTES:
        raise BadRequest(
            413,
            f"Content-Length: {n} bytes is over this server's limit of {MAX_BODY_BYTES}",
            "request_too_large",
            "Content-Length",
        )
    return n


def parse_body(raw: bytes) -> dict:
    """JSON object from raw bytes. NaN/Infinity parse (as Python floats) so the field check can name the field;
    absurd nesting, huge integers and lone surrogates are refused here."""
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise BadRequest(400, "body: not UTF-8 text", param="body") from None
    except RecursionError:
        raise BadRequest(400, "body: JSON nested too deeply", param="body") from None
    except ValueError as err:  # JSONDecodeError, and ints beyond Python's digit limit
        raise BadRequest(400, f"body: not valid JSON ({str(err)[:120]})", param="body") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "body: must be a JSON object", param="body")
    _check_text(body, "body", 0)
    return body


def _check_text(node: Any, where: str, depth: int) -> None:
    """Every string must be encodable (a lone surrogate escape like \\ud800 is not text)."""
    if depth > 32:  # no field of a chat request nests like this; named by its top-level field
        raise _bad(where.split(".")[0].split("[")[0], "nested too deeply")
    if isinstance(node, str):
        try:
            node.encode("utf-8")
        except UnicodeEncodeError:
            raise _bad(where, "holds a lone surrogate (an invalid \\u escape)") from None
    elif isinstance(node, dict):
        for k, v in node.items():
            _check_text(k, where, depth + 1)
            _check_text(v, f"{where}.{k}" if where != "body" else k, depth + 1)
    elif isinstance(node, list):
        for i, v in enumerate(node):
            _check_text(v, f"{where}[{i}]", depth + 1)


@dataclass(frozen=True)
class Params:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stream: bool


def _same(value: Any, allowed: Any) -> bool:
    """Equal and of the same JSON type (Python's True == 1 and 0 == False must not let a boolean pass for a
    number or the reverse; 0 and 0.0 are one JSON number)."""
    if isinstance(value, bool) or isinstance(allowed, bool):
        return type(value) is type(allowed) and value == allowed
    return value == allowed and (value is None) == (allowed is None)


def _number(body: dict, key: str, default: float) -> float:
    v = body.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(key, f"must be a finite number, got {v!r}")
    return float(v)


def check_params(body: dict, path: str, max_tokens_limit: int) -> Params:
    """The sampling fields, typed and in range; unknown or unsupported fields refused by name."""
    known = COMMON | set(NEUTRAL) | ({"messages"} if path == "/v1/chat/completions" else {"prompt"})
    for key in body:
        if key not in known:
            raise _bad(key, "is not a parameter this server supports")
        if key in NEUTRAL and not any(_same(body[key], v) for v in NEUTRAL[key]):  # true is not 1, 0 not false
            raise _bad(key, f"is not supported (only {NEUTRAL[key][-1]!r} or absent): got {body[key]!r}"[:200])
    for name in ("max_tokens", "max_completion_tokens"):  # each one given is checked, not only the one used
        mt = body.get(name)
        if name in body and (isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= max_tokens_limit):
            raise _bad(name, f"must be an integer in [1, {max_tokens_limit}], got {mt!r}"[:200])
    if "max_tokens" in body and "max_completion_tokens" in body and body["max_tokens"] != body["max_completion_tokens"]:
        raise _bad("max_completion_tokens", "disagrees with max_tokens (give one, or both equal)")
    mt = body.get("max_tokens", body.get("max_completion_tokens", min(256, max_tokens_limit)))
    temperature, top_p = _number(body, "temperature", 0.0), _number(body, "top_p", 1.0)
    if not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE):
        raise _bad(
            "temperature", f"must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {temperature!r}"
        )
    if not MIN_TOP_P <= top_p <= 1:
        raise _bad("top_p", f"must be in [{MIN_TOP_P}, 1] (use temperature 0 for the top token), got {top_p!r}")
    seed = body.get("seed", 0)
    if seed is None:
        seed = 0
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise _bad("seed", f"must be an integer in [0, 2**63 - 1], got {str(seed)[:40]!r}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", f"must be true or false (a JSON boolean), got {stream!r}"[:120])
    opts = body.get("stream_options")
    if opts is not None and not (
        isinstance(opts, dict) and set(opts) <= {"include_usage"} and isinstance(opts.get("include_usage", False), bool)
    ):
        raise _bad(
            "stream_options",
            f'only {{"include_usage": true or false}} is supported (usage is always sent), got {opts!r}'[:200],
        )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise _bad("user", "must be a string")
    return Params(mt, temperature, top_p, seed, stream)


def check_messages(msgs: Any) -> list[dict[str, str]]:
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "must be a non-empty list of {role, content} objects")
    if len(msgs) > MAX_MESSAGES:
        raise _bad("messages", f"at most {MAX_MESSAGES} messages per request, got {len(msgs)}")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or set(m) - MESSAGE_KEYS:
            extra = sorted(set(m) - MESSAGE_KEYS) if isinstance(m, dict) else type(m).__name__
            raise _bad(f"messages[{i}]", f"must be an object with only role and content, got {extra}")
        if m.get("role") not in ROLES:
            raise _bad(f"messages[{i}].role", f"must be one of {list(ROLES)}, got {m.get('role')!r}"[:120])
        if not isinstance(m.get("content"), str):
            raise _bad(f"messages[{i}].content", "must be a string")
    return msgs


def render_chat(tok: Any, msgs: list[dict[str, str]]) -> list[int]:
    """Token ids of the chat template applied to `msgs`, where message text is tokenized as text: a user
    typing "<|im_start|>system" gets those characters, never the control token. The template is rendered with
    a placeholder for each content; its own parts are tokenized with special tokens, the contents without."""
    tag = uuid.uuid4().hex
    marks = [f"EWMSG{tag}N{i}E" for i in range(len(msgs))]
    rendered = tok.apply_chat_template(
        [{"role": m["role"], "content": k} for m, k in zip(msgs, marks)], tokenize=False, add_generation_prompt=True
    )
    found = [(int(x.group(1)), x.start(), x.end()) for x in re.finditer(f"EWMSG{tag}N(\\d+)E", rendered)]
    if [i for i, _, _ in found] != list(range(len(msgs))):  # a template that edits or repeats content
        raise RuntimeError(
            "the chat template does not place each message's text verbatim once; refusing to render user text into it"
        )
    ids: list[int] = []
    pos = 0  # one pass over the rendered text: linear in its length, whatever the number of messages
    for m, (_, start, end) in zip(msgs, found):
        head = rendered[pos:start]
        ids += tok(head, add_special_tokens=False)["input_ids"] if head else []
        ids += (
            tok(m["content"], add_special_tokens=False, split_special_tokens=True)["input_ids"] if m["content"] else []
        )
        pos = end
    rest = rendered[pos:]
    ids += tok(rest, add_special_tokens=False)["input_ids"] if rest else []
    return ids


def render_prompt(tok: Any, prompt: Any) -> list[int]:
    """/v1/completions: a raw prompt; special-token strings stay text there too."""
    if not isinstance(prompt, str) or not prompt:
        raise _bad("prompt", "must be a non-empty string")
    return tok(prompt, split_special_tokens=True)["input_ids"]


class Histogram:
    """A Prometheus histogram (cumulative buckets, sum, count) of seconds."""

    BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

    def __init__(self, name: str, help_text: str) -> None:
        self.name, self.help = name, help_text
        self.counts, self.sum, self.count = [0] * len(self.BUCKETS), 0.0, 0
        self.lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self.lock:
            self.sum += seconds
            self.count += 1
            for i, b in enumerate(self.BUCKETS):
                if seconds <= b:
                    self.counts[i] += 1

    def prometheus(self) -> str:
        with self.lock:
            rows = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
            rows += [f'{self.name}_bucket{{le="{b}"}} {c}' for b, c in zip(self.BUCKETS, self.counts)]
            rows += [
                f'{self.name}_bucket{{le="+Inf"}} {self.count}',
                f"{self.name}_sum {self.sum:.6f}",
                f"{self.name}_count {self.count}",
            ]
        return "\n".join(rows) + "\n"
