"""Valid files of each format, mutated (bytes, types, sizes, encodings, duplicate keys), through the command or
the reader that takes them: each ends in success or in one clean error (exit 2, no traceback, the file
named), no size is used before it is bounded, and no output is written by a failed command.

CI runs CASES generated files per format (FORMATS below): 5 formats x CASES."""

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import build_draft, build_model, build_target
from typer.testing import CliRunner

from eaglewire.cli.app import app
from eaglewire.data.conversations import read_conversations
from eaglewire.errors import EaglewireError
from eaglewire.export.checkpoint import save_checkpoint

CASES = 15
SETTINGS = settings(
    max_examples=CASES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)

numbers = st.one_of(
    st.integers(-2, 2),
    st.integers(10**6, 10**13),
    st.sampled_from([1e12, 1e308, 1e-30, -1.0, 0.0, float("inf"), 5e-324]),
)
values = st.one_of(
    numbers,
    st.none(),
    st.booleans(),
    st.text(max_size=4),
    st.lists(st.integers(0, 3), max_size=2),
    st.just({"factor": 1e9}),
)


def _mutate_bytes(raw: bytes, data) -> bytes:
    kind = data.draw(st.sampled_from(["flip", "cut", "insert"]))
    i = data.draw(st.integers(0, max(len(raw) - 1, 0)))
    if kind == "flip":
        return raw[:i] + bytes([raw[i] ^ data.draw(st.integers(1, 255))]) + raw[i + 1 :] if raw else b"\xff"
    if kind == "cut":
        return raw[:i]
    return raw[:i] + data.draw(st.sampled_from([b"\xff\xfe", b"\x00", b'"', b"[/]", b"\x1f\x8b"])) + raw[i:]


def _mutate_json(obj: dict, data, keys: list[str]) -> bytes:
    """A field set to a drawn value, a key given twice, or the bytes damaged."""
    kind = data.draw(st.sampled_from(["value", "duplicate", "bytes"]))
    if kind == "value":
        obj = {**obj, data.draw(st.sampled_from(keys)): data.draw(values)}
        return json.dumps(obj).encode()
    text = json.dumps(obj)
    if kind == "duplicate":
        key = data.draw(st.sampled_from(keys))
        return (text[:-1] + f', "{key}": {json.dumps(obj.get(key, 1))}}}').encode()
    return _mutate_bytes(text.encode(), data)


def _clean_failure(r, path: Path) -> None:
    assert r.exit_code in (0, 2), (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output
    if r.exit_code == 2:
        assert path.name in "".join(r.output.split()), r.output


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory):
    d = tmp_path_factory.mktemp("tgt")
    build_model("llama").save_pretrained(d / "m")
    return d / "m"


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    draft, contract = build_draft(build_target("llama"), num_layers=1)
    return save_checkpoint(draft, contract, tmp_path_factory.mktemp("ckpt") / "native")


TARGET_KEYS = [
    "num_hidden_layers",
    "hidden_size",
    "intermediate_size",
    "vocab_size",
    "num_attention_heads",
    "num_key_value_heads",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "max_position_embeddings",
]


@SETTINGS
@given(data=st.data())
def test_a_mutated_target_config(tiny_target, data):
    with tempfile.TemporaryDirectory() as d:
        t = Path(d) / "t"
        t.mkdir()
        for f in tiny_target.iterdir():
            (t / f.name).symlink_to(f)
        (t / "config.json").unlink()
        cfg = json.loads((tiny_target / "config.json").read_text())
        (t / "config.json").write_bytes(_mutate_json(cfg, data, TARGET_KEYS))
        r = CliRunner().invoke(app, ["target", "info", "--target", str(t), "--json"])
        _clean_failure(r, t)


DRAFT_KEYS = [
    "hidden_size",
    "intermediate_size",
    "num_layers",
    "vocab_size",
    "draft_vocab_size",
    "rms_norm_eps",
    "rope_theta",
    "num_taps",
    "target_hidden_size",
    "head_dim",
]


