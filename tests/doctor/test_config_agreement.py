"""One validation of config values (eaglewire.export.base.read_draft_config -> eaglewire.limits): over exports
of every layout with one numeric field anywhere in config.json set to a drawn value (sizes far above any model,
zero, negative, bools, strings, floats, NaN, infinities, null, lists), `import` and the doctor's reading never
disagree: a value the limits refuse is refused by both, naming the field; a config import accepts, the doctor
reads. (The regression: `doctor --no-measure` read an SGLang export with num_hidden_layers 10**9 that import
refuses.)"""

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny import build_draft, build_target

from eaglewire.doctor.config_types import FLOAT_FIELDS, INT_FIELDS
from eaglewire.doctor.inspect import inspect_dir
from eaglewire.errors import EaglewireError
from eaglewire.export.convert import export_draft, import_draft
from eaglewire.limits import PHYSICS, SIZE_LIMITS, check_config_values

FORMATS = ("native", "sglang", "vllm", "eagle", "specforge")
NUMERIC = set(SIZE_LIMITS) | set(PHYSICS) | set(INT_FIELDS) | set(FLOAT_FIELDS)


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    d = tmp_path_factory.mktemp("agree")
    draft, contract = build_draft(build_target("llama", layers=8), taps=(2, 4, 5), num_layers=1)
    return {fmt: export_draft(draft, contract, d / fmt, fmt) for fmt in FORMATS}


def _numeric_leaves(obj, path=()):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if isinstance(v, dict):
                yield from _numeric_leaves(v, path + (k,))
            elif k in NUMERIC:
                yield path + (k,)


values = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, -1, 1, 10**9, 2**31, True, False, None, "lots", "64", 1.5, 1e300, [], {}]),
    st.floats(allow_nan=True, allow_infinity=True),
)


def _refused(fn) -> EaglewireError | None:
    try:
        fn()
    except EaglewireError as err:
        return err
    return None


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)
@given(data=st.data(), fmt=st.sampled_from(FORMATS), value=values)
def test_import_and_the_doctor_agree_on_every_config_value(exports, tmp_path_factory, data, fmt, value):
    d = tmp_path_factory.mktemp("case") / fmt
    shutil.copytree(exports[fmt], d)
    config = json.loads((d / "config.json").read_text())
    where = data.draw(st.sampled_from(sorted(_numeric_leaves(config))))
    node = config
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    (d / "config.json").write_text(json.dumps(config))
    limits = _refused(lambda: check_config_values(config, "config"))
    imported = _refused(lambda: import_draft(d, fmt))
    if limits is not None:
        assert imported is not None and where[-1] in str(imported), (where, value, str(imported))
    if fmt == "native":
        return  # the doctor checks exports (a native checkpoint is refused as one, whatever its values)
    doctor = _refused(lambda: inspect_dir(d, fmt))
    if limits is not None:
        assert doctor is not None and where[-1] in str(doctor), (where, value, str(doctor))
    if imported is None:
        assert doctor is None, (where, value, str(doctor))


def test_the_reported_case_an_sglang_export_with_a_billion_layers(exports, tmp_path):
    d = tmp_path / "sglang"
    shutil.copytree(exports["sglang"], d)
    config = json.loads((d / "config.json").read_text())
    config["num_hidden_layers"] = 10**9
    (d / "config.json").write_text(json.dumps(config))
    with pytest.raises(EaglewireError, match="num_hidden_layers"):
        inspect_dir(d, "sglang")
    with pytest.raises(EaglewireError, match="num_hidden_layers"):
        import_draft(d, "sglang")
