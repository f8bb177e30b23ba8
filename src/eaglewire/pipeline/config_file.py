"""A run config file (`eaglewire run --config`) read as plain data: YAML or JSON, bounded in size and depth,
with YAML's aliases, tags and duplicate keys refused (a run config holds plain values); the schema
(pipeline/config.py) then validates what it says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eaglewire.errors import EaglewireError

MAX_CONFIG_BYTES = 1 << 20  # a run config is a few hundred bytes
MAX_CONFIG_DEPTH = 32  # a run config nests sections two or three deep


def _refuse_yaml_aliases(path: Path, text: str) -> None:
    """Aliases (`*a`) are refused: nested ones expand exponentially (a 'billion laughs' file), and a run
    config has no use for them; so are tags (`!!set`, `!!binary`, ...): a run config holds plain values.
    Nesting deeper than MAX_CONFIG_DEPTH is refused while the events stream, so a hostile file costs a few events,
    not a full pure-Python parse of every level (three of them below).
    Duplicate mapping keys are refused too (YAML keeps the last silently)."""
    import yaml

    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        depth += isinstance(event, yaml.CollectionStartEvent) - isinstance(event, yaml.CollectionEndEvent)
        if depth > MAX_CONFIG_DEPTH:
            raise EaglewireError(
                f"run config {path} nests deeper than {MAX_CONFIG_DEPTH} levels",
                expected=f"sections of plain values (at most {MAX_CONFIG_DEPTH} levels: MAX_CONFIG_DEPTH)",
                found=f"level {depth} at line {event.start_mark.line + 1}",
                fix="point --config at the run's YAML config (eaglewire run --help lists its sections)",
            )
        if isinstance(event, yaml.AliasEvent):
            raise EaglewireError(
                f"run config {path} uses a YAML alias (*{event.anchor})",
                expected="plain values (no anchors or aliases)",
                found=f"*{event.anchor}",
                fix="write the value out where it is used",
            )
        if getattr(event, "tag", None) is not None:  # only a tag written in the file is set: !!set, !!binary, ...
            raise EaglewireError(
                f"run config {path} uses a YAML tag ({event.tag})",
                expected="plain values, lists and mappings (no tags)",
                found=f"{event.tag} at line {event.start_mark.line + 1}",
                fix="write the value as a plain list or mapping (a set is a list here)",
            )
    _refuse_yaml_duplicates(path, yaml.compose(text, Loader=yaml.SafeLoader))


def _refuse_yaml_duplicates(path: Path, node: Any) -> None:
    import yaml

    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, yaml.MappingNode):
            seen = set()
            for k, v in n.value:
                if isinstance(k, yaml.ScalarNode) and k.value in seen:
                    raise EaglewireError(
                        f"run config {path} names {k.value!r} twice in one mapping",
                        expected="each key once",
                        found=f"{k.value!r} again at line {k.start_mark.line + 1}",
                        fix="keep one of them (YAML would silently keep the last)",
                    )
                seen.add(k.value if isinstance(k, yaml.ScalarNode) else id(k))
                stack.append(v)
        elif isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)


def read_config_file(path: Path) -> dict[str, Any]:
    """The sections of the config file at `path`, as a mapping; a missing, oversized, unparsable or
    non-mapping file is refused, naming what was found."""
    if not path.is_file():
        raise EaglewireError(
            f"run config {path} not found",
            expected="a YAML or JSON file",
            found="nothing",
            fix="check the --config path",
        )
    import yaml  # a transformers dependency

    from eaglewire.safeio import DuplicateKey, unique_keys

    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise EaglewireError(
            f"run config {path} is too large",
            expected=f"at most {MAX_CONFIG_BYTES} bytes (MAX_CONFIG_BYTES)",
            found=f"{path.stat().st_size} bytes",
            fix="point --config at the run's YAML/JSON config",
        )
    try:
        text = path.read_bytes().decode("utf-8")
        if path.suffix in (".yaml", ".yml"):
            _refuse_yaml_aliases(path, text)
            data = yaml.safe_load(text)
        else:
            data = json.loads(text, object_pairs_hook=unique_keys)
    except (yaml.YAMLError, json.JSONDecodeError, DuplicateKey, UnicodeDecodeError, RecursionError, OSError) as err:
        raise EaglewireError(
            f"cannot parse run config {path}",
            expected="valid UTF-8 YAML/JSON",
            found=f"{type(err).__name__}: {str(err)[:300]}",
            fix="correct the file (YAML tags like !!python/object are refused)",
        ) from None
    if not isinstance(data, dict):
        raise EaglewireError(
            f"run config {path} is not a mapping",
            expected="sections data/vocab/train/bench/...",
            found=type(data).__name__,
            fix="write the config as a mapping of sections (README: run config)",
        )
    return data
