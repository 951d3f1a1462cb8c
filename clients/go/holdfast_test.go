package holdfast

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// lease is the session lease of the tests: long enough to survive a leader's death (docs/grpc-api.md,
// "Choosing a lease"), short enough to keep the suite quick.
const lease = 2 * time.Second

// Environment of the helper process: the test binary re-executed to hold a lock until it is killed.
const (
	helperEnv         = "HOLDFAST_GO_TEST_HELPER_ENDPOINTS"
	helperLockEnv     = "HOLDFAST_GO_TEST_HELPER_LOCK"
	helperFencePrefix = "fence "
)

func TestMain(m *testing.M) {
	if endpoints := os.Getenv(helperEnv); endpoints != "" {
		holdUntilKilled(strings.Split(endpoints, ","), os.Getenv(helperLockEnv))
		return
	}
	os.Exit(m.Run())
}

// holdUntilKilled takes the lock, prints its fence, and keeps the session alive until the process dies.
func holdUntilKilled(endpoints []string, name string) {
	c := New(Config{Endpoints: endpoints, Owner: "helper"})
	held, err := c.Lock(context.Background(), name, lease)
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: lock:", err)
		os.Exit(2)
	}
	fmt.Printf("%s%d\n", helperFencePrefix, held.Fence())
	<-held.Done()
	fmt.Fprintln(os.Stderr, "helper: lost the lock:", held.Err())
	os.Exit(3)
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func isNotFound(err error) bool { return errors.Is(err, ErrNotFound) }

func TestDoRunsTheFunctionWithAFenceAndReleases(t *testing.T) {
	cl := startCluster(t, 3)
	c := New(Config{Endpoints: cl.endpoints()})
	defer c.Close()
	ran := false
	err := c.Do(ctxT(t, 10*time.Second), "nightly-import", lease, func(ctx context.Context, fence uint64) error {
		ran = true
		if fence == 0 {
			t.Errorf("fence 0")
		}
		if got := holderFence(t, c, "nightly-import"); got != fence {
			t.Errorf("the cluster reads fence %d, Do gave %d", got, fence)
		}
		if ctx.Err() != nil {
			t.Errorf("ctx done while the lock is held: %v", ctx.Err())
		}
		return nil
	})
	if err != nil || !ran {
		t.Fatalf("Do: %v (ran %v)", err, ran)
	}
	if got := holderFence(t, c, "nightly-import"); got != 0 {
		t.Fatalf("after Do the lock is still held (fence %d)", got)
	}
	// fn's error is Do's.
	mine := errors.New("mine")
	if err := c.Do(ctxT(t, 10*time.Second), "nightly-import", lease, func(context.Context, uint64) error { return mine }); err != mine {
		t.Fatalf("Do answered %v, want fn's error", err)
	}
}

