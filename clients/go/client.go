// Package holdfast is a Go client of holdfast, the replicated lock service: it holds locks through
// sessions (the gRPC Session stream), which wait their turn in a lock's FIFO queue, keep their lease alive
// with heartbeats, and tell the holder the moment the lock can no longer be confirmed.
//
//	c := holdfast.New(holdfast.Config{Endpoints: []string{"127.0.0.1:7070"}})
//	err := c.Do(ctx, "nightly-import", 2*time.Second, func(ctx context.Context, fence uint64) error {
//		return doTheWork(ctx, fence) // ctx is cancelled the moment the lock is no longer confirmed
//	})
//
// Layout: client.go (configuration, connections, the public calls), session.go (one session's stream,
// heartbeats, lease and resume), errors.go (the one place that maps the server's statuses to errors),
// holdfastpb (generated from proto/holdfast/v1/locks.proto). The semantics are those of the Rust client,
// docs/client.md; the wire protocol is docs/grpc-api.md.
package holdfast

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	pb "github.com/holdfast/holdfast/clients/go/holdfastpb"
)

// Limits the client checks before asking the server (the server checks them too).
const (
	nameBytesMax  = 200
	ownerBytesMax = 128
)

// Config says how to reach a cluster. Only Endpoints is required.
type Config struct {
	// Endpoints are the nodes' client ports, HOST:PORT (any node answers every call). A session is
	// opened through the first that answers and resumed through the next when its node fails.
	Endpoints []string
	// Owner is shown in the lock table beside this client's locks; default "hostname/pid".
	Owner string
	// TLS, when set, makes every connection use TLS with this configuration (the server's --tls-cert).
	TLS *tls.Config
	// APIKey, when set, is sent as "authorization: Bearer KEY" (the server's --auth).
	APIKey string
	// Attempts bounds how many endpoints one open or call tries in all (default: 2 per endpoint).
	Attempts int
	// Backoff is the pause after a round of endpoints that all failed (default 100 ms).
	Backoff time.Duration
}

// Client holds locks on a cluster. It is safe for concurrent use; each lock held is a session of its own.
type Client struct {
	cfg   Config
	owner string
	err   error // a bad Config: every call fails with it

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	next  int // the endpoint to try first: the last one that worked
}

// New makes a client. It does not contact the cluster: a call fails if no endpoint answers, and a bad
// Config makes every call fail with ErrInvalidArgument.
func New(cfg Config) *Client {
	c := &Client{cfg: cfg, conns: map[string]*grpc.ClientConn{}}
	c.owner = cfg.Owner
	if c.owner == "" {
		host, _ := os.Hostname()
		c.owner = fmt.Sprintf("%s/%d", host, os.Getpid())
		if len(c.owner) > ownerBytesMax {
			c.owner = c.owner[:ownerBytesMax]
		}
	}
	if len(c.owner) > ownerBytesMax {
		c.err = newError(ErrInvalidArgument, "Config.Owner is %d bytes; at most %d", len(c.owner), ownerBytesMax)
	}
	c.cfg.Endpoints = nil
	for _, ep := range cfg.Endpoints {
		trimmed := strings.TrimPrefix(strings.TrimPrefix(ep, "http://"), "https://")
		if trimmed == "" || !strings.Contains(trimmed, ":") {
			c.err = newError(ErrInvalidArgument, "endpoint %q is not HOST:PORT", ep)
		}
		c.cfg.Endpoints = append(c.cfg.Endpoints, trimmed)
	}
	if len(c.cfg.Endpoints) == 0 {
		c.err = newError(ErrInvalidArgument, "Config.Endpoints is empty: give at least one HOST:PORT")
	}
	if c.cfg.Attempts <= 0 {
		c.cfg.Attempts = 2 * len(c.cfg.Endpoints)
	}
	if c.cfg.Backoff <= 0 {
		c.cfg.Backoff = 100 * time.Millisecond
	}
	return c
}

// Close closes the client's connections. Locks still held are lost with them (their sessions end).
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ep, conn := range c.conns {
		conn.Close()
		delete(c.conns, ep)
	}
	return nil
}

// conn answers the connection to endpoint i (made on first use; grpc reconnects it by itself).
func (c *Client) conn(i int) (*grpc.ClientConn, error) {
	ep := c.cfg.Endpoints[i]
	c.mu.Lock()
	defer c.mu.Unlock()
	if conn, ok := c.conns[ep]; ok {
		return conn, nil
	}
	opt := grpc.WithInsecure()
	if c.cfg.TLS != nil {
		opt = grpc.WithTransportCredentials(credentials.NewTLS(c.cfg.TLS))
	}
	conn, err := grpc.Dial(ep, opt)
	if err != nil {
		return nil, newError(ErrUnavailable, "dial %s: %v", ep, err)
	}
	c.conns[ep] = conn
	return conn, nil
}

// callContext adds the API key, if any, to a call's context.
func (c *Client) callContext(ctx context.Context) context.Context {
	if c.cfg.APIKey != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.cfg.APIKey)
	}
	return ctx
}

// Get answers who holds a lock and who waits for it (a linearizable read); ErrNotFound if nobody holds it.
func (c *Client) Get(ctx context.Context, name string) (*pb.Lock, error) {
	if err := c.check(name, time.Second); err != nil {
		return nil, err
	}
	var lastErr error
	first := c.first()
	for attempt := 0; attempt < c.cfg.Attempts; attempt++ {
		i := (first + attempt) % len(c.cfg.Endpoints)
		conn, err := c.conn(i)
		if err != nil {
			lastErr = err
			continue
		}
		var trailer metadata.MD
		lock, err := pb.NewLocksClient(conn).Get(c.callContext(ctx), &pb.GetRequest{Name: name}, grpc.Trailer(&trailer))
		if err == nil {
			c.worked(i)
			return lock, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		e := fromStatus(err, trailer)
		if !retryable(e) {
			return nil, e
		}
		lastErr = e
	}
	return nil, lastErr
}

func (c *Client) first() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.next
}

