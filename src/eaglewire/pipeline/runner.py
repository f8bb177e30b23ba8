"""`eaglewire run`: the stages in order, with a resumable state file.

Every stage has a key: the sha256 of the config fields it reads plus its upstream stages' keys. Its
outputs live in OUT/work/<stage>-<key>/, so two configurations never share a directory, and a
finished stage whose key is unchanged is never redone. State (OUT/state.json, written atomically after
every stage) records finished stages and their small JSON results. Killing a run loses at most the
current stage's unfinished part; the long stages resume inside their own directory too.

Regeneration keys its directory without the conversation count, so asking for more conversations
continues the same file instead of starting over (downstream stages still see the new count).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eaglewire.errors import EaglewireError
from eaglewire.safeio import read_json_object
from eaglewire.hw import runtime_dtype
from eaglewire.pipeline import stages as S
from eaglewire.pipeline.config import RunConfig
from eaglewire.outputs import output_lock
from eaglewire.digests import tree_digest
from eaglewire.safeio import atomic_write_json
from eaglewire.target.loader import Target, load_target

STATE_FORMAT = "eaglewire.run/1"


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    fn: Callable[[S.Ctx, Path], dict[str, Any]]
    deps: tuple[str, ...]
    inputs: Callable[[RunConfig], Any]  # the config fields this stage reads
    dir_inputs: Callable[[RunConfig], Any] | None = None  # what names its directory (default: inputs)


THROUGHPUT_ONLY = {"batch_size", "engine_in_flight"}  # data fields that change speed, never the text: not in a key


def _data_key(c: RunConfig, leave_out: set[str]) -> dict[str, Any]:
    """The data fields a regeneration's text depends on; data.server and its model only when set, so a run
    that names none keys its stages as before the fields existed."""
    unset = {"server", "server_model"} if not c.data.server else set()
    return c.data.model_dump(exclude=THROUGHPUT_ONLY | leave_out | unset)


STAGES: tuple[Stage, ...] = (
    Stage("prompts", "check the prompt source", S.prompts, (), lambda c: (c.data.source, c.data.conversations)),
    Stage(
        "regenerate",
        "regenerate answers with the target",
        S.regenerate,
        (),
        lambda c: (_data_key(c, set()),),
        lambda c: (_data_key(c, {"conversations"}),),
    ),
    Stage(
        "vocab",
        "build the draft vocabulary",
        S.vocab,
        ("regenerate",),
        lambda c: (c.vocab.model_dump(), c.data.max_length, c.train.heldout_fraction, c.train.init_from),
    ),
    # the capture dtype as resolved on this machine: "auto" captures bf16 on one machine and fp32 on another
    Stage(
        "features",
        "capture target features",
        S.features,
        ("regenerate",),
        lambda c: (c.data.max_length, c.train.features, str(runtime_dtype(c.train.capture_dtype))),
    ),
    # the family section's non-default knobs (none for EAGLE-3, whose keys predate the section); the stages
    # after train see them through its key, the features only through the taps the family chose
    Stage(
        "train",
        "train the draft",
        S.train,
        ("vocab", "features"),
        lambda c: {**c.train.model_dump(), **c.family.changed()},
    ),
    Stage(
        "export",
        "export for the engines",
        S.export,
        ("train",),
        lambda c: list(c.formats) + ([f"target_gguf={c.target_gguf}"] if c.target_gguf else []),
    ),
    Stage("doctor", "doctor every export", S.doctor, ("export",), lambda c: None),
    Stage("bench", "benchmark", S.bench, ("train",), lambda c: c.bench.model_dump()),
)


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def stage_keys(cfg: RunConfig, target: Target, taps: tuple[int, ...]) -> dict[str, tuple[str, str]]:
    """{stage: (key, directory key)}; both chain the target identity and the taps in."""
    root = {"target": target.identity.__dict__, "taps": list(taps)}
    keys: dict[str, tuple[str, str]] = {}
    for st in STAGES:
        up = [keys[d][0] for d in st.deps]
        key = _sha([root, st.name, st.inputs(cfg), up])
        dkey = _sha([root, st.name, st.dir_inputs(cfg), up]) if st.dir_inputs else key
        keys[st.name] = (key, dkey)
    return keys


RUN = "$RUN"  # how state.json writes a path inside the run folder: valid wherever the folder is moved or copied


def _to_run(obj: Any, roots: tuple[str, ...]) -> Any:
    """`obj` with every string that is a path under one of `roots` written relative to the run folder."""
    if isinstance(obj, dict):
        return {k: _to_run(v, roots) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_run(v, roots) for v in obj]
    if isinstance(obj, str):
        for root in roots:
            if obj == root or obj.startswith(root + "/"):
                return RUN + obj[len(root) :]
    return obj


def _from_run(obj: Any, out: Path) -> Any:
    if isinstance(obj, dict):
        return {k: _from_run(v, out) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_from_run(v, out) for v in obj]
    if isinstance(obj, str) and (obj == RUN or obj.startswith(RUN + "/")):
        return str(out) + obj[len(RUN) :]
    return obj


def _digest(files: dict[str, str]) -> str:
    return _sha(sorted(files.items()))


class RunState:
    """OUT/state.json: per stage its key, its folder and result (paths relative to the run folder), the
    digests of the files it wrote and of the stage outputs it read, so a reuse is refused when they changed."""

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = self.out / "state.json"
        self.data: dict[str, Any] = {"format": STATE_FORMAT, "stages": {}}
        if self.path.is_file():
            found = read_json_object(self.path, what="a run state")
            if (
                found.get("format") != STATE_FORMAT
                or not isinstance(found.get("stages"), dict)
                or not all(
                    isinstance(r, dict) and isinstance(r.get("dir"), str) and "key" in r
                    for r in found["stages"].values()
                )
            ):
                raise EaglewireError(
                    f"{self.path} is not an eaglewire run state",
                    expected=f"{STATE_FORMAT} with a record (key, dir) per stage",
                    found=str(found.get("format"))[:80],
                    fix="use another --out directory",
                )
            for name, rec in found["stages"].items():  # an older state wrote paths as the first run saw them
                if not rec["dir"].startswith(RUN):
                    found["stages"][name] = _to_run(rec, (str(Path(rec["dir"]).parent.parent),))
            self.data = found

    def records(self) -> dict[str, dict[str, Any]]:
        """Every stage's record, its paths resolved against where the run folder is now."""
        return _from_run(self.data["stages"], self.out)

    def finished(self, name: str, key: str) -> dict[str, Any] | None:
        rec = self.data["stages"].get(name)
        return _from_run(rec, self.out) if rec is not None and rec["key"] == key else None

    def record(
        self, name: str, key: str, directory: Path, result: dict[str, Any], seconds: float, deps: tuple[str, ...] = ()
    ) -> None:
        files = tree_digest(directory)
        self.data["stages"][name] = _to_run(
            {
                "key": key,
                "dir": str(directory),
                "result": result,
                "seconds": seconds,
                "files": files,
                "inputs": {d: self.data["stages"][d].get("digest") for d in deps},
                "digest": _digest(files),
            },
            (str(self.out), str(self.out.resolve())),
        )
        atomic_write_json(self.path, self.data)

    def require_unchanged(self, name: str, directory: Path, deps: tuple[str, ...]) -> None:
        """A finished stage is reused only if its files and the upstream outputs it read are as recorded."""
        rec = self.data["stages"][name]
        redo = f"delete {directory} (and the folders of the stages after it) to redo it, or restore the files"
        if "files" in rec:  # (a state written before digests were recorded has none to compare)
            now = tree_digest(directory)
            was = rec["files"]
            changed = [
                f"{k} ({'removed' if k not in now else 'added' if k not in was else 'changed'})"
                for k in sorted(was.keys() | now.keys())
                if was.get(k) != now.get(k)
            ]
            if changed:
                raise EaglewireError(
                    f"stage {name}'s output in {directory} changed on disk since it finished",
                    expected="the files the stage wrote, unchanged (size and sampled sha256)",
                    found=", ".join(changed[:4]) + (" ..." if len(changed) > 4 else ""),
                    fix=redo,
                )
        for d in deps:
            used, now_d = rec.get("inputs", {}).get(d), self.data["stages"].get(d, {}).get("digest")
            if used is not None and used != now_d:
                raise EaglewireError(
                    f"stage {name} was made from another output of stage {d} than the one on disk",
                    expected=f"{d}'s output as {name} read it",
                    found=f"{d} was redone or changed since",
                    fix=redo,
                )


