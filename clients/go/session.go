package holdfast

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/metadata"

	pb "github.com/holdfast/holdfast/clients/go/holdfastpb"
)

// A session: one Session stream at a time (a new one after a resume), owned by one goroutine, run, which
// alone sends on the stream and keeps the lease. Each lock this client holds has a session of its own.
//
// The lease is kept by the monotonic clock: each heartbeat's send instant is recorded, and its ack
// confirms the session until that instant plus the lease (the first lease counts from the Open's send).
// At the end of the confirmed span, with no newer ack, the lock is lost, whatever the network does, and a
// late ack never revives it: the leader extended the session when the heartbeat arrived, later than it was
// sent, so the client's view is never longer than the cluster's (docs/grpc-api.md#heartbeats-and-the-lease).
type session struct {
	c     *Client
	lease time.Duration // the shorter of what was asked and what the server granted
	id    uint64
	// secret proves the session on Resume; never logged or shown.
	secret string

	// Owned by run once it started.
	endpoint       int
	stream         pb.Locks_SessionClient
	cancelStream   context.CancelFunc
	gen            int       // the current stream's generation: events of older streams are dropped
	confirmedUntil time.Time // monotonic: the lease's end as the last ack confirmed it
	lastAck        time.Time // when the last ack (or the Opened) arrived: half a lease without one: resume
	seq            uint64
	sentAt         map[uint64]time.Time
	name           string
	wait           bool
	held           bool
	fence          uint64
	token          string
	// After a resume: the seq of the first heartbeat on the new stream, and whether the server re-reported
	// the held lock. The lock is lost if that heartbeat is acknowledged without the report.
	checkSeq    uint64
	reReported  bool
	acquireSent bool

	events    chan streamEvent
	acquired  chan acquireOutcome // the answer to the acquire (buffered: one)
	closeReqs chan chan error
	quit      chan struct{} // closed when run returns

	// For tests, read from any goroutine: the endpoint the stream runs through, and how many resumes
	// succeeded.
	through atomic.Int32
	resumes atomic.Int32

	done     chan struct{} // closed when the lock is released or lost
	doneErr  error
	doneOnce sync.Once
}

type streamEvent struct {
	gen     int
	ev      *pb.SessionEvent
	err     error
	trailer metadata.MD
}

type acquireOutcome struct {
	held *Held
	err  error
}

// open opens a session through the first endpoint that answers (bounded by Config.Attempts), refusing one
// whose open took more than half its lease: what is left might run out before the first heartbeat is
// answered.
func (c *Client) open(ctx context.Context, lease time.Duration, name string, wait bool) (*session, error) {
	s := &session{c: c, lease: lease, name: name, wait: wait, sentAt: map[uint64]time.Time{}, events: make(chan streamEvent, 16),
		acquired: make(chan acquireOutcome, 1), closeReqs: make(chan chan error), quit: make(chan struct{}),
		done: make(chan struct{})}
	first := c.first()
	var lastErr error
	for attempt := 0; attempt < c.cfg.Attempts; attempt++ {
		if attempt > 0 && attempt%len(c.cfg.Endpoints) == 0 {
			if err := sleepCtx(ctx, c.cfg.Backoff); err != nil {
				return nil, err
			}
		}
		i := (first + attempt) % len(c.cfg.Endpoints)
		sentAt := time.Now()
		opened, err := s.startStream(ctx, i, &pb.SessionRequest{Kind: &pb.SessionRequest_Open{Open: &pb.Open{
			Owner: c.owner, LeaseMs: uint64(lease / time.Millisecond)}}}, sentAt.Add(lease/2))
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			lastErr = err
			if err.Kind == ErrUnavailable {
				continue
			}
			return nil, err
		}
		if granted := time.Duration(opened.LeaseMs) * time.Millisecond; granted > 0 && granted < s.lease {
			s.lease = granted
		}
		s.id, s.secret = opened.SessionId, opened.Secret
		now := time.Now()
		if now.Sub(sentAt) > s.lease/2 {
			s.sendClose()
			s.cancelStream()
			lastErr = newError(ErrUnavailable, "the session opened too slowly (%v of a %v lease)", now.Sub(sentAt), s.lease)
			continue
		}
		c.worked(i)
		s.confirmedUntil = sentAt.Add(s.lease)
		s.lastAck = now
		go s.run()
		return s, nil
	}
	return nil, lastErr
}

