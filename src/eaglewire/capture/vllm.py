"""A target's hidden states captured THROUGH vLLM: its own extraction path, the one speculators uses.

    states = capture_through_vllm(target_dir, [[1, 504, 3458], ...], layer_ids=[2, 15, 27])
    # one [T, n, H] tensor per prompt, layers in ASCENDING id order (vLLM sorts and deduplicates ids)

vLLM is started with speculative method `extract_hidden_states` (its ids in vLLM's numbering: id b =
boundary b, 0 = embedding output, L = last layer before the final norm) and a hidden-states KV connector
that writes each finished request's prompt states to a temporary shared directory; the completion answer
names the file (kv_transfer_params.hidden_states_path). On the CPU build the stock connector crashes, so
the server imports our subclass (vllm_client/plugins/eaglewire_cpu_hidden_states.py, by PYTHONPATH).

`dump_through_vllm` writes what vLLM would deliver to a draft exported for it (the ids its config.json
says, in the order vLLM concatenates them) as a dump `eaglewire doctor probe --dump` reads.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from eaglewire.errors import EaglewireError
from eaglewire.safeio import read_safetensors_file
from eaglewire.vllm_client.server import VllmServer, post_completion

PLUGIN_DIR = Path(__file__).parents[1] / "vllm_client" / "plugins"
CONNECTOR, CONNECTOR_MODULE = "CpuHiddenStatesConnector", "eaglewire_cpu_hidden_states"


def extraction_configs(layer_ids: Sequence[int], shared_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(--speculative-config, --kv-transfer-config) as speculators builds them, with our CPU connector."""
    spec = {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
    }
    kv = {
        "kv_connector": CONNECTOR,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": {"shared_storage_path": str(shared_dir)},
    }
    return spec, kv


def _wait_shared_lock(lock: Path, deadline: float, srv: VllmServer) -> int:
    """Open `lock` and take a shared flock on it (granted once the writer closed its exclusive one),
    polling so the wait is bounded; returns the fd (closing it releases the lock)."""
    while True:
        if lock.is_file():
            fd = os.open(lock, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                os.close(fd)
        if time.monotonic() > deadline or (srv.proc is not None and srv.proc.poll() is not None):
            raise EaglewireError(
                "vLLM did not finish writing the hidden states",
                expected=f"{lock} released",
                found=f"still locked or absent; log {srv.log_path}:\n{srv.log_tail()}",
            )
        time.sleep(0.05)


def _read_states(path: Path, deadline: float, srv: VllmServer) -> dict[str, torch.Tensor]:
    fd = _wait_shared_lock(path.with_name(path.name + ".lock"), deadline, srv)
    try:
        if not path.is_file():
            raise EaglewireError(
                "vLLM released the lock without writing the hidden states",
                expected=str(path),
                found=f"no file; log {srv.log_path}:\n{srv.log_tail()}",
            )
        # the one guarded reader: tensors only, header bounded, a damaged file named
        return read_safetensors_file(path, what="vLLM's hidden states")
    finally:
        os.close(fd)


def capture_through_vllm(
    target_dir: str | Path,
    prompts: list[list[int]],
    layer_ids: Sequence[int],
    dtype: str = "float32",
    *,
    timeout: float = 120.0,
    server_log: Path | None = None,
) -> list[torch.Tensor]:
    """vLLM's hidden states at `layer_ids` (vLLM's numbering = boundaries) for each token-id prompt:
    [T, n, H] per prompt, n = len(set(layer_ids)), in ASCENDING id order whatever order was given.
    One server for all prompts, one request at a time, prefix caching off (every prompt's states are
    computed for it); the shared directory is a temp dir removed on return; the server is always stopped."""
    ids = sorted(set(int(i) for i in layer_ids))
    target_dir = Path(target_dir)
    hidden_size = json.loads((target_dir / "config.json").read_text()).get("hidden_size")
    with tempfile.TemporaryDirectory(prefix="eaglewire-vllm-hs-") as tmp:
        shared = Path(tmp).resolve()
        spec, kv = extraction_configs(ids, shared)
        pythonpath = os.pathsep.join(p for p in (str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")) if p)
        with VllmServer(
            target_dir,
            dtype=dtype,
            max_model_len=max(len(p) for p in prompts) + 16,
            speculative_config=spec,
            kv_transfer_config=kv,
            env={"PYTHONPATH": pythonpath},
            kv_cache_gib=1,
            max_num_seqs=1,
            enforce_eager=True,
            extra_args=["--no-enable-prefix-caching"],
            log_path=server_log,
        ) as srv:
            out = []
            for prompt in prompts:
                body = {"model": srv.model_name, "prompt": list(prompt), "max_tokens": 1, "temperature": 0.0}
                answer = post_completion(srv.base_url, body, timeout)
                where = (answer.get("kv_transfer_params") or {}).get("hidden_states_path")
                path = Path(where).resolve() if where else None
                if path is None or path.parent != shared:
                    raise EaglewireError(
                        "vLLM's answer does not name a hidden-states file in our shared directory",
                        expected=f"kv_transfer_params.hidden_states_path under {shared}",
                        found=json.dumps(answer.get("kv_transfer_params")),
                    )
                data = _read_states(path, time.monotonic() + timeout, srv)
                hs, tok = data.get("hidden_states"), data.get("token_ids")
                want = (len(prompt), len(ids), hidden_size or (hs.shape[-1] if hs is not None else 0))
                if hs is None or tok is None or tuple(hs.shape) != want or tok.tolist() != list(prompt):
                    raise EaglewireError(
                        "vLLM's hidden-states file does not match the request",
                        expected=f"hidden_states {want} and token_ids = the prompt",
                        found=f"{ {k: tuple(v.shape) for k, v in data.items()} }",
                    )
                out.append(hs.float())
                for p in (path, path.with_name(path.name + ".lock")):
                    p.unlink(missing_ok=True)
    return out
