"""Read SGLang's layer-capture rules from its released wheels, without installing or importing SGLang.

A wheel is a zip: every `sglang/srt/models/*.py` is parsed with `ast`. SGLang's registry serves an
architecture (a config's `architectures[0]`) with the class of that name listed in a model file's
`EntryClass`; the class's `set_eagle3_layers_to_capture` / `set_dflash_layers_to_capture` is found through
its bases (local or imported from another model file), and that real function is executed on a stub `self`
(config, pipeline group, `model` / `language_model` with L layers) for a list of config ids. What the call
leaves behind is SGLang's reading of those ids:

    ("capture", [k, ...])   the model's layers_to_capture: the residual stream entering decoder layer k
    ("delegate", ids)       handed unchanged to another module's setter (a multimodal wrapper's language model;
                            a shifted list handed on is a capture: the inner models store what they are given)
    ("dspark", ids)         handed to the class's own set_dspark_layers_to_capture
    ("error", message)      SGLang refuses the ids
"""

from __future__ import annotations

import __future__
import ast
import builtins
import textwrap
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

SETTERS = ("set_eagle3_layers_to_capture", "set_dflash_layers_to_capture")
MODELS = "sglang/srt/models/"


def wheel_for(folder: Path, release: str) -> Path | None:
    found = sorted(folder.glob(f"sglang-{release}-*.whl"))
    return found[0] if found else None


@dataclass
class _Class:
    file: str
    name: str
    bases: list[str]
    methods: dict[str, str]  # setter name -> its source


@lru_cache(maxsize=8)
def _parse(
    path: Path,
) -> tuple[dict[str, dict[str, _Class]], dict[str, dict[str, tuple[str, str]]], dict[str, list[str]]]:
    """Per model file of the wheel: its classes, its imports of other model files' names, its EntryClass names."""
    with zipfile.ZipFile(path) as zf:
        return _parse_zip(zf)


def _parse_zip(zf: zipfile.ZipFile) -> tuple[dict, dict, dict]:
    classes: dict[str, dict[str, _Class]] = {}
    imports: dict[str, dict[str, tuple[str, str]]] = {}
    entries: dict[str, list[str]] = {}
    for name in zf.namelist():
        if not (name.startswith(MODELS) and name.endswith(".py") and "/" not in name[len(MODELS) :]):
            continue
        file = name[len(MODELS) :]
        src = zf.read(name).decode("utf-8")
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        classes[file], imports[file], entries[file] = {}, {}, []
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                methods = {
                    f.name: textwrap.dedent(ast.get_source_segment(src, f) or "")
                    for f in node.body
                    if isinstance(f, ast.FunctionDef) and f.name in SETTERS
                }
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                classes[file][node.name] = _Class(file, node.name, bases, methods)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sglang.srt.models."):
                for a in node.names:
                    imports[file][a.asname or a.name] = (node.module.rsplit(".", 1)[1] + ".py", a.name)
            elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
            ):
                value = node.value
                items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
                entries[file] += [ast.unparse(i).split(".")[-1] for i in items]
    return classes, imports, entries


def _resolve(classes: dict, imports: dict, file: str, name: str, setter: str, seen: set) -> _Class | None:
    """The class (in `file` or a model file it imports from) whose `setter` `name` inherits."""
    if (file, name) in seen:
        return None
    seen.add((file, name))
    if name not in classes.get(file, {}):
        if name in imports.get(file, {}):
            other, real = imports[file][name]
            return _resolve(classes, imports, other, real, setter, seen)
        return None
    cls = classes[file][name]
    if setter in cls.methods:
        return cls
    for base in cls.bases:
        found = _resolve(classes, imports, file, base, setter, seen)
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Reading:
    """One architecture's setter in one release: where SGLang defines it."""

    architecture: str
    entry_file: str  # the model file whose EntryClass serves the architecture
    file: str  # the model file that defines the setter it runs
    cls: str
    source: str


def read_wheel(path: Path) -> dict[str, dict[str, Reading]]:
    """{setter: {architecture: Reading}} for every registered architecture that has the setter."""
    classes, imports, entries = _parse(path)
    out: dict[str, dict[str, Reading]] = {s: {} for s in SETTERS}
    for file, names in entries.items():
        for arch in names:
            for setter in SETTERS:
                cls = _resolve(classes, imports, file, arch, setter, set())
                if cls is not None:
                    out[setter][arch] = Reading(arch, file, cls.file, cls.name, cls.methods[setter])
    return out


def defining_classes(path: Path) -> dict[str, dict[str, str]]:
    """{setter: {"file.py:Class": source}} for every class that defines it, served by an architecture of
    its own or not (an inner model, a wrapper picked at run time): every one the record must know."""
    classes, _, _ = _parse(path)
    return {
        s: {f"{f}:{c.name}": c.methods[s] for f, cs in classes.items() for c in cs.values() if s in c.methods}
        for s in SETTERS
    }


# ---- running a setter on a stub --------------------------------------------------------------------------


