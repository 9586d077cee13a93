"""ErrorInfo keeps an exception's args (plain JSON, small) and rebuilds it as ``cls(*args)``,
falling back to the message when the args can't be stored or the class won't take them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pyrula.workflows.serialization import MAX_ERROR_ARGS_BYTES, ErrorInfo, StoredTraceback


class MultiArgError(Exception):
    pass


class CodeError(Exception):
    inits = 0

    def __init__(self, code: int, detail: str) -> None:
        type(self).inits += 1
        super().__init__(code, detail)
        self.code = code
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.code}: {self.detail}"


class KeywordOnlyError(Exception):
    inits = 0

    def __init__(self, *, code: int) -> None:
        type(self).inits += 1
        super().__init__(f"code {code}")
        self.code = code


class FormattingError(Exception):
    """Its __init__ builds the message, so args hold the message, not what was passed."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} not found")
        self.what = what


class BrokenStrError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def round_trip(exc: BaseException) -> tuple[ErrorInfo, BaseException]:
    """``exc`` stored as JSON text, read back and rebuilt, as the store and caller do."""
    info = ErrorInfo.from_json(ErrorInfo.from_exception(exc).to_json())
    return info, info.rebuild()


def test_several_args_come_back_as_args() -> None:
    info, rebuilt = round_trip(MultiArgError("bad", 42))
    assert info.args == ("bad", 42)
    assert type(rebuilt) is MultiArgError
    assert rebuilt.args == ("bad", 42)
    assert str(rebuilt) == str(MultiArgError("bad", 42))


def test_a_custom_error_is_rebuilt_by_its_init_and_keeps_its_attributes() -> None:
    before = CodeError.inits
    original = CodeError(404, "not found")
    _, rebuilt = round_trip(original)
    assert type(rebuilt) is CodeError
    assert rebuilt.code == 404
    assert rebuilt.detail == "not found"
    assert rebuilt.args == (404, "not found")
    assert str(rebuilt) == "404: not found"
    assert CodeError.inits == before + 2  # the original and the rebuild


def test_an_os_error_keeps_errno_strerror_and_filenames() -> None:
    original = FileNotFoundError(2, "No such file", "/x")
    info, rebuilt = round_trip(original)
    assert info.args == (2, "No such file", "/x")
    assert type(rebuilt) is FileNotFoundError
    assert (rebuilt.errno, rebuilt.strerror, rebuilt.filename) == (2, "No such file", "/x")
    assert rebuilt.args == original.args == (2, "No such file")
    assert str(rebuilt) == str(original) == "[Errno 2] No such file: '/x'"

    two = OSError(2, "No such file", "/a", None, "/b")
    _, rebuilt_two = round_trip(two)
    assert type(rebuilt_two) is FileNotFoundError  # what OSError(2, ...) makes, as before
    assert (rebuilt_two.filename, rebuilt_two.filename2) == ("/a", "/b")
    assert str(rebuilt_two) == str(two)


def test_an_init_that_needs_keywords_falls_back_to_no_init() -> None:
    original = KeywordOnlyError(code=5)
    before = KeywordOnlyError.inits
    info, rebuilt = round_trip(original)
    assert info.args == ("code 5",)
    assert type(rebuilt) is KeywordOnlyError
    assert rebuilt.args == ("code 5",)
    assert str(rebuilt) == "code 5"
    assert not hasattr(rebuilt, "code")
    assert KeywordOnlyError.inits == before


def test_an_init_that_rewrites_the_message_falls_back_to_the_message() -> None:
    _, rebuilt = round_trip(FormattingError("order 7"))
    # FormattingError("order 7 not found") would say "order 7 not found not found".
    assert type(rebuilt) is FormattingError
    assert str(rebuilt) == "order 7 not found"
    assert not hasattr(rebuilt, "what")


@pytest.mark.parametrize(
    "args",
    [
        (object(),),
        (b"bytes",),
        (float("nan"),),
        ({1: "int key"},),
        ("fine", {"nested": {"deeper": {2, 3}}}),
        ("\ud800",),
    ],
    ids=["object", "bytes", "nan", "int-key", "nested-set", "lone-surrogate"],
)
def test_args_that_are_not_json_are_not_stored_and_the_message_rebuilds(
    args: tuple[Any, ...],
) -> None:
    original = ValueError(*args)
    info = ErrorInfo.from_exception(original)
    assert info.args is None
    assert "args" not in json.loads(info.to_json())
    rebuilt = ErrorInfo.from_json(info.to_json()).rebuild()
    assert type(rebuilt) is ValueError
    assert rebuilt.args == (str(original),)
    assert str(rebuilt) == str(original)


def test_circular_args_do_not_break_recording() -> None:
    loop: list[Any] = []
    loop.append(loop)
    info = ErrorInfo.from_exception(ValueError(loop))
    assert info.args is None
    assert type(info.rebuild()) is ValueError