// startStream opens a Session stream through endpoint i, sends first (Open or Resume), and waits for the
// Opened until deadline. On success the stream is the session's, and a reader goroutine feeds events.
func (s *session) startStream(ctx context.Context, i int, first *pb.SessionRequest, deadline time.Time) (*pb.Opened, *Error) {
	conn, dialErr := s.c.conn(i)
	if dialErr != nil {
		return nil, fromStatus(dialErr, nil)
	}
	streamCtx, cancel := context.WithCancel(s.c.callContext(context.Background()))
	// Until the Opened arrives the stream is bounded by the deadline and by the caller's ctx.
	timer := time.AfterFunc(time.Until(deadline), cancel)
	unwatch := watchCancel(ctx, cancel)
	defer unwatch()
	stream, err := pb.NewLocksClient(conn).Session(streamCtx)
	if err == nil {
		err = stream.Send(first)
	}
	var ev *pb.SessionEvent
	if err == nil {
		ev, err = stream.Recv()
	}
	if timerFired := !timer.Stop(); timerFired {
		// The stream was cancelled at the deadline, whatever Recv answered.
		cancel()
		return nil, newError(ErrUnavailable, "%s did not open the session in time", s.c.cfg.Endpoints[i])
	}
	if err != nil {
		cancel()
		var trailer metadata.MD
		if stream != nil {
			trailer = stream.Trailer()
		}
		return nil, fromStatus(err, trailer)
	}
	opened := ev.GetOpened()
	if opened == nil {
		cancel()
		return nil, newError(ErrProtocol, "the first event of a session was %v, not Opened", ev)
	}
	s.gen++
	s.endpoint, s.stream, s.cancelStream = i, stream, cancel
	s.through.Store(int32(i))
	go s.read(s.gen, stream)
	return opened, nil
}

// watchCancel calls cancel when ctx is done, until the returned function is called.
func watchCancel(ctx context.Context, cancel context.CancelFunc) func() {
	stopped := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			cancel()
		case <-stopped:
		}
	}()
	return func() { close(stopped) }
}

func (s *session) read(gen int, stream pb.Locks_SessionClient) {
	for {
		ev, err := stream.Recv()
		e := streamEvent{gen: gen, ev: ev, err: err}
		if err != nil {
			e.trailer = stream.Trailer()
		}
		select {
		case s.events <- e:
		case <-s.quit:
			return
		}
		if err != nil {
			return
		}
	}
}

func (s *session) send(req *pb.SessionRequest) {
	// A failed send shows up as the stream's end in read.
	_ = s.stream.Send(req)
}

func (s *session) sendClose() {
	s.send(&pb.SessionRequest{Kind: &pb.SessionRequest_Close{Close: &pb.Close{}}})
}

func (s *session) sendAcquire() {
	s.acquireSent = true
	s.send(&pb.SessionRequest{Kind: &pb.SessionRequest_Acquire{Acquire: &pb.SessionAcquire{Name: s.name, Wait: s.wait}}})
}

func (s *session) sendHeartbeat() uint64 {
	s.seq++
	s.sentAt[s.seq] = time.Now()
	s.send(&pb.SessionRequest{Kind: &pb.SessionRequest_Heartbeat{Heartbeat: &pb.Heartbeat{Seq: s.seq}}})
	return s.seq
}

// acquire waits for the answer to the acquire run sent first (or for ctx).
func (s *session) acquire(ctx context.Context) (*Held, error) {
	select {
	case out := <-s.acquired:
		if out.err != nil {
			_ = s.close(context.Background())
			return nil, out.err
		}
		return out.held, nil
	case <-ctx.Done():
		// Ending the session withdraws the wait (and hands back a grant that raced the cancellation).
		_ = s.close(context.Background())
		return nil, ctx.Err()
	}
}