class _Stub:
    """Anything SGLang's setter touches: attributes appear on demand, calls to a *_layers_to_capture setter
    and assignments to layers_to_capture are recorded."""

    def __init__(self, path: str, log: list, num_layers: int) -> None:
        object.__setattr__(self, "_path", path)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_L", num_layers)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        L = self._L
        special = {
            "is_last_rank": True,
            "world_size": 1,
            "is_first_rank": True,
            "num_hidden_layers": L,
            "layers": [_Stub(f"{self._path}.layers[{i}]", self._log, L) for i in range(L)],
        }
        value = special.get(name)
        if value is None:
            value = _Stub(f"{self._path}.{name}", self._log, L)
        object.__setattr__(self, name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "layers_to_capture":
            self._log.append(("capture", self._path, sorted(value)))
        object.__setattr__(self, name, value)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self._path.rsplit(".", 1)[-1]
        if name.endswith("_layers_to_capture") and args:
            self._log.append(("call", self._path, list(args[0])))
        return _Stub(self._path + "()", self._log, self._L)


@lru_cache(maxsize=512)
def _compiled(source: str) -> tuple[Any, frozenset[str]]:
    code = compile(
        "from typing import *\n" + source,
        "<sglang>",
        "exec",
        flags=__future__.annotations.compiler_flag,
        dont_inherit=True,
    )
    return code, frozenset(n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name))


def run_setter(source: str, ids: list[int] | None, num_layers: int) -> tuple[str, Any]:
    """SGLang's reading of config ids `ids` for an L-layer target (see the module docstring)."""
    code, used = _compiled(source)
    log: list = []
    names: dict[str, Any] = {}
    exec(code, names)  # noqa: S102 - SGLang's own function, read from its wheel, run on a stub
    for free in used - names.keys():
        if not hasattr(builtins, free):  # module-level helpers (get_pp_group(), ...): stubs too
            names[free] = _Stub(free, log, num_layers)
    exec(code, names)  # noqa: S102 - SGLang's own function, read from its wheel, run on a stub
    fn = next(v for k, v in names.items() if k in SETTERS)
    self = _Stub("self", log, num_layers)
    try:
        fn(self, ids)
    except (ValueError, IndexError, NotImplementedError, AttributeError, TypeError) as err:
        return ("error", f"{type(err).__name__}: {err}")
    for kind, path, value in log:
        if kind == "capture":
            return ("capture", value)
        if path == "self.set_dspark_layers_to_capture":
            return ("dspark", value)
        if value != list(ids or []):  # shifted, then handed to the inner model that stores it (qwen*_moe.py)
            return ("capture", sorted(value))
        return ("delegate", value)
    return ("error", "nothing captured")


# ---- classifying a setter into the record's rule names ---------------------------------------------------

PROBE_LAYERS = 30
PROBES = ([1, 14, 26], [2, 15, 27], [0, 5, 10], [3, 16, 29], [5, 10, PROBE_LAYERS])
CANDIDATES = {  # rule name -> the layers_to_capture it gives for config ids (None: no capture of its own)
    "sglang-plus1": lambda ids, L: [i + 1 for i in ids],
    "sglang-first1": lambda ids, L: [i + 1 for i in ids] if ids[0] == 1 else list(ids),
    "sglang-final": lambda ids, L: list(ids) if max(ids) == L else [i + 1 for i in ids],
    "as-is": lambda ids, L: list(ids),
}


def classify(source: str) -> str:
    """The record's name for what a setter does with config ids: a CANDIDATES rule (whose every probe SGLang
    accepts agrees with it), "delegate" (ids handed on unchanged) or "dspark"."""
    outcomes = [run_setter(source, ids, PROBE_LAYERS) for ids in PROBES]
    kinds = {kind for kind, _ in outcomes} - {"error"}
    if kinds <= {"delegate", "dspark"} and len(kinds) == 1:
        return kinds.pop()
    ok = [(ids, got) for ids, (kind, got) in zip(PROBES, outcomes) if kind == "capture"]
    if kinds != {"capture"} or len(ok) < 3:
        return "unknown"
    matches = [n for n, f in CANDIDATES.items() if all(f(ids, PROBE_LAYERS) == got for ids, got in ok)]
    # where SGLang refuses the probe that tells two rules apart (ids reaching L), the simpler one is its rule
    return matches[0] if matches else "unknown"


def readings(folder: Path, releases: tuple[str, ...]) -> dict[str, Any]:
    """The record as SGLang's wheels define it: {kind: {release: {"file:Class": {"rule", "archs"}}}}."""
    out: dict[str, Any] = {"eagle3": {}, "dflash": {}}
    for release in releases:
        wheel = wheel_for(folder, release)
        assert wheel is not None, f"no SGLang {release} wheel in {folder} (bash scripts/sglang_wheels.sh)"
        served = read_wheel(wheel)
        for setter, sources in defining_classes(wheel).items():
            homes = {home: {"rule": classify(src), "archs": []} for home, src in sources.items()}
            for arch, r in sorted(served[setter].items()):
                homes[f"{r.file}:{r.cls}"]["archs"].append(arch)
            out[setter.split("_")[1]][release] = homes
    return out


if __name__ == "__main__":  # print the record's JSON as the wheels define it (review, then save it)
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).parents[1] / "src"))
    from eaglewire.export.sglang_rules import RELEASES, WHEELS

    print(json.dumps(readings(WHEELS, RELEASES), indent=1, sort_keys=True))
