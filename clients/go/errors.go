package holdfast

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/holdfast/holdfast/clients/go/holdfastpb"
)

// The kinds of failure a call can end with. Match them with errors.Is; errors.As with *Error gives the
// details (the problem type, the server's message, the holder of a busy lock).
var (
	// ErrBusy: the lock is held by someone else (TryLock, TryDo).
	ErrBusy = errors.New("the lock is held")
	// ErrNotHolder: the token does not hold the lock (wrong, or its hold already ended).
	ErrNotHolder = errors.New("the token does not hold the lock")
	// ErrExpired: the hold ran out before the request arrived.
	ErrExpired = errors.New("the hold expired")
	// ErrNotFound: nobody holds the lock (or the named thing does not exist).
	ErrNotFound = errors.New("not found")
	// ErrInvalidArgument: a bad name, lease, owner or option, refused by this client or by the server;
	// nothing changed.
	ErrInvalidArgument = errors.New("invalid argument")
	// ErrLimitReached: a server limit was reached (queue full, too many locks, sessions or claims).
	ErrLimitReached = errors.New("limit reached")
	// ErrOverloaded: the node, or the leader, refused new load (a session, a one-shot acquire) while it
	// served the sessions it has late, or (a new session) while its workers had no room to spare; nothing
	// changed. Unlike a limit, it passes: try again after a pause, or through another node.
	ErrOverloaded = errors.New("overloaded")
	// ErrUnavailable: no endpoint answered within the retry bounds, or the cluster had no leader in time.
	// For a write the outcome is unknown.
	ErrUnavailable = errors.New("unavailable")
	// ErrSessionLost: the session is over (its lease could no longer be confirmed by this client's clock,
	// the server expired or closed it, or it could not be resumed): it holds nothing any more.
	ErrSessionLost = errors.New("the session is lost: it holds nothing any more")
	// ErrReleased: Held.Err after the lock was released.
	ErrReleased = errors.New("the lock was released")
	// ErrUnauthenticated: no API key, or an unknown or revoked one.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrLimitMismatch: the lock is held or waited for under another limit.
	ErrLimitMismatch = errors.New("limit mismatch")
	// ErrRefused: a change the cluster cannot make as it is (membership).
	ErrRefused = errors.New("refused")
	// ErrCompacted: a watch cannot resume after that revision.
	ErrCompacted = errors.New("compacted")
	// ErrProtocol: the server answered something this client does not understand, or failed internally.
	ErrProtocol = errors.New("protocol error")
)

// IsTransient reports whether err says the cluster could not serve the call at the time, rather than
// answer it: ErrUnavailable or ErrOverloaded. The same call, unchanged, may succeed after a pause or through
// another node; after ErrUnavailable a write's outcome is unknown, so send it again only if doing it twice is
// harmless, or check first. Every other error is an answer about the request or the lock.
func IsTransient(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrOverloaded)
}

// problemMetadata is the gRPC metadata entry in which the server puts an error's problem type;
// holderMetadata the binary entry naming the holder of a busy lock.
const (
	problemMetadata = "holdfast-problem"
	holderMetadata  = "holdfast-holder-bin"
	problemPrefix   = "urn:holdfast:"
)

// Holder is who holds a lock, as the server reported it.
type Holder struct {
	Owner       string
	Fence       uint64
	GrantedAtMs uint64
	// ExpiresAtMs and TTLMs are set for a TTL hold; SessionID for a session's hold.
	ExpiresAtMs uint64
	TTLMs       uint64
	SessionID   uint64
	Value       []byte
	// FreeAtMs nonzero: the holder's hold expired with a lock-delay; nobody is granted the lock before.
	FreeAtMs uint64
}

func holderFrom(h *pb.Holder) *Holder {
	if h == nil {
		return nil
	}
	return &Holder{Owner: h.Owner, Fence: h.Fence, GrantedAtMs: h.GrantedAtMs, ExpiresAtMs: h.ExpiresAtMs,
		TTLMs: h.TtlMs, SessionID: h.SessionId, Value: h.Value, FreeAtMs: h.FreeAtMs}
}