func TestHandOverIsFIFOBetweenTwoGoHolders(t *testing.T) {
	cl := startCluster(t, 3)
	eps := cl.endpoints()
	// Each client goes through another node first.
	a := New(Config{Endpoints: eps, Owner: "a"})
	b := New(Config{Endpoints: []string{eps[1], eps[2], eps[0]}, Owner: "b"})
	c := New(Config{Endpoints: []string{eps[2], eps[0], eps[1]}, Owner: "c"})
	for _, x := range []*Client{a, b, c} {
		defer x.Close()
	}
	const name = "fifo"
	heldA, err := a.Lock(ctxT(t, 10*time.Second), name, lease)
	if err != nil {
		t.Fatal(err)
	}
	waiters := func(n int) func() bool {
		return func() bool {
			lock, err := a.Get(ctxT(t, 5*time.Second), name)
			return err == nil && len(lock.Waiters) == n
		}
	}
	type grant struct {
		held *Held
		err  error
		at   time.Time
	}
	lockAsync := func(x *Client) chan grant {
		ch := make(chan grant, 1)
		go func() {
			h, err := x.Lock(ctxT(t, 30*time.Second), name, lease)
			ch <- grant{h, err, time.Now()}
		}()
		return ch
	}
	gotB := lockAsync(b)
	waitFor(t, 5*time.Second, "b waits in the queue", waiters(1))
	gotC := lockAsync(c)
	waitFor(t, 5*time.Second, "c waits behind b", waiters(2))

	released := time.Now()
	if err := a.Unlock(ctxT(t, 5*time.Second), heldA); err != nil {
		t.Fatalf("unlock a: %v", err)
	}
	<-heldA.Done()
	if !errors.Is(heldA.Err(), ErrReleased) {
		t.Fatalf("a's Err after Unlock: %v", heldA.Err())
	}
	var gb grant
	select {
	case gb = <-gotB:
	case <-time.After(5 * time.Second):
		t.Fatal("b was not granted the lock within 5 s of a's release")
	}
	if gb.err != nil {
		t.Fatalf("b: %v", gb.err)
	}
	if d := gb.at.Sub(released); d > time.Second {
		t.Errorf("b was granted %v after a's release; a hand-over is immediate", d)
	}
	if gb.held.Fence() <= heldA.Fence() {
		t.Errorf("b's fence %d is not larger than a's %d", gb.held.Fence(), heldA.Fence())
	}
	select {
	case gc := <-gotC:
		t.Fatalf("c was granted before b released: %+v", gc)
	default:
	}
	if got := holderFence(t, a, name); got != gb.held.Fence() {
		t.Fatalf("the cluster reads fence %d, b holds %d", got, gb.held.Fence())
	}
	if err := gb.held.Unlock(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	gc := <-gotC
	if gc.err != nil || gc.held.Fence() <= gb.held.Fence() {
		t.Fatalf("c: %v, fence after b's %d", gc.err, gb.held.Fence())
	}
	gc.held.Unlock(ctxT(t, 5*time.Second))
}

func TestTryDoOnAHeldLockIsBusy(t *testing.T) {
	cl := startCluster(t, 3)
	a := New(Config{Endpoints: cl.endpoints(), Owner: "a"})
	b := New(Config{Endpoints: cl.endpoints()[1:], Owner: "b"})
	defer a.Close()
	defer b.Close()
	held, err := a.TryLock(ctxT(t, 10*time.Second), "busy", lease)
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	err = b.TryDo(ctxT(t, 10*time.Second), "busy", lease, func(context.Context, uint64) error { ran = true; return nil })
	if !errors.Is(err, ErrBusy) || ran {
		t.Fatalf("TryDo on a held lock: %v (ran %v), want ErrBusy", err, ran)
	}
	var e *Error
	if !errors.As(err, &e) || e.Holder == nil || e.Holder.Fence != held.Fence() || e.Holder.Owner != "a" {
		t.Fatalf("the busy error should name the holder (a, fence %d): %#v", held.Fence(), e)
	}
	if _, err := b.TryLock(ctxT(t, 10*time.Second), "busy", lease); !errors.Is(err, ErrBusy) {
		t.Fatalf("TryLock on a held lock: %v", err)
	}
	// The busy try queued nothing, and the holder still holds it.
	lock, err := a.Get(ctxT(t, 5*time.Second), "busy")
	if err != nil || len(lock.Waiters) != 0 || lock.Holder.Fence != held.Fence() {
		t.Fatalf("after busy tries: %v %v", lock, err)
	}
	if err := held.Unlock(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := b.TryDo(ctxT(t, 10*time.Second), "busy", lease, func(_ context.Context, fence uint64) error {
		if fence <= held.Fence() {
			t.Errorf("fence %d after %d", fence, held.Fence())
		}
		return nil
	}); err != nil {
		t.Fatalf("TryDo on a free lock: %v", err)
	}
}

func TestAHolderKilledWithSIGKILLIsReplacedAfterItsLeaseAndNotBefore(t *testing.T) {
	cl := startCluster(t, 3)
	const name = "killed-holder"
	helper := exec.Command(os.Args[0])
	helper.Env = append(os.Environ(), helperEnv+"="+strings.Join(cl.endpoints(), ","), helperLockEnv+"="+name)
	helper.Stderr = os.Stderr
	helper.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { helper.Process.Kill(); helper.Wait() })
	fences := make(chan uint64, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		var f uint64
		fmt.Sscanf(strings.TrimPrefix(line, helperFencePrefix), "%d", &f)
		fences <- f
	}()
	var helperFence uint64
	select {
	case helperFence = <-fences:
	case <-time.After(15 * time.Second):
		t.Fatal("the helper did not report a fence within 15 s")
	}
	if helperFence == 0 {
		t.Fatal("the helper failed to take the lock")
	}
	c := New(Config{Endpoints: cl.endpoints(), Owner: "successor"})
	defer c.Close()
	if got := holderFence(t, c, name); got != helperFence {
		t.Fatalf("the cluster reads fence %d, the helper holds %d", got, helperFence)
	}
	type grant struct {
		held *Held
		err  error
		at   time.Time
	}
	got := make(chan grant, 1)
	go func() {
		h, err := c.Lock(ctxT(t, 30*time.Second), name, lease)
		got <- grant{h, err, time.Now()}
	}()
	waitFor(t, 5*time.Second, "the successor waits in the queue", func() bool {
		lock, err := c.Get(ctxT(t, 5*time.Second), name)
		return err == nil && len(lock.Waiters) == 1
	})

	helper.Process.Signal(syscall.SIGKILL)
	helper.Wait()
	killed := time.Now()
	// Its last acknowledged heartbeat was at most lease/4 before the kill, so its session lives at least
	// three quarters of a lease more: half a lease after the kill the cluster still says it holds the lock.
	time.Sleep(lease / 2)
	if f := holderFence(t, c, name); f != helperFence {
		t.Fatalf("half a lease after the kill the cluster reads fence %d; the killed helper's %d should hold", f, helperFence)
	}
	select {
	case g := <-got:
		t.Fatalf("the successor was granted %v after the kill, before the helper's lease could end: %+v", time.Since(killed), g)
	default:
	}
	var g grant
	select {
	case g = <-got:
	case <-time.After(lease + 5*time.Second):
		t.Fatalf("the successor was not granted the lock within a lease + 5 s of the kill")
	}
	if g.err != nil {
		t.Fatal(g.err)
	}
	after := g.at.Sub(killed)
	if min := lease*3/4 - 200*time.Millisecond; after < min {
		t.Fatalf("granted %v after the kill; not before %v (a lease after the last acknowledged heartbeat)", after, min)
	}
	if g.held.Fence() <= helperFence {
		t.Fatalf("successor fence %d is not larger than the killed holder's %d", g.held.Fence(), helperFence)
	}
	if f := holderFence(t, c, name); f != g.held.Fence() {
		t.Fatalf("the cluster reads fence %d, the successor holds %d", f, g.held.Fence())
	}
	t.Logf("killed holder (fence %d) replaced %v after the kill (fence %d)", helperFence, after, g.held.Fence())
	g.held.Unlock(ctxT(t, 5*time.Second))
}

func TestBadArgumentsAreRefusedClearly(t *testing.T) {
	fn := func(context.Context, uint64) error { t.Error("fn ran"); return nil }
	ctx := ctxT(t, 10*time.Second)
	for _, cfg := range []Config{{}, {Endpoints: []string{""}}, {Endpoints: []string{"no-port"}},
		{Endpoints: []string{"127.0.0.1:1"}, Owner: strings.Repeat("o", 129)}} {
		err := New(cfg).Do(ctx, "x", lease, fn)
		if !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("config %+v: %v, want ErrInvalidArgument", cfg, err)
		}
	}
	// Client-side checks: nothing is sent (the endpoint does not even exist).
	c := New(Config{Endpoints: []string{"127.0.0.1:1"}})
	cases := []struct {
		name  string
		lease time.Duration
		want  string
	}{
		{"", lease, "lock name"},
		{"has space", lease, "' '"},
		{strings.Repeat("n", 201), lease, "1 to 200 bytes"},
		{"ok", 0, "lease 0s"},
		{"ok", -time.Second, "lease -1s"},
	}
	for _, tc := range cases {
		_, err := c.Lock(ctx, tc.name, tc.lease)
		if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Lock(%q, %v): %v, want ErrInvalidArgument saying %q", tc.name, tc.lease, err, tc.want)
		}
	}
	if err := c.Do(ctx, "ok", lease, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Do with nil fn: %v", err)
	}
	if err := c.Unlock(ctx, nil); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Unlock(nil): %v", err)
	}
	// Server-side: a lease below --ttl-min (500 ms) is refused with its problem type.
	cl := startCluster(t, 3)
	c = New(Config{Endpoints: cl.endpoints()})
	defer c.Close()
	_, err := c.Lock(ctx, "ok", 100*time.Millisecond)
	var e *Error
	if !errors.Is(err, ErrInvalidArgument) || !errors.As(err, &e) || e.Problem != "urn:holdfast:invalid-ttl" {
		t.Fatalf("a 100ms lease: %v, want ErrInvalidArgument urn:holdfast:invalid-ttl", err)
	}
	t.Logf("refused: %v", err)
	// An endpoint nobody listens on: unavailable after the bounded attempts, not a hang.
	dead := New(Config{Endpoints: freeAddrs(t, 2)})
	if _, err := dead.Lock(ctx, "ok", lease); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no node listening: %v, want ErrUnavailable", err)
	}
}