def resolve_taps(cfg: RunConfig, target: Target) -> tuple[int, ...]:
    """The config's taps, else the trained family's default ones (train/objectives.py)."""
    from eaglewire.train.objectives import objective

    return tuple(cfg.taps) if cfg.taps is not None else objective(cfg.family.name).default_taps(target.num_layers)


def _load_run_target(cfg: RunConfig, log: Callable[[str], None]) -> Target:
    """The run's target on the run config's device (compose.device decides: cuda when visible), in bfloat16
    on a GPU, float32 on the CPU (hw.default_dtype_name)."""
    import torch

    from eaglewire.compose import device
    from eaglewire.hw import default_dtype_name

    where = device(cfg.device, log)
    return load_target(cfg.target, device=where, dtype=getattr(torch, default_dtype_name(where)))


def run_pipeline(
    cfg: RunConfig,
    out: Path,
    *,
    progress: Callable[[str, float, float | None, str], None],
    log: Callable[[str], None],
    target: Target | None = None,
    command: str = "",
) -> dict[str, Any]:
    """Run (or resume) every stage, then write the report (naming `command`, the line that ran it). Returns
    summary.json's content."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with output_lock(out):  # one `run` per run folder
        return _run(cfg, out, progress, log, target, command)


def _run(
    cfg: RunConfig,
    out: Path,
    progress: Callable[[str, float, float | None, str], None],
    log: Callable[[str], None],
    target: Target | None,
    command: str = "",
) -> dict[str, Any]:
    from eaglewire.pipeline.report import write_report

    atomic_write_json(out / "run_config.json", cfg.model_dump(mode="json"))
    target = target or _load_run_target(cfg, log)
    taps = resolve_taps(cfg, target)
    keys, state = stage_keys(cfg, target, taps), RunState(out)
    ctx = S.Ctx(cfg, out, target, target.contract(taps), log=log, command=command)
    timings: dict[str, dict[str, Any]] = {}
    for i, st in enumerate(STAGES):
        key, dkey = keys[st.name]
        work = out / "work" / f"{st.name}-{dkey[:12]}"
        done = state.finished(st.name, key) if work.is_dir() else None  # a removed folder is redone
        if done is not None:
            state.require_unchanged(st.name, work, st.deps)
        ctx.progress = lambda a, b, detail, _n=st.name: progress(_n, a, b, detail)
        if done is not None:
            log(f"[{i + 1}/{len(STAGES)}] {st.title}: done earlier ({done['seconds']:.0f} s), kept")
            result, secs, reused = done["result"], done["seconds"], True
        else:
            log(f"[{i + 1}/{len(STAGES)}] {st.title} …")
            progress(st.name, 0, None, "")
            work.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            result = st.fn(ctx, work)
            secs = time.perf_counter() - t0
            state.record(st.name, key, work, result, secs, st.deps)
            reused = False
        ctx.results[st.name], ctx.dirs[st.name] = result, work
        timings[st.name] = {"seconds": secs, "reused": reused, "dir": str(work)}
        progress(st.name, 1, 1, "done")
    return write_report(ctx, timings)