def test_big_ints_and_nested_lists_and_dicts_survive() -> None:
    big = 2**200
    nested = {"a": [1, {"b": [2, -(3**90)]}], "c": None, "d": 1.5, "e": True}
    original = MultiArgError(big, nested, [[1, [2, [3]]], "é"])
    text = ErrorInfo.from_exception(original).to_json()
    assert str(big) in text  # a JSON number, not a float or a string
    rebuilt = ErrorInfo.from_json(text).rebuild()
    assert rebuilt.args == (big, nested, [[1, [2, [3]]], "é"])
    assert type(rebuilt.args[0]) is int
    assert str(rebuilt) == str(original)


def test_a_tuple_inside_args_reads_back_as_a_list_and_str_stays_the_same() -> None:
    original = ValueError((1, 2))
    info, rebuilt = round_trip(original)
    assert info.args == ([1, 2],)
    # ValueError([1, 2]) would print "[1, 2]": the message wins, as before args were kept.
    assert str(rebuilt) == "(1, 2)"
    assert type(rebuilt) is ValueError


def test_key_error_keeps_its_key_instead_of_quoting_it_again() -> None:
    _, rebuilt = round_trip(KeyError("k"))
    assert rebuilt.args == ("k",)
    assert str(rebuilt) == str(KeyError("k")) == "'k'"


def test_args_over_the_size_cap_are_not_stored() -> None:
    fits = "x" * (MAX_ERROR_ARGS_BYTES - 10)  # '["' + fits + '"]' is 4 bytes more
    too_big = "x" * (MAX_ERROR_ARGS_BYTES + 1)
    assert ErrorInfo.from_exception(MultiArgError(fits, 1)).args == (fits, 1)
    info = ErrorInfo.from_exception(MultiArgError(too_big, 1))
    assert info.args is None
    assert len(info.to_json()) < 2 * MAX_ERROR_ARGS_BYTES + 1000  # the message only
    rebuilt = ErrorInfo.from_json(info.to_json()).rebuild()
    assert type(rebuilt) is MultiArgError
    assert str(rebuilt) == str(MultiArgError(too_big, 1))


def test_a_record_written_before_args_were_kept_rebuilds_as_before() -> None:
    old = json.dumps(
        {"module": __name__, "type": "CodeError", "message": "404: not found", "traceback": ""}
    )
    before = CodeError.inits
    info = ErrorInfo.from_json(old)
    assert info.args is None
    assert json.loads(info.to_json()) == json.loads(old)  # written back without args
    rebuilt = info.rebuild()
    assert type(rebuilt) is CodeError
    assert rebuilt.args == ("404: not found",)
    assert not hasattr(rebuilt, "code")
    assert CodeError.inits == before


@pytest.mark.parametrize("args", ["not a list", {"a": 1}, 7, None])
def test_stored_args_that_are_not_a_list_are_ignored(args: object) -> None:
    text = json.dumps({"module": "builtins", "type": "ValueError", "message": "m", "args": args})
    info = ErrorInfo.from_json(text)
    assert info.args is None
    rebuilt = info.rebuild()
    assert (type(rebuilt), rebuilt.args) == (ValueError, ("m",))


def test_args_a_class_refuses_fall_back_without_init() -> None:
    # Stored data naming CodeError with args its __init__ rejects (wrong count).
    info = ErrorInfo(__name__, "CodeError", "404: not found", "", args=(404,))
    before = CodeError.inits
    rebuilt = info.rebuild()
    assert type(rebuilt) is CodeError
    assert rebuilt.args == ("404: not found",)
    assert CodeError.inits == before


def test_a_str_that_raises_falls_back_to_the_message_args() -> None:
    info = ErrorInfo(__name__, "BrokenStrError", "m", "", args=("a", "b"))
    rebuilt = info.rebuild()
    assert type(rebuilt) is BrokenStrError
    assert rebuilt.args == ("m",)


def test_error_info_with_args_stays_hashable_and_equal_after_a_round_trip() -> None:
    info = ErrorInfo.from_exception(MultiArgError("a", [1, 2], {"k": "v"}))
    again = ErrorInfo.from_json(info.to_json())
    assert again == info
    assert hash(again) == hash(info)


def test_an_error_raised_again_from_a_stored_failure_keeps_that_failures_traceback() -> None:
    original = "Traceback (most recent call last):\n  File 'x.py', line 1\nValueError: no\n"
    try:
        raise ValueError("no") from StoredTraceback(original)
    except ValueError as exc:
        info = ErrorInfo.from_exception(exc)
    assert info.traceback == original
    assert info.message == "no"
    try:
        raise ValueError("no") from KeyError("other cause")
    except ValueError as exc:
        chained = ErrorInfo.from_exception(exc).traceback
    assert "KeyError" in chained and "direct cause" in chained  # other causes stay