@SETTINGS
@given(data=st.data())
def test_a_mutated_native_checkpoint_config_writes_no_export(native, data):
    with tempfile.TemporaryDirectory() as d:
        ck = Path(d) / "ck"
        ck.mkdir()
        (ck / "model.safetensors").symlink_to(native / "model.safetensors")
        meta = json.loads((native / "config.json").read_text())
        if data.draw(st.booleans()):
            raw = _mutate_json(meta["draft"], data, DRAFT_KEYS)
            try:
                meta = {**meta, "draft": json.loads(raw)}
                raw = json.dumps(meta).encode()
            except ValueError:
                pass
        else:
            raw = _mutate_json(meta, data, sorted(meta))
        (ck / "config.json").write_bytes(raw)
        out = Path(d) / "out"
        r = CliRunner().invoke(app, ["export", str(ck), "--format", "vllm", "--out", str(out)])
        _clean_failure(r, ck)
        assert r.exit_code == 0 or not out.exists()


def _conversations() -> bytes:
    recs = [
        {"id": f"c{i}", "messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(6)
    ]
    return "".join(json.dumps(r) + "\n" for r in recs).encode()


@SETTINGS
@given(data=st.data(), gz=st.booleans())
def test_a_mutated_conversation_file(data, gz):
    raw = _conversations()
    if data.draw(st.booleans()):  # a record of the wrong types
        field = data.draw(st.sampled_from(["messages", "conversations", "id", "turns"]))
        raw += (json.dumps({field: data.draw(values)}) + "\n").encode()
        raw = gzip.compress(raw, mtime=0) if gz else raw
    else:
        raw = _mutate_bytes(gzip.compress(raw, mtime=0) if gz else raw, data)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / ("c.jsonl.gz" if gz else "c.jsonl")
        path.write_bytes(raw)
        try:
            n = sum(1 for _ in read_conversations(str(path)))
            assert 0 <= n <= 7
        except EaglewireError as err:
            assert str(path) in err.what and err.expected and err.found and err.fix


RUN = {"data": {"conversations": 16, "max_new_tokens": 8, "engine": "local"}, "train": {"max_steps": 4, "lr": 1e-3}}


@SETTINGS
@given(data=st.data(), yaml_file=st.booleans())
def test_a_mutated_run_config(data, yaml_file):
    import yaml

    kind = data.draw(st.sampled_from(["value", "bytes", "alias", "duplicate", "tag"]))
    if kind == "value":
        section = data.draw(st.sampled_from(sorted(RUN)))
        obj = {**RUN, section: {**RUN[section], data.draw(st.sampled_from(sorted(RUN[section]))): data.draw(values)}}
        text = yaml.safe_dump(obj) if yaml_file else json.dumps(obj)
    elif kind == "alias" and yaml_file:
        text = "a: &a [x, x]\n" + "".join(f"{c}: &{c} [*{p}, *{p}]\n" for p, c in zip("abcdefgh", "bcdefghi"))
    elif kind == "duplicate":
        text = "train:\n  max_steps: 3\ntrain:\n  lr: 1\n" if yaml_file else '{"train": {}, "train": {}}'
    elif kind == "tag" and yaml_file:  # any tag written in the file, on any value (a set of formats, ...)
        tag = data.draw(st.sampled_from(["!!set", "!!omap", "!!binary", "!!str", "!!python/tuple", "!!int", "!x"]))
        value = {"!!set": "{sglang, vllm}", "!!omap": "[a: 1]", "!!binary": "aGk=", "!!python/tuple": "[vllm]"}
        text = f"formats: {tag} {value.get(tag, '[sglang]')}\n"
    else:
        text = _mutate_bytes((yaml.safe_dump(RUN) if yaml_file else json.dumps(RUN)).encode(), data).decode("latin-1")
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / ("run.yaml" if yaml_file else "run.json")
        path.write_bytes(text.encode("latin-1", errors="replace") if kind == "bytes" else text.encode())
        r = CliRunner().invoke(app, ["run", "--config", str(path), "--show-config", "--out", str(Path(d) / "o")])
        _clean_failure(r, path)
        assert not (Path(d) / "o").exists()
        if kind in ("alias", "duplicate") or kind == "tag" and yaml_file:
            assert r.exit_code == 2 and (kind != "tag" or "YAML tag" in r.output), r.output
