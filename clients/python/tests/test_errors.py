"""The mapping from problem types and gRPC codes to exceptions (no cluster needed)."""

import grpc
import pytest

import holdfast
from holdfast.errors import error_from_problem

C = grpc.StatusCode


@pytest.mark.parametrize(
    "code, problem, expected",
    [
        (C.INVALID_ARGUMENT, "urn:holdfast:invalid-name", holdfast.InvalidArgument),
        (C.INVALID_ARGUMENT, "urn:holdfast:invalid-ttl", holdfast.InvalidArgument),
        (C.INVALID_ARGUMENT, "urn:holdfast:session-hold", holdfast.InvalidArgument),
        (C.ALREADY_EXISTS, "urn:holdfast:busy", holdfast.LockBusy),
        (C.FAILED_PRECONDITION, "urn:holdfast:not-holder", holdfast.NotHolder),
        (C.FAILED_PRECONDITION, "urn:holdfast:expired", holdfast.Expired),
        (C.FAILED_PRECONDITION, "urn:holdfast:limit-mismatch", holdfast.LimitMismatch),
        (C.NOT_FOUND, "urn:holdfast:not-found", holdfast.NotFound),
        (C.NOT_FOUND, "urn:holdfast:session-gone", holdfast.SessionLost),
        (C.RESOURCE_EXHAUSTED, "urn:holdfast:queue-full", holdfast.LimitReached),
        (C.RESOURCE_EXHAUSTED, "urn:holdfast:too-many-claims", holdfast.LimitReached),
        (C.UNAVAILABLE, "urn:holdfast:unavailable", holdfast.Unavailable),
        (C.UNAUTHENTICATED, "urn:holdfast:unauthenticated", holdfast.Unauthenticated),
        (C.FAILED_PRECONDITION, "urn:holdfast:compacted", holdfast.Compacted),
        (C.RESOURCE_EXHAUSTED, "urn:holdfast:too-many-changes", holdfast.LimitReached),
        (C.RESOURCE_EXHAUSTED, "urn:holdfast:overloaded", holdfast.Overloaded),
        (C.RESOURCE_EXHAUSTED, "urn:holdfast:watch-behind", holdfast.Unavailable),
        (C.INTERNAL, "urn:holdfast:internal", holdfast.ProtocolError),
    ],
)
def test_problem_types_map_to_their_exception(code: grpc.StatusCode, problem: str, expected: type) -> None:
    assert type(error_from_problem(code, problem, "detail")) is expected


@pytest.mark.parametrize(
    "code, expected",
    [
        (C.INVALID_ARGUMENT, holdfast.InvalidArgument),
        (C.ALREADY_EXISTS, holdfast.LockBusy),
        (C.FAILED_PRECONDITION, holdfast.NotHolder),
        (C.NOT_FOUND, holdfast.NotFound),
        (C.RESOURCE_EXHAUSTED, holdfast.LimitReached),
        (C.UNAVAILABLE, holdfast.Unavailable),
        (C.DEADLINE_EXCEEDED, holdfast.Unavailable),
        (C.UNIMPLEMENTED, holdfast.ProtocolError),
    ],
)
def test_without_a_problem_type_the_code_decides(code: grpc.StatusCode, expected: type) -> None:
    assert type(error_from_problem(code, None, "m")) is expected


def test_an_unknown_slug_falls_back_to_the_code() -> None:
    error = error_from_problem(C.RESOURCE_EXHAUSTED, "urn:holdfast:too-many-widgets", "m")
    assert type(error) is holdfast.LimitReached


def test_session_errors_map_by_problem_type_alone() -> None:
    assert type(error_from_problem(None, "urn:holdfast:invalid-name", "bad")) is holdfast.InvalidArgument
    assert type(error_from_problem(None, "urn:holdfast:mystery", "what")) is holdfast.ProtocolError


def test_only_unavailable_and_overloaded_are_transient() -> None:
    transient = {
        problem: error_from_problem(code, problem, "m").transient
        for code, problem in [
            (C.UNAVAILABLE, "urn:holdfast:unavailable"),
            (C.RESOURCE_EXHAUSTED, "urn:holdfast:overloaded"),
            (C.RESOURCE_EXHAUSTED, "urn:holdfast:watch-behind"),
            (C.RESOURCE_EXHAUSTED, "urn:holdfast:queue-full"),
            (C.ALREADY_EXISTS, "urn:holdfast:busy"),
            (C.FAILED_PRECONDITION, "urn:holdfast:not-holder"),
            (C.INVALID_ARGUMENT, "urn:holdfast:invalid-name"),
            (C.NOT_FOUND, "urn:holdfast:session-gone"),
            (C.INTERNAL, "urn:holdfast:internal"),
        ]
    }
    assert {problem for problem, yes in transient.items() if yes} == {
        "urn:holdfast:unavailable",
        "urn:holdfast:overloaded",
        "urn:holdfast:watch-behind",
    }
    assert error_from_problem(C.UNAVAILABLE, None, "connection refused").transient
    assert not holdfast.LockTimeout().transient
