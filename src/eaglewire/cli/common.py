"""What every command module shares: the consoles, error formatting (applied once, where a command is
registered), loading the target with a status line, the option parsers, and options made from pydantic
fields (`field_options`, `field_values`: a knob declared once becomes an option).

This module imports no command module and not the app: command modules import it, the app imports them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
import typing
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, TypeVar

import typer
from pydantic import ConfigDict, ValidationError, create_model
from rich.console import Console
from rich.text import Text

from eaglewire.contract import CANONICAL, CONVENTIONS, default_taps, from_engine
from eaglewire.errors import EaglewireError
from eaglewire.hw import DEVICE_DEFAULT

if typing.TYPE_CHECKING:  # types only: the light commands (wiring translate, --help) never import torch
    from eaglewire.target.protocol import RunnableTarget, TargetInfo

# The one printer: text is printed as it is, never read as rich markup. Messages carry what came from outside
# (file content, record ids, paths, request fields, arguments), and a `[/]`, `[bold]` or `:smile:` in those must neither
# raise MarkupError nor vanish; styled words go through `styled`, which styles only the words it is given.
err_console = Console(stderr=True, markup=False, emoji=False)
out_console = Console(markup=False, emoji=False)


def styled(*parts: str | tuple[str, str]) -> Text:
    """A line of plain strings and (text, style) pairs: the style applies to that text only, and no part is
    ever parsed as markup."""
    return Text.assemble(*parts)


CONV_NAMES = ", ".join(CONVENTIONS)


def friendly(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print EaglewireError as its what/expected/found/fix message (exit 2) instead of a traceback."""

    @functools.wraps(fn)  # typer reads the wrapped signature through __wrapped__
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from eaglewire.paths import os_error

        try:
            _check_paths(kwargs)
            return fn(*args, **kwargs)
        except EaglewireError as err:
            err_console.print(styled(("error:", "bold red"), f" {err}"), highlight=False)
            raise typer.Exit(2) from None
        except OSError as err:  # a full disk, a read-only folder, a port in use: what failed and how to fix it
            err_console.print(styled(("error:", "bold red"), f" {os_error(err)}"), highlight=False)
            raise typer.Exit(2) from None

    return wrapper


def _check_paths(kwargs: dict[str, Any]) -> None:
    """Every path argument through eaglewire.paths.check_path before the command runs (loops, dangling links,
    folders that may not be searched), named by its option."""
    from eaglewire.paths import check_path

    for name, value in kwargs.items():
        for v in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(v, Path):
                check_path(v, f"--{name.replace('_', '-')}")


def add_command(group: typer.Typer, fn: Callable[..., Any], name: str, **kwargs: Any) -> None:
    """Register `fn` as `name` on `group` with the error formatting every command gets."""
    group.command(name, **kwargs)(friendly(fn))


@contextlib.contextmanager
def progress(title: str) -> Iterator[Callable[[str], None]]:
    """A long step's progress: a status line on a terminal; where stderr is not one (a CI log, a pipe), one
    line per phase with the seconds elapsed, and a closing line, so a log is never silent for minutes.
    Yields `say(phase)`, which the step calls as each phase starts."""
    t0 = time.perf_counter()
    if err_console.is_terminal:
        with err_console.status(title) as status:
            yield lambda phase: status.update(f"{title}: {phase}")
        return

    def say(phase: str) -> None:
        err_console.print(f"[{time.perf_counter() - t0:6.1f} s] {title}: {phase}", highlight=False, soft_wrap=True)

    say("started")
    yield say
    say("done")


def decide_device(device: str = DEVICE_DEFAULT) -> str:
    """The process's device (eaglewire.compose.device), said on stderr as the command's first line."""
    from eaglewire.compose import device as decide

    return decide(device, log=lambda line: err_console.print(line, highlight=False, soft_wrap=True))


def load_target(target: Optional[str], device: str = DEVICE_DEFAULT, **kwargs: Any) -> Any:
    """The target on the decided device (`--device`; bfloat16 on a GPU unless a dtype is given), with a status
    line: the first use of the embedded default converts its GGUF."""
    import torch

    from eaglewire.hw import default_dtype_name
    from eaglewire.target.loader import load_target as load

    where = decide_device(device)
    kwargs["dtype"] = kwargs.get("dtype") or getattr(torch, default_dtype_name(where))
    with err_console.status("loading target (the first run converts the embedded GGUF, ~30 s)"):
        return load(target, device=where, **kwargs)


def load_target_weights(target: Optional[str]) -> Any:
    """The target's config, tokenizer and weight index, not its weights (offline training reads a few
    tensors by name): target.weights.load_target_weights, with the same status line."""
    from eaglewire.target.weights import load_target_weights as load

    with err_console.status(
        "reading the target's config and weight index (the first run converts the embedded GGUF, ~30 s)"
    ):
        return load(target)


