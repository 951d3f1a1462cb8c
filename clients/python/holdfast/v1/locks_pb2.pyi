from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SessionRequest(_message.Message):
    __slots__ = ("open", "resume", "acquire", "release", "heartbeat", "close", "set_value")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    CLOSE_FIELD_NUMBER: _ClassVar[int]
    SET_VALUE_FIELD_NUMBER: _ClassVar[int]
    open: Open
    resume: Resume
    acquire: SessionAcquire
    release: SessionRelease
    heartbeat: Heartbeat
    close: Close
    set_value: SessionSetValue
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., resume: _Optional[_Union[Resume, _Mapping]] = ..., acquire: _Optional[_Union[SessionAcquire, _Mapping]] = ..., release: _Optional[_Union[SessionRelease, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., close: _Optional[_Union[Close, _Mapping]] = ..., set_value: _Optional[_Union[SessionSetValue, _Mapping]] = ...) -> None: ...

class SessionSetValue(_message.Message):
    __slots__ = ("name", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("owner", "lease_ms")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    lease_ms: int
    def __init__(self, owner: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class Resume(_message.Message):
    __slots__ = ("session_id", "secret")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    secret: str
    def __init__(self, session_id: _Optional[int] = ..., secret: _Optional[str] = ...) -> None: ...

class SessionAcquire(_message.Message):
    __slots__ = ("name", "wait", "value", "lock_delay_ms", "limit")
    NAME_FIELD_NUMBER: _ClassVar[int]
    WAIT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    wait: bool
    value: bytes
    lock_delay_ms: int
    limit: int
    def __init__(self, name: _Optional[str] = ..., wait: bool = ..., value: _Optional[bytes] = ..., lock_delay_ms: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class SessionRelease(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("seq", "late_ms")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    LATE_MS_FIELD_NUMBER: _ClassVar[int]
    seq: int
    late_ms: int
    def __init__(self, seq: _Optional[int] = ..., late_ms: _Optional[int] = ...) -> None: ...

class Close(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SessionEvent(_message.Message):
    __slots__ = ("opened", "acquired", "waiting", "released", "heartbeat_ack", "lost", "error", "busy", "value_set")
    OPENED_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    BUSY_FIELD_NUMBER: _ClassVar[int]
    VALUE_SET_FIELD_NUMBER: _ClassVar[int]
    opened: Opened
    acquired: Acquired
    waiting: Waiting
    released: Released
    heartbeat_ack: HeartbeatAck
    lost: Lost
    error: SessionError
    busy: Busy
    value_set: ValueSet
    def __init__(self, opened: _Optional[_Union[Opened, _Mapping]] = ..., acquired: _Optional[_Union[Acquired, _Mapping]] = ..., waiting: _Optional[_Union[Waiting, _Mapping]] = ..., released: _Optional[_Union[Released, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[HeartbeatAck, _Mapping]] = ..., lost: _Optional[_Union[Lost, _Mapping]] = ..., error: _Optional[_Union[SessionError, _Mapping]] = ..., busy: _Optional[_Union[Busy, _Mapping]] = ..., value_set: _Optional[_Union[ValueSet, _Mapping]] = ...) -> None: ...

class ValueSet(_message.Message):
    __slots__ = ("name", "fence", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    fence: int
    value: bytes
    def __init__(self, name: _Optional[str] = ..., fence: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...

class Opened(_message.Message):
    __slots__ = ("session_id", "lease_ms", "secret")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    session_id: int
    lease_ms: int
    secret: str
    def __init__(self, session_id: _Optional[int] = ..., lease_ms: _Optional[int] = ..., secret: _Optional[str] = ...) -> None: ...

class Acquired(_message.Message):
    __slots__ = ("name", "fence", "token", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    fence: int
    token: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., fence: _Optional[int] = ..., token: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class Waiting(_message.Message):
    __slots__ = ("name", "position", "holder")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    name: str
    position: int
    holder: Holder
    def __init__(self, name: _Optional[str] = ..., position: _Optional[int] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ...) -> None: ...

class Busy(_message.Message):
    __slots__ = ("name", "holder")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    name: str
    holder: Holder
    def __init__(self, name: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ...) -> None: ...

class Released(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class HeartbeatAck(_message.Message):
    __slots__ = ("seq", "held", "waiting")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    seq: int
    held: int
    waiting: int
    def __init__(self, seq: _Optional[int] = ..., held: _Optional[int] = ..., waiting: _Optional[int] = ...) -> None: ...

class Lost(_message.Message):
    __slots__ = ("name", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("name", "type", "detail")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    name: str
    type: str
    detail: str
    def __init__(self, name: _Optional[str] = ..., type: _Optional[str] = ..., detail: _Optional[str] = ...) -> None: ...

class AcquireRequest(_message.Message):
    __slots__ = ("name", "owner", "ttl_ms", "wait_ms", "value", "lock_delay_ms", "limit")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    LOCK_DELAY_MS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    owner: str
    ttl_ms: int
    wait_ms: int
    value: bytes
    lock_delay_ms: int
    limit: int
    def __init__(self, name: _Optional[str] = ..., owner: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., wait_ms: _Optional[int] = ..., value: _Optional[bytes] = ..., lock_delay_ms: _Optional[int] = ..., limit: _Optional[int] = ...) -> None: ...

class SetValueRequest(_message.Message):
    __slots__ = ("name", "token", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    token: str
    value: bytes
    def __init__(self, name: _Optional[str] = ..., token: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("name", "after", "prefix")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    name: str
    after: int
    prefix: str
    def __init__(self, name: _Optional[str] = ..., after: _Optional[int] = ..., prefix: _Optional[str] = ...) -> None: ...

class WatchEvent(_message.Message):
    __slots__ = ("lock", "initial")
    LOCK_FIELD_NUMBER: _ClassVar[int]
    INITIAL_FIELD_NUMBER: _ClassVar[int]
    lock: Lock
    initial: bool
    def __init__(self, lock: _Optional[_Union[Lock, _Mapping]] = ..., initial: bool = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("name", "token", "ttl_ms")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    name: str
    token: str
    ttl_ms: int
    def __init__(self, name: _Optional[str] = ..., token: _Optional[str] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("name", "token")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    name: str
    token: str
    def __init__(self, name: _Optional[str] = ..., token: _Optional[str] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ("name", "fence")
    NAME_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    fence: int
    def __init__(self, name: _Optional[str] = ..., fence: _Optional[int] = ...) -> None: ...

class Hold(_message.Message):
    __slots__ = ("name", "owner", "token", "fence", "granted_at_ms", "expires_at_ms", "ttl_ms", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    owner: str
    token: str
    fence: int
    granted_at_ms: int
    expires_at_ms: int
    ttl_ms: int
    value: bytes
    def __init__(self, name: _Optional[str] = ..., owner: _Optional[str] = ..., token: _Optional[str] = ..., fence: _Optional[int] = ..., granted_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...

class GetRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class Call(_message.Message):
    __slots__ = ("id", "acquire", "renew", "release", "get", "cancel", "set_value")
    ID_FIELD_NUMBER: _ClassVar[int]
    ACQUIRE_FIELD_NUMBER: _ClassVar[int]
    RENEW_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    SET_VALUE_FIELD_NUMBER: _ClassVar[int]
    id: int
    acquire: AcquireRequest
    renew: RenewRequest
    release: ReleaseRequest
    get: GetRequest
    cancel: Cancel
    set_value: SetValueRequest
    def __init__(self, id: _Optional[int] = ..., acquire: _Optional[_Union[AcquireRequest, _Mapping]] = ..., renew: _Optional[_Union[RenewRequest, _Mapping]] = ..., release: _Optional[_Union[ReleaseRequest, _Mapping]] = ..., get: _Optional[_Union[GetRequest, _Mapping]] = ..., cancel: _Optional[_Union[Cancel, _Mapping]] = ..., set_value: _Optional[_Union[SetValueRequest, _Mapping]] = ...) -> None: ...

class Cancel(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class CallResult(_message.Message):
    __slots__ = ("id", "hold", "released", "lock", "error")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOLD_FIELD_NUMBER: _ClassVar[int]
    RELEASED_FIELD_NUMBER: _ClassVar[int]
    LOCK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    id: int
    hold: Hold
    released: ReleaseResponse
    lock: Lock
    error: CallError
    def __init__(self, id: _Optional[int] = ..., hold: _Optional[_Union[Hold, _Mapping]] = ..., released: _Optional[_Union[ReleaseResponse, _Mapping]] = ..., lock: _Optional[_Union[Lock, _Mapping]] = ..., error: _Optional[_Union[CallError, _Mapping]] = ...) -> None: ...

class CallError(_message.Message):
    __slots__ = ("code", "message", "problem", "holder")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    problem: str
    holder: Holder
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ..., problem: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ...) -> None: ...

class ListRequest(_message.Message):
    __slots__ = ("prefix", "after", "limit")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    prefix: str
    after: str
    limit: int
    def __init__(self, prefix: _Optional[str] = ..., after: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ListResponse(_message.Message):
    __slots__ = ("locks", "next", "revision")
    LOCKS_FIELD_NUMBER: _ClassVar[int]
    NEXT_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    locks: _containers.RepeatedCompositeFieldContainer[Lock]
    next: str
    revision: int
    def __init__(self, locks: _Optional[_Iterable[_Union[Lock, _Mapping]]] = ..., next: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class Lock(_message.Message):
    __slots__ = ("name", "holder", "waiters", "revision", "holders", "limit")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    WAITERS_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    HOLDERS_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    name: str
    holder: Holder
    waiters: _containers.RepeatedCompositeFieldContainer[Waiter]
    revision: int
    holders: _containers.RepeatedCompositeFieldContainer[Holder]
    limit: int
    def __init__(self, name: _Optional[str] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., waiters: _Optional[_Iterable[_Union[Waiter, _Mapping]]] = ..., revision: _Optional[int] = ..., holders: _Optional[_Iterable[_Union[Holder, _Mapping]]] = ..., limit: _Optional[int] = ...) -> None: ...

class Holder(_message.Message):
    __slots__ = ("owner", "fence", "granted_at_ms", "expires_at_ms", "ttl_ms", "session_id", "value", "free_at_ms")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    FENCE_FIELD_NUMBER: _ClassVar[int]
    GRANTED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_MS_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    FREE_AT_MS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    fence: int
    granted_at_ms: int
    expires_at_ms: int
    ttl_ms: int
    session_id: int
    value: bytes
    free_at_ms: int
    def __init__(self, owner: _Optional[str] = ..., fence: _Optional[int] = ..., granted_at_ms: _Optional[int] = ..., expires_at_ms: _Optional[int] = ..., ttl_ms: _Optional[int] = ..., session_id: _Optional[int] = ..., value: _Optional[bytes] = ..., free_at_ms: _Optional[int] = ...) -> None: ...

class Waiter(_message.Message):
    __slots__ = ("owner", "queued_at_ms", "session_id")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    QUEUED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    owner: str
    queued_at_ms: int
    session_id: int
    def __init__(self, owner: _Optional[str] = ..., queued_at_ms: _Optional[int] = ..., session_id: _Optional[int] = ...) -> None: ...

class ClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatusResponse(_message.Message):
    __slots__ = ("id", "leader", "term", "state", "members", "last_log_index", "applied_index", "voters")
    class MembersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LAST_LOG_INDEX_FIELD_NUMBER: _ClassVar[int]
    APPLIED_INDEX_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    id: int
    leader: int
    term: int
    state: str
    members: _containers.ScalarMap[int, str]
    last_log_index: int
    applied_index: int
    voters: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, id: _Optional[int] = ..., leader: _Optional[int] = ..., term: _Optional[int] = ..., state: _Optional[str] = ..., members: _Optional[_Mapping[int, str]] = ..., last_log_index: _Optional[int] = ..., applied_index: _Optional[int] = ..., voters: _Optional[_Iterable[int]] = ...) -> None: ...

class AddMemberRequest(_message.Message):
    __slots__ = ("id", "addr")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDR_FIELD_NUMBER: _ClassVar[int]
    id: int
    addr: str
    def __init__(self, id: _Optional[int] = ..., addr: _Optional[str] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class SnapshotResponse(_message.Message):
    __slots__ = ("id", "snapshot_index", "snapshot_bytes")
    ID_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_INDEX_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_BYTES_FIELD_NUMBER: _ClassVar[int]
    id: int
    snapshot_index: int
    snapshot_bytes: int
    def __init__(self, id: _Optional[int] = ..., snapshot_index: _Optional[int] = ..., snapshot_bytes: _Optional[int] = ...) -> None: ...

class RemoveMemberRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: int
    def __init__(self, id: _Optional[int] = ...) -> None: ...
