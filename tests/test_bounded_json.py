"""The bounded JSON decoder for bytes nobody vouches for (warmd.boundedjson): refusals are
JsonRefused, never RecursionError or another error; NotJson only for what does not parse."""

from __future__ import annotations

import json

import pytest

from warmd.boundedjson import MAX_DEPTH, JsonRefused, NotJson, loads, loads_as, nests_too_deep


def _nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_values_within_bounds_decode_as_json_would():
    value = {"child_paths": {"a.cubin": "/x/a.cubin"}, "n": [1, 2.5, None, True]}
    raw = json.dumps(value).encode()
    assert loads(raw, len(raw)) == value
    assert loads(_nested(MAX_DEPTH), 1 << 20) is not None
    in_string = {"s": "[" * (MAX_DEPTH + 8)}  # brackets inside strings are not nesting
    assert loads(json.dumps(in_string), 100) == in_string


@pytest.mark.parametrize("raw, why", [
    (_nested(MAX_DEPTH + 1), "deeper"),
    (_nested(100_000), "deeper"),  # json.loads: RecursionError
    (b'{"tactic": NaN}', "NaN is not a number"),
    (b"[Infinity]", "Infinity"),
    (b"1" * 101, "over the 100-byte limit"),
])
def test_out_of_bounds_is_refused_before_parsing(raw, why):
    with pytest.raises(JsonRefused, match=why) as refused:
        loads(raw, 100 if len(raw) == 101 else len(raw))
    assert not isinstance(refused.value, NotJson)


@pytest.mark.parametrize("raw", [b'{"half": ', b"not json", b"\xff\xfe", b"[}", b""])
def test_what_does_not_parse_is_not_json(raw):
    with pytest.raises(NotJson):
        loads(raw, 1 << 20)


def test_depth_is_measured_without_recursion():
    assert nests_too_deep(_nested(1_000_000)) and not nests_too_deep(_nested(MAX_DEPTH))


def test_a_stored_value_of_another_shape_reads_as_an_empty_one():
    assert loads_as(None, dict, 100) == {}
    assert loads_as(b'{"a": 1}', dict, 100) == {"a": 1}
    assert loads_as(b'["a"]', dict, 100) == {}
    assert loads_as(b'["a"]', list, 100) == ["a"]
    assert loads_as(b"not json", list, 100) == []
    assert loads_as(b'{"a": NaN}', dict, 100) == {}
    assert loads_as(b'{"a": "%s"}' % (b"x" * 200), dict, 100) == {}