// close sends Close (the lock is handed over at once) and waits, bounded by ctx and the lease, for the
// server to end the stream. The lock counts as gone from the moment Close is sent.
func (s *session) close(ctx context.Context) error {
	reply := make(chan error, 1)
	select {
	case s.closeReqs <- reply:
	case <-s.quit:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-reply:
		return err
	case <-s.quit:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// finished says whether done is closed.
func (s *session) finished() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// finish closes done with err (once) and answers a caller still waiting for the acquire.
func (s *session) finish(err error) {
	s.doneOnce.Do(func() {
		s.doneErr = err
		close(s.done)
	})
	if !s.held {
		select {
		case s.acquired <- acquireOutcome{err: err}:
		default:
		}
	}
}

// lose declares the lock lost, for good: the session is not revived even if a late ack arrives. It asks
// the server to close the session (harmless if it already ended) and leaves the stream.
func (s *session) lose(err *Error) {
	s.finish(err)
	s.sendClose()
	s.cancelStream()
}

// run owns the session: it sends the acquire and the heartbeats, reads the events, keeps the lease, and
// resumes through another endpoint when the stream breaks or no ack comes for half a lease.
func (s *session) run() {
	defer close(s.quit)
	heartbeats := time.NewTicker(s.lease / 4)
	defer heartbeats.Stop()
	leaseEnd := time.NewTimer(time.Until(s.confirmedUntil))
	defer leaseEnd.Stop()
	var closing chan error // set once Close was sent: answered when the stream ends
	closeBound := time.NewTimer(time.Hour)
	closeBound.Stop()

	s.sendAcquire()
	s.sendHeartbeat()
	for {
		select {
		case reply := <-s.closeReqs:
			if closing != nil {
				reply <- nil
				continue
			}
			closing = reply
			s.sendClose()
			s.finish(newError(ErrReleased, ""))
			closeBound.Reset(s.lease)
		case <-closeBound.C:
			closing <- newError(ErrUnavailable, "the server did not confirm the close within %v; the session ends with its lease", s.lease)
			s.cancelStream()
			return
		case <-leaseEnd.C:
			if now := time.Now(); now.Before(s.confirmedUntil) {
				leaseEnd.Reset(s.confirmedUntil.Sub(now))
				continue
			}
			if closing != nil {
				closing <- nil
				s.cancelStream()
				return
			}
			s.lose(newError(ErrSessionLost, "no heartbeat was acknowledged within the %v lease", s.lease))
			return
		case <-heartbeats.C:
			if closing != nil {
				continue
			}
			if time.Since(s.lastAck) > s.lease/2 {
				// A hung node, or a partition the transport has not noticed: leave while half a lease is left.
				if !s.resume(newError(ErrUnavailable, "no heartbeat acknowledged for half a lease")) {
					return
				}
				continue
			}
			if !s.held && !s.acquireSent {
				s.sendAcquire()
			}
			s.sendHeartbeat()
		case e := <-s.events:
			if e.gen != s.gen {
				continue
			}
			if e.err != nil {
				if closing != nil {
					var err error
					if e.err != io.EOF {
						err = fromStatus(e.err, e.trailer)
					}
					closing <- err
					s.cancelStream()
					return
				}
				err := fromStatus(e.err, e.trailer)
				if !retryable(err) {
					s.lose(&Error{Kind: ErrSessionLost, Problem: err.Problem, Code: err.Code, Detail: err.Error()})
					return
				}
				if !s.resume(err) {
					return
				}
				continue
			}
			if !s.handle(e.ev, closing != nil) {
				return
			}
			// An ack may have moved the lease's end. (A tick the stopped timer had already sent is harmless:
			// the lease-end case checks the clock.)
			leaseEnd.Stop()
			leaseEnd.Reset(time.Until(s.confirmedUntil))
		}
	}
}

// handle applies one event; false: the session is over.
func (s *session) handle(ev *pb.SessionEvent, closing bool) bool {
	switch k := ev.Kind.(type) {
	case *pb.SessionEvent_HeartbeatAck:
		sent, ok := s.sentAt[k.HeartbeatAck.Seq]
		if !ok {
			return true
		}
		for seq := range s.sentAt {
			if seq <= k.HeartbeatAck.Seq {
				delete(s.sentAt, seq)
			}
		}
		now := time.Now()
		if !now.Before(s.confirmedUntil) {
			// The lease ran out by this clock before the ack came: a late ack never revives the session.
			if !closing {
				s.lose(newError(ErrSessionLost, "the lease ran out before a heartbeat was acknowledged"))
				return false
			}
			return true
		}
		s.lastAck = now
		if until := sent.Add(s.lease); until.After(s.confirmedUntil) {
			s.confirmedUntil = until
		}
		if s.checkSeq != 0 && k.HeartbeatAck.Seq >= s.checkSeq {
			s.checkSeq = 0
			if s.held && !s.reReported && !closing {
				s.lose(newError(ErrSessionLost, "the resumed session did not report the lock %q", s.name))
				return false
			}
		}
	case *pb.SessionEvent_Acquired:
		if k.Acquired.Name != s.name {
			return true
		}
		s.reReported = true
		if s.held || closing || s.finished() {
			// Already known, or nobody waits for it any more: the caller closes the session, which hands
			// the grant back.
			return true
		}
		s.held, s.fence, s.token = true, k.Acquired.Fence, k.Acquired.Token
		s.acquired <- acquireOutcome{held: &Held{s: s, name: s.name, fence: s.fence, token: s.token}}
	case *pb.SessionEvent_Busy:
		if k.Busy.Name == s.name && !s.held {
			err := &Error{Kind: ErrBusy, Problem: problemPrefix + "busy", Holder: holderFrom(k.Busy.Holder)}
			s.finish(err)
		}
	case *pb.SessionEvent_Error:
		se := k.Error
		err := fromProblem(0, se.Type, se.Detail)
		if se.Name == "" || se.Name != s.name || s.held {
			// A heartbeat that could not be confirmed extends nothing; the lease timer decides.
			return true
		}
		if errors.Is(err, ErrUnavailable) {
			// No answer yet: send the acquire again with the next heartbeat (it is safe to repeat).
			s.acquireSent = false
			return true
		}
		s.finish(err)
	case *pb.SessionEvent_Lost:
		if k.Lost.Name == s.name && !closing {
			s.lose(newError(ErrSessionLost, "the server says the lock %q is lost (%s)", k.Lost.Name, k.Lost.Reason))
			return false
		}
	}
	return true
}

// resume takes the session over through the other endpoints, for as long as the lease lasts by this
// client's clock; false: it could not, and the lock is lost.
func (s *session) resume(cause *Error) bool {
	s.cancelStream()
	n := len(s.c.cfg.Endpoints)
	for attempt := 1; ; attempt++ {
		if !time.Now().Before(s.confirmedUntil) {
			s.finish(newError(ErrSessionLost, "the lease ran out before the session could be resumed (%v)", cause))
			return false
		}
		i := (s.endpoint + attempt) % n
		_, err := s.startStream(context.Background(), i, &pb.SessionRequest{Kind: &pb.SessionRequest_Resume{
			Resume: &pb.Resume{SessionId: s.id, Secret: s.secret}}}, s.confirmedUntil)
		if err == nil {
			s.resumes.Add(1)
			s.lastAck = time.Now()
			s.reReported = false
			s.checkSeq = s.sendHeartbeat()
			if !s.held {
				s.sendAcquire()
			}
			return true
		}
		if !retryable(err) {
			s.finish(&Error{Kind: ErrSessionLost, Problem: err.Problem, Code: err.Code, Detail: err.Error()})
			return false
		}
		cause = err
		if attempt%n == 0 {
			pause := s.c.cfg.Backoff
			if left := time.Until(s.confirmedUntil); left < pause {
				pause = left
			}
			time.Sleep(pause)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
