"""What every format shares: strict key renaming, the contract side file, atomic export directories.

Native eaglewire names (eaglewire.draft.model): fc.weight, layers.{i}.*, norm.weight, lm_head.weight,
d2t, t2d, optional input_norm.weight / fc_norm.{i}.weight, optional embed_tokens.weight.
A format module supplies `to_format(native_name) -> name` and `from_format(name) -> native_name`; both
raise on a name they do not know (nothing is ever dropped or loaded non-strictly). Every export also
writes `eaglewire_contract.json` (engines ignore it), so import and the doctor know the truth.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch
from eaglewire.contract import WiringContract
from eaglewire.errors import CheckpointError, ContractMismatch
from eaglewire.outputs import replace_dir
from eaglewire.safeio import (
    about_file,
    atomic_save_safetensors,
    atomic_write_json,
    read_json_object,
    read_safetensors_file,
)

CONTRACT_FILE = "eaglewire_contract.json"
WEIGHTS = "model.safetensors"


def rename_all(tensors: dict[str, torch.Tensor], fn: Callable[[str], str], where: str) -> dict[str, torch.Tensor]:
    """Rename every key with `fn`; an unknown key or two keys landing on one name stops the conversion."""
    out: dict[str, torch.Tensor] = {}
    for k, v in tensors.items():
        try:
            new = fn(k)
        except KeyError:
            raise CheckpointError(
                f"{where}: unexpected tensor {k!r}",
                expected="only draft weights this format defines",
                found=k,
                fix="the checkpoint is not of this format, or is damaged",
            ) from None
        if new in out:
            raise CheckpointError(f"{where}: two tensors map to {new!r}", found=k)
        out[new] = v
    return out


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(
            f"no weights at {path}",
            expected=f"{path.name} (safetensors)",
            found="missing",
            fix="point at the exported draft directory",
        )
    return read_safetensors_file(path, what="draft weights", error=CheckpointError)


def read_draft_config(path: Path) -> dict[str, Any]:
    """A draft's config.json (any layout, native included), its values checked by the one validation every
    reader of a config shares (eaglewire.limits.check_config_values: sizes and physics at every nesting level):
    import, export and the doctor read configs through here, so none passes what another refuses."""
    from eaglewire.limits import check_config_values

    if not path.is_file():
        raise CheckpointError(
            f"missing {path.name} in {path.parent}",
            expected=path.name,
            found="no such file",
            fix="point at the exported draft directory (it holds config.json and the weights)",
        )
    config = read_json_object(path, what="a draft config", error=CheckpointError)
    check_config_values(config, str(path), CheckpointError)
    return config


def read_contract(directory: Path) -> WiringContract | None:
    p = Path(directory) / CONTRACT_FILE
    if not p.is_file():
        return None
    with about_file(p):
        return WiringContract.from_dict(read_json_object(p, what="a wiring contract", error=ContractMismatch))


def write_dir(
    out: Path,
    config: dict[str, Any],
    tensors: dict[str, torch.Tensor],
    contract: WiringContract,
    weights_name: str = WEIGHTS,
    *,
    force: bool = False,
    inputs: tuple[Path, ...] = (),
) -> Path:
    """Write config.json + weights + contract side file into a temp dir, then swap it into place: an existing
    `out` must be an earlier export (or `force`), and is never one of `inputs` (eaglewire.outputs)."""

    def fill(tmp: Path) -> None:
        atomic_save_safetensors(tensors, tmp / weights_name, metadata={"format": "pt"})
        atomic_write_json(tmp / "config.json", config)
        atomic_write_json(tmp / CONTRACT_FILE, contract.to_dict())

    return replace_dir(
        Path(out),
        fill,
        names=(weights_name, "config.json", CONTRACT_FILE),
        owned=is_export,
        force=force,
        inputs=inputs,
        what="export",
    )


def is_export(directory: Path) -> bool:
    """An eaglewire export: every export writes the contract side file."""
    return (Path(directory) / CONTRACT_FILE).is_file()


def cast_floats(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    return {
        k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).contiguous() for k, v in tensors.items()
    }
