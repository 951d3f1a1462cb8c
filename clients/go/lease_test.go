package holdfast

// The client's side of the lease, against a scripted server (a real cluster cannot be made to answer
// slowly on purpose): an open that took more than half the lease is refused, and acks that come too late
// never keep a lock the client can no longer confirm.

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	pb "github.com/holdfast/holdfast/clients/go/holdfastpb"
)

// scriptedServer answers a session's Open (or Resume) after openDelay, grants every acquire at once with
// fence 7, and answers each heartbeat after ackDelay (never, if negative).
type scriptedServer struct {
	pb.UnimplementedLocksServer
	openDelay time.Duration
	ackDelay  time.Duration
	opens     chan struct{}
}

func (f *scriptedServer) Session(stream pb.Locks_SessionServer) error {
	sendMu := make(chan struct{}, 1)
	send := func(ev *pb.SessionEvent) {
		sendMu <- struct{}{}
		stream.Send(ev)
		<-sendMu
	}
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		switch k := req.Kind.(type) {
		case *pb.SessionRequest_Open, *pb.SessionRequest_Resume:
			select {
			case f.opens <- struct{}{}:
			default:
			}
			time.Sleep(f.openDelay)
			send(&pb.SessionEvent{Kind: &pb.SessionEvent_Opened{Opened: &pb.Opened{SessionId: 1, LeaseMs: 1000,
				Secret: strings.Repeat("ab", 16)}}})
		case *pb.SessionRequest_Acquire:
			send(&pb.SessionEvent{Kind: &pb.SessionEvent_Acquired{Acquired: &pb.Acquired{Name: k.Acquire.Name, Fence: 7}}})
		case *pb.SessionRequest_Heartbeat:
			if f.ackDelay >= 0 {
				seq := k.Heartbeat.Seq
				time.AfterFunc(f.ackDelay, func() {
					send(&pb.SessionEvent{Kind: &pb.SessionEvent_HeartbeatAck{HeartbeatAck: &pb.HeartbeatAck{Seq: seq, Held: 1}}})
				})
			}
		case *pb.SessionRequest_Close:
			return nil
		}
	}
}

func startScripted(t *testing.T, f *scriptedServer) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f.opens = make(chan struct{}, 100)
	server := grpc.NewServer()
	pb.RegisterLocksServer(server, f)
	go server.Serve(l)
	t.Cleanup(server.Stop)
	return l.Addr().String()
}

func TestAnOpenThatTakesMoreThanHalfTheLeaseIsRefused(t *testing.T) {
	const lease = time.Second
	addr := startScripted(t, &scriptedServer{openDelay: lease * 6 / 10})
	c := New(Config{Endpoints: []string{addr}, Attempts: 1})
	defer c.Close()
	start := time.Now()
	_, err := c.Lock(ctxT(t, 10*time.Second), "slow", lease)
	took := time.Since(start)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "in time") {
		t.Fatalf("an open answered after 0.6 of the lease: %v, want ErrUnavailable (not opened in time)", err)
	}
	// Refused at half the lease, not when the Opened finally came.
	if took < lease/2 || took > lease/2+300*time.Millisecond {
		t.Fatalf("refused after %v; want about half the lease (%v)", took, lease/2)
	}
	// Just under half the lease is fine.
	fast := startScripted(t, &scriptedServer{openDelay: lease / 5})
	c2 := New(Config{Endpoints: []string{fast}})
	defer c2.Close()
	held, err := c2.Lock(ctxT(t, 10*time.Second), "slow", lease)
	if err != nil || held.Fence() != 7 {
		t.Fatalf("an open in a fifth of the lease: %v", err)
	}
	held.Unlock(ctxT(t, 5*time.Second))
}

func TestLateAcksNeverKeepALockTheClientCannotConfirm(t *testing.T) {
	const lease = time.Second
	// Every ack comes 1.5 leases after its heartbeat: each would confirm the lease only until a moment
	// already past when it arrives.
	addr := startScripted(t, &scriptedServer{ackDelay: lease * 3 / 2})
	c := New(Config{Endpoints: []string{addr}})
	defer c.Close()
	start := time.Now()
	held, err := c.Lock(ctxT(t, 10*time.Second), "late", lease)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
	case <-time.After(3 * lease):
		t.Fatal("the lock was still held 3 leases after the open, with no ack in time")
	}
	// Lost when the first lease (counted from the Open's send) ends: never later.
	if lost := time.Since(start); lost < lease-50*time.Millisecond || lost > lease+200*time.Millisecond {
		t.Fatalf("lost %v after the open; want at the end of the first lease (%v)", lost, lease)
	}
	if !errors.Is(held.Err(), ErrSessionLost) {
		t.Fatalf("Err: %v", held.Err())
	}
	// The late acks that arrive afterwards change nothing.
	time.Sleep(lease)
	if !errors.Is(held.Err(), ErrSessionLost) {
		t.Fatalf("Err after the late acks: %v", held.Err())
	}
}

func TestAcksInTimeKeepTheLock(t *testing.T) {
	const lease = time.Second
	addr := startScripted(t, &scriptedServer{ackDelay: lease / 10})
	c := New(Config{Endpoints: []string{addr}})
	defer c.Close()
	held, err := c.Lock(ctxT(t, 10*time.Second), "kept", lease)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-held.Done():
		t.Fatalf("lost with acks in time: %v", held.Err())
	case <-time.After(3 * lease):
	}
	if n := held.s.resumes.Load(); n != 0 {
		t.Fatalf("resumed %d times with acks in time", n)
	}
	held.Unlock(ctxT(t, 5*time.Second))
}