func TestDoContextIsCancelledWhenTheLeaseCanNoLongerBeConfirmed(t *testing.T) {
	cl := startCluster(t, 3)
	c := New(Config{Endpoints: cl.endpoints()})
	defer c.Close()
	started := make(chan struct{})
	var killed, cancelled time.Time
	err := c.Do(ctxT(t, 30*time.Second), "cut-away", lease, func(ctx context.Context, fence uint64) error {
		close(started)
		for id := 1; id <= 3; id++ {
			cl.kill(id)
		}
		killed = time.Now()
		select {
		case <-ctx.Done():
			cancelled = time.Now()
		case <-time.After(lease + 5*time.Second):
			t.Error("ctx not cancelled within a lease + 5 s of the whole cluster's death")
		}
		return nil
	})
	<-started
	if !errors.Is(err, ErrSessionLost) {
		t.Fatalf("Do after the lock was lost under fn: %v, want ErrSessionLost", err)
	}
	d := cancelled.Sub(killed)
	// Lost exactly when the confirmed lease ends: after the last acknowledged heartbeat's send plus the
	// lease, so between 3/4 of a lease and a lease after the kill (plus scheduling).
	if d < lease*3/4-100*time.Millisecond || d > lease+500*time.Millisecond {
		t.Fatalf("ctx cancelled %v after the cluster died; want within [3/4 lease, lease]", d)
	}
	t.Logf("lost %v after the cluster died: %v", d, err)
}

