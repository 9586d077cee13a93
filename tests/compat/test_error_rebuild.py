"""``AsyncResult.get()`` re-raises a task's exception as Celery rebuilds it with its JSON
serializer: ``cls(*args)``, so attributes its ``__init__`` sets come back."""

from __future__ import annotations

from pyrula.workflows.serialization import ErrorInfo
from pyrula_compat.errors import rebuild


class CodeError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(code, message)
        self.code = code


def round_trip(exc: BaseException) -> BaseException:
    return rebuild(ErrorInfo.from_json(ErrorInfo.from_exception(exc).to_json()))


def test_an_exception_comes_back_with_its_arguments() -> None:
    back = round_trip(CodeError(404, "not found"))
    assert type(back) is CodeError and back.args == (404, "not found") and back.code == 404  # type: ignore[attr-defined]
    missing = round_trip(FileNotFoundError(2, "No such file", "/x"))
    assert isinstance(missing, FileNotFoundError) and missing.filename == "/x"


def test_records_without_args_rebuild_from_the_message() -> None:
    old = ErrorInfo.from_exception(KeyError("x"))
    old = ErrorInfo.from_json(old.to_json().replace(',"args":["x"]', ""))
    assert old.args is None
    back = rebuild(old)
    assert type(back) is KeyError and back.args == ("x",)
