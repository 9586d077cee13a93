"""ErrorInfo: how an exception is stored and rebuilt, and what is never called."""

from __future__ import annotations

import json

import pytest

from pyrula.workflows.errors import DurableInvocationError, NotJSONSerializable
from pyrula.workflows.serialization import ErrorInfo, decode, encode

CALLED: list[str] = []


def not_an_exception(*args: object) -> None:
    """If stored error data could make pyrula call this, CALLED would say so."""
    CALLED.append("called")


class NeedsArgs(Exception):
    inits = 0

    def __init__(self, code: int, detail: str) -> None:
        type(self).inits += 1
        super().__init__(f"{code}: {detail}")


class Outer:
    class InnerError(LookupError):
        pass


def raiser() -> None:
    raise NeedsArgs(7, "seven")


def test_from_exception_records_type_message_and_traceback() -> None:
    try:
        raiser()
    except NeedsArgs as exc:
        info = ErrorInfo.from_exception(exc)
    assert info.type_module == __name__
    assert info.type_name == "NeedsArgs"
    assert info.qualified_type == f"{__name__}.NeedsArgs"
    assert info.message == "7: seven"
    assert "in raiser" in info.traceback
    assert ErrorInfo.from_json(info.to_json()) == info


def test_rebuild_makes_the_class_without_calling_init() -> None:
    info = ErrorInfo(__name__, "NeedsArgs", "7: seven", "")
    before = NeedsArgs.inits
    rebuilt = info.rebuild()
    assert type(rebuilt) is NeedsArgs
    assert rebuilt.args == ("7: seven",)
    assert str(rebuilt) == "7: seven"
    assert NeedsArgs.inits == before


def test_rebuild_of_builtins_and_nested_classes() -> None:
    assert type(ErrorInfo("builtins", "KeyError", "k", "").rebuild()) is KeyError
    assert type(ErrorInfo("builtins", "SystemExit", "3", "").rebuild()) is SystemExit
    nested = ErrorInfo(__name__, "Outer.InnerError", "inner", "").rebuild()
    assert type(nested) is Outer.InnerError


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("os", "system"),  # a function that would run a shell command
        ("subprocess", "Popen"),  # a class, but not an exception
        ("builtins", "eval"),
        ("builtins", "object"),
        (__name__, "not_an_exception"),
        (__name__, "CALLED"),
        ("no.such.module", "Error"),
        ("builtins", "NoSuchError"),
        (__name__, "test_rebuild_of_builtins_and_nested_classes.<locals>.Local"),
        ("builtins", "ValueError.__init__"),
    ],
)
@pytest.mark.parametrize("args", [None, ("rm -rf /",)], ids=["no-args", "args"])
def test_rebuild_never_calls_what_is_not_an_exception_class(
    module: str, name: str, args: tuple[str, ...] | None
) -> None:
    info = ErrorInfo(module, name, "rm -rf /", "", args=args)
    assert info.exception_class() is None
    rebuilt = ErrorInfo.from_json(info.to_json()).rebuild()
    assert type(rebuilt) is RuntimeError
    assert str(rebuilt) == f"{module}.{name}: rm -rf /"
    assert CALLED == []


def test_from_json_tolerates_missing_fields() -> None:
    info = ErrorInfo.from_json(json.dumps({"message": "only a message"}))
    assert info.qualified_type == "builtins.Exception"
    assert type(info.rebuild()) is Exception


def test_a_rebuilt_error_surfaces_on_the_invocation_error() -> None:
    error = DurableInvocationError(
        "failed", error_type="x.Y", error_message="m", remote_traceback="tb", original=None
    )
    assert (error.error_type, error.error_message, error.remote_traceback) == ("x.Y", "m", "tb")
    assert error.original is None


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"items": [1, 2, {3}]}, "params['items'][2]"),
        ({"items": [1, 2, object()]}, "params['items'][2]"),
        ({"items": [1, 2, float("nan")]}, "params['items'][2]"),
        ({"items": [1, 2, float("inf")]}, "params['items'][2]"),
        ({"items": [1, 2, float("-inf")]}, "params['items'][2]"),
        ({"items": [1, 2, {1: "one"}]}, "params['items'][2]"),
        ({"a": {"b": (1, b"x")}}, "params['a']['b'][1]"),
    ],
)
def test_encode_names_the_offending_path(value: object, path: str) -> None:
    with pytest.raises(NotJSONSerializable) as caught:
        encode(value, what="params")
    assert caught.value.path == path
    assert path in str(caught.value)


def test_encode_is_compact_and_a_tuple_round_trips_as_a_list() -> None:
    text = encode({"t": (1, "é")})
    assert text == '{"t":[1,"é"]}'
    assert decode(text) == {"t": [1, "é"]}