func TestASessionResumesOnAnotherNodeWhenItsNodeDies(t *testing.T) {
	cl := startCluster(t, 3)
	c := New(Config{Endpoints: cl.endpoints(), Owner: "survivor"})
	defer c.Close()
	const name = "survives"
	held, err := c.Lock(ctxT(t, 10*time.Second), name, lease)
	if err != nil {
		t.Fatal(err)
	}
	if through := held.s.through.Load(); through != 0 {
		t.Fatalf("the session runs through endpoint %d, expected the first", through)
	}
	cl.kill(1)
	killed := time.Now()
	// Two leases later the session still holds the lock, through another node, with the same fence.
	select {
	case <-held.Done():
		t.Fatalf("lost %v after its node died: %v", time.Since(killed), held.Err())
	case <-time.After(2 * lease):
	}
	if n, through := held.s.resumes.Load(), held.s.through.Load(); n != 1 || through == 0 {
		t.Fatalf("resumed %d times, now through endpoint %d; want once, through another node", n, through)
	}
	other := New(Config{Endpoints: cl.endpoints()[1:]})
	defer other.Close()
	if f := holderFence(t, other, name); f != held.Fence() {
		t.Fatalf("the cluster reads fence %d; the resumed session holds %d", f, held.Fence())
	}
	if _, err := other.TryLock(ctxT(t, 10*time.Second), name, lease); !errors.Is(err, ErrBusy) {
		t.Fatalf("another client could take the lock: %v", err)
	}
	if err := held.Unlock(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("unlock after resume: %v", err)
	}
	if f := holderFence(t, other, name); f != 0 {
		t.Fatalf("after the unlock the cluster reads fence %d", f)
	}
}

