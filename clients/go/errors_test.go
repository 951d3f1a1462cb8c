package holdfast

import (
	"errors"
	"io"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pb "github.com/holdfast/holdfast/clients/go/holdfastpb"
)

// The same table as the Rust client's (crates/holdfast-client/src/error.rs).
func TestStatusesMapToErrorsAsInTheRustClient(t *testing.T) {
	cases := []struct {
		code    codes.Code
		problem string
		want    error
	}{
		{codes.InvalidArgument, "urn:holdfast:invalid-name", ErrInvalidArgument},
		{codes.InvalidArgument, "urn:holdfast:invalid-ttl", ErrInvalidArgument},
		{codes.InvalidArgument, "urn:holdfast:session-hold", ErrInvalidArgument},
		{codes.AlreadyExists, "urn:holdfast:busy", ErrBusy},
		{codes.FailedPrecondition, "urn:holdfast:not-holder", ErrNotHolder},
		{codes.FailedPrecondition, "urn:holdfast:expired", ErrExpired},
		{codes.FailedPrecondition, "urn:holdfast:limit-mismatch", ErrLimitMismatch},
		{codes.NotFound, "urn:holdfast:not-found", ErrNotFound},
		{codes.NotFound, "urn:holdfast:session-gone", ErrSessionLost},
		{codes.ResourceExhausted, "urn:holdfast:queue-full", ErrLimitReached},
		{codes.ResourceExhausted, "urn:holdfast:too-many-claims", ErrLimitReached},
		{codes.ResourceExhausted, "urn:holdfast:overloaded", ErrOverloaded},
		{codes.Unavailable, "urn:holdfast:unavailable", ErrUnavailable},
		{codes.Unauthenticated, "urn:holdfast:unauthenticated", ErrUnauthenticated},
		{codes.Internal, "urn:holdfast:internal", ErrProtocol},
		// Without a problem type the code decides; a transport failure is unavailable.
		{codes.InvalidArgument, "", ErrInvalidArgument},
		{codes.AlreadyExists, "", ErrBusy},
		{codes.FailedPrecondition, "", ErrNotHolder},
		{codes.DeadlineExceeded, "", ErrUnavailable},
		{codes.Unavailable, "", ErrUnavailable},
		{codes.Unknown, "", ErrUnavailable},
		{codes.Unimplemented, "", ErrProtocol},
	}
	for _, tc := range cases {
		md := metadata.MD{}
		if tc.problem != "" {
			md.Set(problemMetadata, tc.problem)
		}
		err := fromStatus(status.Error(tc.code, "detail"), md)
		if !errors.Is(err, tc.want) {
			t.Errorf("%v %q: %v, want %v", tc.code, tc.problem, err, tc.want)
		}
		if tc.problem != "" && err.Problem != tc.problem {
			t.Errorf("%v %q: problem %q", tc.code, tc.problem, err.Problem)
		}
	}
	if err := fromStatus(io.EOF, nil); !errors.Is(err, ErrUnavailable) {
		t.Errorf("a broken stream: %v", err)
	}
	// A SessionError event has only a problem type.
	if err := fromProblem(codes.OK, "urn:holdfast:queue-full", "full"); !errors.Is(err, ErrLimitReached) {
		t.Errorf("session error queue-full: %v", err)
	}
}

func TestOnlyUnavailableAndOverloadedAreTransient(t *testing.T) {
	cases := []struct {
		code      codes.Code
		problem   string
		transient bool
	}{
		{codes.Unavailable, "urn:holdfast:unavailable", true},
		{codes.ResourceExhausted, "urn:holdfast:overloaded", true},
		{codes.Unavailable, "", true},
		{codes.ResourceExhausted, "urn:holdfast:queue-full", false},
		{codes.AlreadyExists, "urn:holdfast:busy", false},
		{codes.FailedPrecondition, "urn:holdfast:not-holder", false},
		{codes.InvalidArgument, "urn:holdfast:invalid-name", false},
		{codes.NotFound, "urn:holdfast:session-gone", false},
		{codes.Internal, "urn:holdfast:internal", false},
	}
	for _, tc := range cases {
		md := metadata.MD{}
		if tc.problem != "" {
			md.Set(problemMetadata, tc.problem)
		}
		if got := IsTransient(fromStatus(status.Error(tc.code, "detail"), md)); got != tc.transient {
			t.Errorf("%v %q: transient %v, want %v", tc.code, tc.problem, got, tc.transient)
		}
	}
	if !IsTransient(fromStatus(io.EOF, nil)) {
		t.Error("a broken stream is transient")
	}
	if IsTransient(nil) {
		t.Error("no error is not transient")
	}
}

func TestABusyStatusNamesTheHolderFromItsBinaryMetadata(t *testing.T) {
	bytes, err := proto.Marshal(&pb.Holder{Owner: "w1", Fence: 41, SessionId: 7})
	if err != nil {
		t.Fatal(err)
	}
	md := metadata.Pairs(problemMetadata, "urn:holdfast:busy", holderMetadata, string(bytes))
	e := fromStatus(status.Error(codes.AlreadyExists, "held"), md)
	if !errors.Is(e, ErrBusy) || e.Holder == nil || e.Holder.Owner != "w1" || e.Holder.Fence != 41 {
		t.Fatalf("%#v", e)
	}
	if e.Error() != `holdfast: the lock is held by "w1" (fence 41): held` {
		t.Fatalf("message: %s", e.Error())
	}
	// Undecodable bytes are ignored: still busy, holder unknown.
	md = metadata.Pairs(problemMetadata, "urn:holdfast:busy", holderMetadata, "\xff\xff")
	if e := fromStatus(status.Error(codes.AlreadyExists, "held"), md); !errors.Is(e, ErrBusy) || e.Holder != nil {
		t.Fatalf("%#v", e)
	}
}