// Error is a failed call: its Kind (one of the Err* values above, which errors.Is matches), the problem
// type the server gave (urn:holdfast:<slug>, empty when none), the gRPC code (codes.OK for an error inside
// a session stream or one made by this client), a human-readable detail, and for ErrBusy the holder when
// known.
type Error struct {
	Kind    error
	Problem string
	Code    codes.Code
	Detail  string
	Holder  *Holder
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("holdfast: ")
	if e.Kind == ErrBusy && e.Holder != nil {
		fmt.Fprintf(&b, "the lock is held by %q (fence %d)", e.Holder.Owner, e.Holder.Fence)
	} else {
		b.WriteString(e.Kind.Error())
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

func (e *Error) Unwrap() error { return e.Kind }

func newError(kind error, format string, args ...interface{}) *Error {
	return &Error{Kind: kind, Detail: fmt.Sprintf(format, args...)}
}

// fromProblem maps an answer from the server to an error: the gRPC code of a failed call (codes.OK for a
// SessionError event, which has only a problem type), the problem type if any, and the detail. This and
// fromStatus are the only places that interpret codes and problem types, as in the Rust client
// (crates/holdfast-client/src/error.rs): the problem type wins where it is known, the code decides
// otherwise, so a server with slugs this client does not know still maps sensibly.
func fromProblem(code codes.Code, problem, detail string) *Error {
	e := &Error{Problem: problem, Code: code, Detail: detail}
	slug := strings.TrimPrefix(problem, problemPrefix)
	switch {
	case slug == "busy":
		e.Kind = ErrBusy
	case slug == "not-holder":
		e.Kind = ErrNotHolder
	case slug == "expired":
		e.Kind = ErrExpired
	case slug == "not-found":
		e.Kind = ErrNotFound
	case slug == "session-gone":
		e.Kind = ErrSessionLost
	case slug == "unavailable", slug == "watch-behind":
		e.Kind = ErrUnavailable
	case slug == "queue-full", slug == "too-many-locks", slug == "too-many-sessions",
		slug == "too-many-claims", slug == "too-many-changes":
		e.Kind = ErrLimitReached
	case slug == "overloaded":
		e.Kind = ErrOverloaded
	case strings.HasPrefix(slug, "invalid-"), slug == "session-hold":
		e.Kind = ErrInvalidArgument
	case slug == "unauthenticated":
		e.Kind = ErrUnauthenticated
	case slug == "compacted":
		e.Kind = ErrCompacted
	case slug == "limit-mismatch":
		e.Kind = ErrLimitMismatch
	case slug == "member-exists", slug == "address-in-use", slug == "not-caught-up",
		slug == "not-a-member", slug == "last-member", slug == "membership-change":
		e.Kind = ErrRefused
	}
	if e.Kind != nil {
		return e
	}
	switch code {
	case codes.InvalidArgument:
		e.Kind = ErrInvalidArgument
	case codes.AlreadyExists:
		e.Kind = ErrBusy
	case codes.FailedPrecondition:
		e.Kind = ErrNotHolder
	case codes.NotFound:
		e.Kind = ErrNotFound
	case codes.ResourceExhausted:
		e.Kind = ErrLimitReached
	case codes.Unauthenticated:
		e.Kind = ErrUnauthenticated
	case codes.Unavailable, codes.DeadlineExceeded:
		e.Kind = ErrUnavailable
	default:
		e.Kind = ErrProtocol
		if code != codes.OK {
			e.Detail = fmt.Sprintf("%s: %s", code, detail)
		} else if problem != "" {
			e.Detail = fmt.Sprintf("%s: %s", problem, detail)
		}
	}
	return e
}

// fromStatus maps the error a gRPC call or stream ended with, and the trailers it came with, to an Error.
// A status without a holdfast-problem entry that is UNAVAILABLE, or that grpc-go made on this side from a
// broken connection, says nothing about the request: the node may not even have seen it.
func fromStatus(err error, md metadata.MD) *Error {
	if err == nil {
		return nil
	}
	if e, ok := err.(*Error); ok {
		return e
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return newError(ErrUnavailable, "the stream ended: %v", err)
	}
	st, ok := status.FromError(err)
	if !ok {
		return newError(ErrUnavailable, "%v", err)
	}
	problem := ""
	if v := md.Get(problemMetadata); len(v) > 0 {
		problem = v[0]
	}
	if problem == "" {
		switch st.Code() {
		case codes.Unavailable, codes.Unknown, codes.Internal, codes.Canceled:
			return &Error{Kind: ErrUnavailable, Code: st.Code(), Detail: st.Message()}
		}
	}
	e := fromProblem(st.Code(), problem, st.Message())
	if e.Kind == ErrBusy {
		if v := md.Get(holderMetadata); len(v) > 0 {
			var h pb.Holder
			if proto.Unmarshal([]byte(v[0]), &h) == nil {
				e.Holder = holderFrom(&h)
			}
		}
	}
	return e
}

// retryable says whether a call that failed with err may go to another endpoint.
func retryable(err error) bool {
	return errors.Is(err, ErrUnavailable) && !errors.Is(err, context.Canceled)
}