func (c *Client) worked(i int) {
	c.mu.Lock()
	c.next = i
	c.mu.Unlock()
}

// check refuses bad arguments before anything is sent, with a message that says what is wrong.
func (c *Client) check(name string, lease time.Duration) error {
	if c.err != nil {
		return c.err
	}
	if name == "" || len(name) > nameBytesMax {
		return newError(ErrInvalidArgument, "lock name %q: 1 to %d bytes of A-Z a-z 0-9 . _ - :", name, nameBytesMax)
	}
	for _, r := range name {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-:", r)
		if !ok {
			return newError(ErrInvalidArgument, "lock name %q: %q is not one of A-Z a-z 0-9 . _ - :", name, r)
		}
	}
	if lease < time.Millisecond {
		return newError(ErrInvalidArgument, "lease %v: must be at least 1ms (and within the server's --ttl-min..--ttl-max, default 500ms..24h)", lease)
	}
	return nil
}

// Lock waits in the lock's FIFO queue until it is granted, or until ctx is done (then it leaves the
// queue and answers ctx.Err()). The lock is held through a session of its own with this lease: if the
// holder dies, the lock moves on one lease after its last confirmed heartbeat. Held.Done() is closed the
// moment the lease can no longer be confirmed, or when the lock is released.
func (c *Client) Lock(ctx context.Context, name string, lease time.Duration) (*Held, error) {
	return c.lock(ctx, name, lease, true)
}

// TryLock takes the lock if nobody holds it; otherwise it answers an error matching ErrBusy (an *Error
// whose Holder says who holds it, when the server said).
func (c *Client) TryLock(ctx context.Context, name string, lease time.Duration) (*Held, error) {
	return c.lock(ctx, name, lease, false)
}

func (c *Client) lock(ctx context.Context, name string, lease time.Duration, wait bool) (*Held, error) {
	if err := c.check(name, lease); err != nil {
		return nil, err
	}
	s, err := c.open(ctx, lease, name, wait)
	if err != nil {
		return nil, err
	}
	return s.acquire(ctx)
}

// Unlock lets go of a lock: the next waiter is granted it at once. The lock counts as gone from the
// moment Unlock is called. An error means the release could not be confirmed (the session then ends
// when its lease runs out on the cluster); a lock already lost answers nil.
func (c *Client) Unlock(ctx context.Context, h *Held) error {
	if h == nil {
		return newError(ErrInvalidArgument, "Unlock of a nil *Held")
	}
	return h.s.close(ctx)
}

// Do holds the lock (waiting in its queue) while fn runs, and releases it when fn returns. fn's ctx is
// cancelled the moment the lock is no longer confirmed (or when the caller's ctx is). Do answers fn's
// error; if fn answered nil but the lock was lost before it returned, Do answers an error matching
// ErrSessionLost, because the work may have overlapped with another holder's.
func (c *Client) Do(ctx context.Context, name string, lease time.Duration, fn func(ctx context.Context, fence uint64) error) error {
	return c.do(ctx, name, lease, true, fn)
}

// TryDo is Do without waiting: if the lock is held, it answers an error matching ErrBusy and fn does not run.
func (c *Client) TryDo(ctx context.Context, name string, lease time.Duration, fn func(ctx context.Context, fence uint64) error) error {
	return c.do(ctx, name, lease, false, fn)
}

func (c *Client) do(ctx context.Context, name string, lease time.Duration, wait bool, fn func(context.Context, uint64) error) error {
	if fn == nil {
		return newError(ErrInvalidArgument, "Do with a nil function")
	}
	h, err := c.lock(ctx, name, lease, wait)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-h.Done():
			cancel()
		case <-fnCtx.Done():
		}
	}()
	fnErr := fn(fnCtx, h.Fence())
	lostErr := h.Err()
	// The release's outcome matters less than fn's: a release that fails ends with the lease anyway.
	unlockCtx, unlockCancel := context.WithTimeout(context.Background(), lease)
	defer unlockCancel()
	_ = c.Unlock(unlockCtx, h)
	if fnErr != nil {
		return fnErr
	}
	return lostErr
}

// Held is a lock this client holds.
type Held struct {
	s     *session
	name  string
	fence uint64
	token string
}

// Name is the lock's name.
func (h *Held) Name() string { return h.name }

// Fence grows with every grant of the lock: pass it to the resource the lock protects, so that it can
// turn away a holder that was too slow to notice it lost the lock.
func (h *Held) Fence() uint64 { return h.fence }

// Done is closed when the lock is no longer held: released, or lost (its lease could no longer be
// confirmed, the server said it is lost, or the session could not be resumed).
func (h *Held) Done() <-chan struct{} { return h.s.done }

// Err is nil while the lock is held; after Done is closed it matches ErrSessionLost if the lock was lost,
// and ErrReleased if it was released.
func (h *Held) Err() error {
	select {
	case <-h.s.done:
		return h.s.doneErr
	default:
		return nil
	}
}

// Unlock is c.Unlock(ctx, h).
func (h *Held) Unlock(ctx context.Context) error { return h.s.close(ctx) }