def parse_ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise EaglewireError(
            "could not parse a list of layer ids", expected="comma-separated ints, e.g. 2,15,27", found=text
        ) from None


def resolve_convention(name: Optional[str], target: TargetInfo | None) -> Optional[str]:
    """A --taps-from name as a contract convention: an engine whose rule is per model file (sglang) resolves
    to the rule of the target's architecture in its newest verified release."""
    from eaglewire.export.engines import ENGINES

    record = ENGINES.get(name or "")
    return record.convention_for(target.identity.architecture) if record and record.per_model_file else name


def parse_taps(target: TargetInfo, taps: Optional[str], source: str = CANONICAL) -> tuple[int, ...]:
    """--taps in convention `source` as boundaries; the default taps when omitted."""
    if not taps:
        return default_taps(target.num_layers)
    return from_engine(parse_ints(taps), resolve_convention(source, target) or source, target.num_layers)


def parse_dtype(name: str, allowed: dict[str, str], option: str) -> str:
    """The value of dtype option `option` (one of `allowed`'s keys) as a torch dtype name."""
    if name not in allowed:
        raise EaglewireError(f"unknown {option}", expected=" | ".join(allowed), found=name)
    return allowed[name]


def read_samples(
    target: RunnableTarget, data: str, max_length: int, limit: Optional[int], split_turns: bool, skip: int = 0
) -> list:
    """Tokenized, loss-masked samples of `data` (valid conversations [skip, skip + limit)), with what was
    read and kept said on stderr."""
    from eaglewire.data.conversations import ReadStats
    from eaglewire.data.samples import load_samples

    read = ReadStats()
    samples, stats = load_samples(
        data, target.tokenizer, max_length=max_length, limit=limit, skip=skip, split_turns=split_turns, read_stats=read
    )
    err_console.print(f"source: {read.summary()}\ndata: {stats.summary()}")
    return samples


F = TypeVar("F", bound=Callable[..., Any])


def _is_tuple(annotation: Any) -> bool:
    return typing.get_origin(annotation) is tuple


def _is_path(info: Any) -> bool:
    return isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("format") == "path"


def _field_help(annotation: Any, info: Any) -> str:
    """The field's description as a sentence, with its valid values and bounds (enforced by field_values)."""
    text = info.description[0].upper() + info.description[1:] + "."
    if typing.get_origin(annotation) is typing.Literal:
        text += " One of: " + ", ".join(repr(c) if c == "" else str(c) for c in typing.get_args(annotation)) + "."
    if _is_tuple(annotation):
        text += " A comma list."
    ops = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    bounds = [f"{ops[k]} {getattr(m, k)}" for m in info.metadata for k in ops if hasattr(m, k)]
    return text + (f" ({', '.join(bounds)})" if bounds else "")


def field_options(fields: dict[str, Any]) -> Callable[[F], F]:
    """Decorator: one option per pydantic field ({name: (annotation, FieldInfo)}, as train.config.knob_fields
    gives them) appended to the command's parameters: `--max-steps` for `max_steps`, the field's default, its
    description as help. A tuple field is a comma list (default ''), a path field ('' = none) a path (default
    None). The command takes them as **kwargs and reads them with `field_values`."""

    def add(fn: F) -> F:
        sig = inspect.signature(fn, eval_str=True)  # typer reads this signature as it is: real types, not strings
        params = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
        for name, (annotation, info) in fields.items():
            cli_type, default = annotation, info.default
            if _is_tuple(annotation):
                cli_type, default = str, ",".join(str(x) for x in default)
            elif _is_path(info):
                cli_type, default = Optional[Path], (Path(default) if default else None)
            elif typing.get_origin(annotation) is typing.Literal:
                cli_type = str
            option = typer.Option(default, "--" + name.replace("_", "-"), help=_field_help(annotation, info))
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=cli_type))
        fn.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        return fn

    return add


def field_values(fields: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """The fields' values from the options `field_options` made, validated against the fields (type, bounds,
    choices): an invalid one is an EaglewireError naming its option."""
    values = {}
    for name, (annotation, info) in fields.items():
        value = options[name]
        if _is_tuple(annotation):
            value = parse_ints(value) if value else ()
        elif _is_path(info):
            value = str(value) if value else ""
        values[name] = value
    model = create_model("Options", __config__=ConfigDict(extra="forbid"), **fields)
    try:
        return dict(model.model_validate(values))
    except ValidationError as err:
        found = "; ".join(f"--{str(e['loc'][0]).replace('_', '-')} {e['input']!r}: {e['msg']}" for e in err.errors())
        raise EaglewireError(
            "invalid option value", expected="the values each option's help names", found=found, fix="see --help"
        ) from None
