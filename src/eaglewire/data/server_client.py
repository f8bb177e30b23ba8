"""Regeneration through an OpenAI-compatible server (how SGLang/vLLM users regenerate at scale).

Plain `urllib` (no client dependency); one request per prompt, `batch_size` in flight at once.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from eaglewire.data.regenerate import GenerationSettings, Reply
from eaglewire.errors import EaglewireError


class ServerGenerator:
    def __init__(
        self,
        base_url: str,
        model: str | None,
        s: GenerationSettings,
        tokenizer: Any,
        timeout: float = 600.0,
        identity: dict | None = None,
    ) -> None:
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.s, self.tok, self.timeout = model or "default", s, tokenizer, timeout
        # An engine started by eaglewire names itself by what it runs (engine, version, dtype, target),
        # not by its port, so a file regenerated through it resumes in a later run.
        self._identity = identity or {"kind": "server", "url": self.url, "model": self.model}

    def identity(self) -> dict:
        return self._identity

    def prompt_tokens(self, messages: list[dict[str, str]]) -> int:
        return len(
            self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)[
                "input_ids"
            ]
        )

    def chat_one(self, messages: list[dict[str, str]], seed: int) -> Reply:
        body = {
            "model": self.model,
            "messages": messages,
            "max_tokens": self.s.max_new_tokens,
            "temperature": self.s.temperature,
            "top_p": self.s.top_p,
            "seed": seed,
        }
        req = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read())
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
            raise EaglewireError(
                f"regeneration server {self.url} failed",
                expected="an OpenAI-compatible /chat/completions answer",
                found=str(err),
                fix="check --server (it must end in /v1) and that the server is up",
            ) from None
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"] or ""
            tokens = int(data.get("usage", {}).get("completion_tokens", 0))
        except (KeyError, IndexError, TypeError, ValueError):
            raise EaglewireError(
                f"unexpected response from {self.url}",
                expected="choices[0].message.content",
                found=json.dumps(data)[:300],
            ) from None
        return Reply(
            text=text, new_tokens=tokens, finish="length" if choice.get("finish_reason") == "length" else "stop"
        )

    def generate(self, prompts: list[list[dict[str, str]]], seed: int) -> list[Reply]:
        with ThreadPoolExecutor(max_workers=self.s.batch_size) as pool:
            return list(pool.map(lambda im: self.chat_one(im[1], seed + im[0]), enumerate(prompts)))


class CompletionSampler:
    """One sampled completion of a fixed token-id prompt per call, through an OpenAI-compatible
    /completions endpoint (vLLM, SGLang): the self-prompt sampler (`data/self_prompts.py`). Token ids,
    not text, so the server cannot re-tokenize the template's special tokens differently."""

    def __init__(
        self,
        base_url: str,
        model: str | None,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        timeout: float = 600.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/completions"
        self.body = {
            "model": model or "default",
            "prompt": prompt_ids,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
        }
        self.timeout = timeout

    def __call__(self, seed: int) -> tuple[str, str, int]:
        req = urllib.request.Request(
            self.url,
            data=json.dumps({**self.body, "seed": seed}).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                data = json.loads(resp.read())
            choice = data["choices"][0]
            return choice["text"], choice.get("finish_reason") or "stop", int(data["usage"]["completion_tokens"])
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as err:
            raise EaglewireError(
                f"completion server {self.url} failed",
                expected="an OpenAI-compatible /completions answer",
                found=str(err),
                fix="check --server (it must end in /v1) and that the server is up",
            ) from None
        except (KeyError, IndexError, TypeError, ValueError):
            raise EaglewireError(
                f"unexpected response from {self.url}",
                expected="choices[0].text and usage",
                found=json.dumps(data)[:300],
            ) from None