func TestCancellingAWaitLeavesTheQueue(t *testing.T) {
	cl := startCluster(t, 3)
	a := New(Config{Endpoints: cl.endpoints()})
	defer a.Close()
	held, err := a.Lock(ctxT(t, 10*time.Second), "queue", lease)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { _, err := a.Lock(ctx, "queue", lease); done <- err }()
	waitFor(t, 5*time.Second, "the second Lock waits", func() bool {
		lock, err := a.Get(ctxT(t, 5*time.Second), "queue")
		return err == nil && len(lock.Waiters) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled Lock answered %v", err)
	}
	waitFor(t, 5*time.Second, "the cancelled waiter leaves the queue", func() bool {
		lock, err := a.Get(ctxT(t, 5*time.Second), "queue")
		return err == nil && len(lock.Waiters) == 0
	})
	held.Unlock(ctxT(t, 5*time.Second))
}

func TestAWaiterWhoseNodeDiesResumesAndIsStillHandedTheLock(t *testing.T) {
	cl := startCluster(t, 3)
	eps := cl.endpoints()
	a := New(Config{Endpoints: []string{eps[1], eps[2], eps[0]}, Owner: "a"})
	b := New(Config{Endpoints: eps, Owner: "b"}) // through node 1 first
	defer a.Close()
	defer b.Close()
	const name = "waiter-resumes"
	heldA, err := a.Lock(ctxT(t, 10*time.Second), name, lease)
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		held *Held
		err  error
		at   time.Time
	}
	got := make(chan grant, 1)
	go func() {
		h, err := b.Lock(ctxT(t, 30*time.Second), name, lease)
		got <- grant{h, err, time.Now()}
	}()
	waitFor(t, 5*time.Second, "b waits in the queue", func() bool {
		lock, err := a.Get(ctxT(t, 5*time.Second), name)
		return err == nil && len(lock.Waiters) == 1
	})
	cl.kill(1)
	// Past b's lease: had its session not been resumed through another node, it would have expired and
	// left the queue.
	time.Sleep(lease + lease/2)
	lock, err := a.Get(ctxT(t, 5*time.Second), name)
	if err != nil || len(lock.Waiters) != 1 || lock.Waiters[0].Owner != "b" {
		t.Fatalf("b's place in the queue after its node died: %v %v", lock, err)
	}
	released := time.Now()
	if err := heldA.Unlock(ctxT(t, 5*time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case g := <-got:
		if g.err != nil {
			t.Fatalf("b: %v", g.err)
		}
		if g.held.Fence() <= heldA.Fence() || g.at.Sub(released) > time.Second {
			t.Fatalf("b granted fence %d (a's %d) %v after the release", g.held.Fence(), heldA.Fence(), g.at.Sub(released))
		}
		if n := g.held.s.resumes.Load(); n != 1 {
			t.Fatalf("b's session resumed %d times", n)
		}
		g.held.Unlock(ctxT(t, 5*time.Second))
	case <-time.After(5 * time.Second):
		t.Fatal("b was not granted the lock within 5 s of a's release")
	}
}
