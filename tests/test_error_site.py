"""What a failed step's log line may carry: its type and where it failed, and a reason only when
the message is the system's own phrase, never a copy of posted or stored text."""

import sqlite3

import pydantic
import redis

from shared.error_site import loggable_failure

SECRET_TEXT = "the user's private sentence about MT-4471"


class Turn(pydantic.BaseModel):
    ts: int


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def test_a_failure_whose_message_quotes_input_logs_its_type_and_site_but_not_the_text():
    try:
        Turn.model_validate({"ts": SECRET_TEXT})
    except pydantic.ValidationError as exc:
        logged = loggable_failure(exc)
    assert logged["error"] == "pydantic_core._pydantic_core.ValidationError" and "reason" not in logged
    assert "MT-4471" not in repr(logged) and logged["at"], logged
    assert "MT-4471" not in repr(loggable_failure(_raised(ValueError(SECRET_TEXT))))


def test_system_errors_keep_their_own_reason():
    disk = loggable_failure(_raised(OSError(28, "No space left on device", "/data/abc/memory/x.tmp")))
    assert disk["error"] == "OSError" and disk["reason"] == "No space left on device", disk
    assert "/data" not in repr(disk)
    locked = loggable_failure(_raised(sqlite3.OperationalError("database is locked")))
    assert locked["reason"] == "database is locked"
    oom = loggable_failure(_raised(redis.ResponseError("OOM command not allowed when used memory > 'maxmemory'.")))
    assert oom["reason"].startswith("OOM command not allowed")
