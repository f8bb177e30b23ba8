"""SpecForge (sgl-project/SpecForge) offline EAGLE-3 data: `DIR/rows_{g}-{g+N}/data_{i}.ckpt` (or `.ckpt.gz`),
one `torch.save` dict per sample, read without unpickling anything but tensors. Verified in
    scripts/prepare_hidden_states.py (the writer: `DataPoint(input_ids [T], loss_mask [T],
        hidden_state [1, T, H], aux_hidden_state [1, T, 3H])`, its `asdict` saved by torch's serializer, samples
        with NaN skipped, `rows_{g}-{g+file_group_size}` groups, `data_{idx}.ckpt`);
    site-packages/specforge/data/preprocessing.py (`OfflineEagle3Dataset`, `process_offline_eagle3_sample`:
        aux_hidden_state is the draft's input, hidden_state the `target` that only the LM head is applied
        to, loss_mask's last position zeroed at read time; `.ckpt` and `.ckpt.gz` suffixes);
    site-packages/specforge/runtime/data_plane/feature_store.py (`load_feature_file`: `.gz` is gunzipped
        whole, then `torch.load`; SpecForge itself loads with `weights_only=False`, we never do);
    site-packages/specforge/offline_capture/sglang_backend/utils.py (`last_hidden_states` are SGLang's
        pruned post-final-norm states; the pre-norm ones are a separate tensor that is not stored).
"""

from __future__ import annotations

import gzip
import io
import re
import zipfile
from pathlib import Path

import torch
from torch.serialization import get_unsafe_globals_in_checkpoint

from eaglewire.capture.dumps.sample import POST_NORM, DumpSample, bad, check_lengths, token_vector

CKPT = re.compile(r"(\.ckpt|\.ckpt\.gz)$")  # a sample file's suffix


def load_torch_file(path: Path) -> dict:
    """`torch.load(..., weights_only=True)` only: tensors, dicts, lists and numbers. A .ckpt is a pickle and
    unpickling runs whatever it names, so the globals it would import are listed first (without building
    anything) and a file that names any is refused with them."""
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rb") as f:  # torch.load needs the zip's central directory at the end
                src: Path | io.BytesIO = io.BytesIO(f.read())
        else:
            src = path
        unsafe = get_unsafe_globals_in_checkpoint(src)
        if unsafe:
            raise bad(
                path,
                "refused: the file needs more than weights_only unpickling",
                "a torch.save dict of tensors (weights_only=True loads it)",
                f"pickled objects of {unsafe}",
                "re-create the sample with the tool's writer; eaglewire never unpickles arbitrary objects",
            )
        if isinstance(src, io.BytesIO):
            src.seek(0)
            obj = torch.load(src, map_location="cpu", weights_only=True)
        else:  # mmap: tensors are paged in when used, not all at once
            obj = torch.load(src, map_location="cpu", weights_only=True, mmap=True)
    # torch's weights_only unpickler raises UnpicklingError for a pickle that names more than plain tensors
    except (
        RuntimeError,
        EOFError,
        OSError,
        zipfile.BadZipFile,
        torch.serialization.pickle.UnpicklingError,
        ValueError,
    ) as err:
        raise bad(
            path,
            "cannot be read (truncated or not a torch.save file)",
            "a complete torch.save file",
            f"{type(err).__name__}: {str(err).splitlines()[0]}",
            "re-create this sample (SpecForge's prepare_hidden_states.py skips existing files: delete it first)",
        ) from None
    if not isinstance(obj, dict):
        raise bad(path, "is not a SpecForge sample", "a dict of tensors", type(obj).__name__)
    return obj


def _states(path: Path, data: dict, key: str) -> torch.Tensor:
    """`key` as [T, W] from SpecForge's [1, T, W] (the writer's unsqueeze(0))."""
    t = data.get(key)
    if t is None:
        extra = (
            " (written without --enable-aux-hidden-states: EAGLE-3 needs the aux taps)"
            if key == "aux_hidden_state"
            else ""
        )
        raise bad(path, f"has no {key}{extra}", f"{key} [1, T, W]", f"keys {sorted(data)}")
    if (
        not isinstance(t, torch.Tensor)
        or not t.is_floating_point()
        or t.dim() not in (2, 3)
        or (t.dim() == 3 and t.shape[0] != 1)
    ):
        found = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        raise bad(path, f"{key} has the wrong shape", f"{key}: floating [1, T, W]", found)
    return t.reshape(-1, t.shape[-1])


class SpecForgeDump:
    format, last_kind, declared_taps, missing_rows = "specforge", POST_NORM, None, 0

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        files = [p for p in self.root.rglob("*") if p.is_file() and CKPT.search(p.name)]
        if not files:
            raise bad(
                self.root,
                "holds no SpecForge sample files",
                "rows_*/data_*.ckpt or .ckpt.gz",
                "none",
                "point at the --output-path of SpecForge's prepare_hidden_states.py",
            )
        self._files = {CKPT.sub("", str(p.relative_to(self.root))): p for p in files}

    def ids(self) -> list[str]:
        def key(sid: str) -> tuple[int, str]:  # data_{idx}: the writer's global sample index
            m = re.search(r"(\d+)$", sid)
            return (int(m.group(1)) if m else -1, sid)

        return sorted(self._files, key=key)

    def layout(self) -> str:
        return "SpecForge offline EAGLE-3 (aux_hidden_state [1, T, k*H] taps, hidden_state [1, T, H] post-norm)"

    def read(self, sid: str) -> DumpSample:
        path = self._files[sid]
        data = load_torch_file(path)
        ids, mask = (token_vector(path, k, data.get(k)) for k in ("input_ids", "loss_mask"))
        aux, last = _states(path, data, "aux_hidden_state"), _states(path, data, "hidden_state")  # [T, kH], [T, H]
        H = last.shape[-1]
        if aux.shape[-1] % H:
            raise bad(
                path,
                "aux_hidden_state is not a concatenation of H-wide states",
                f"a width that is a multiple of hidden_state's {H}",
                f"width {aux.shape[-1]}",
            )
        check_lengths(
            path,
            {
                "input_ids": len(ids),
                "loss_mask": len(mask),
                "aux_hidden_state": aux.shape[0],
                "hidden_state": last.shape[0],
            },
        )
        return DumpSample(sid, path, ids, mask, aux.reshape(len(ids), -1, H), last, POST_NORM)
