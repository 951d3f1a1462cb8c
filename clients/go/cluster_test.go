package holdfast

// The harness: a cluster of real `holdfast server` processes on free ports of 127.0.0.1, in a temporary
// directory, killed when the test ends (as tests/common/mod.rs does for the Rust tests).

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startBound is how long a cluster may take until every node answers /readyz with 200.
const startBound = 30 * time.Second

type node struct {
	id         int
	clientAddr string
	peerAddr   string
	cmd        *exec.Cmd
	log        string
}

type cluster struct {
	t     *testing.T
	nodes []*node
}

// holdfastBin is the server binary: $HOLDFAST_BIN, else the workspace's target/debug/holdfast.
func holdfastBin(t *testing.T) string {
	if bin := os.Getenv("HOLDFAST_BIN"); bin != "" {
		return bin
	}
	bin, err := filepath.Abs("../../target/debug/holdfast")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no holdfast binary at %s (build it with `cargo build -p holdfast`, or set HOLDFAST_BIN): %v", bin, err)
	}
	return bin
}

// freeAddrs answers n free ports of 127.0.0.1, holding every probe until all are chosen so that no two
// are the same.
func freeAddrs(t *testing.T, n int) []string {
	var probes []net.Listener
	var addrs []string
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		probes = append(probes, l)
		addrs = append(addrs, l.Addr().String())
	}
	for _, l := range probes {
		l.Close()
	}
	return addrs
}

// startCluster starts n nodes that know each other and waits (bounded) until every one is ready. They are
// killed when the test ends.
func startCluster(t *testing.T, n int) *cluster {
	t.Helper()
	return startClusterWith(t, n, nil, nil)
}

// startClusterWith is startCluster with extra server flags; with tlsConfig, the client port speaks TLS.
func startClusterWith(t *testing.T, n int, extraArgs []string, tlsConfig *tls.Config) *cluster {
	t.Helper()
	bin := holdfastBin(t)
	dir := t.TempDir()
	addrs := freeAddrs(t, 2*n)
	c := &cluster{t: t}
	var members []string
	for id := 1; id <= n; id++ {
		nd := &node{id: id, clientAddr: addrs[2*(id-1)], peerAddr: addrs[2*(id-1)+1],
			log: filepath.Join(dir, fmt.Sprintf("node%d.log", id))}
		c.nodes = append(c.nodes, nd)
		members = append(members, fmt.Sprintf("%d=%s", id, nd.peerAddr))
	}
	t.Cleanup(c.killAll)
	for _, nd := range c.nodes {
		logFile, err := os.Create(nd.log)
		if err != nil {
			t.Fatal(err)
		}
		args := append([]string{"server", "--id", fmt.Sprint(nd.id), "--members", strings.Join(members, ","),
			"--client-addr", nd.clientAddr, "--peer-addr", nd.peerAddr,
			"--data-dir", filepath.Join(dir, fmt.Sprintf("node%d", nd.id), "data")}, extraArgs...)
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = logFile, logFile
		// If the test binary dies without its cleanup (a panic, a timeout), the nodes die with it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		// Settings from the environment of whoever runs the tests must not leak into the nodes.
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "HOLDFAST_") {
				cmd.Env = append(cmd.Env, kv)
			}
		}
		cmd.Env = append(cmd.Env, "RUST_LOG=info,openraft=warn", "NO_COLOR=1")
		if err := cmd.Start(); err != nil {
			t.Fatalf("start node %d: %v", nd.id, err)
		}
		logFile.Close()
		nd.cmd = cmd
	}
	deadline := time.Now().Add(startBound)
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil, TLSClientConfig: tlsConfig}}
	scheme := "http://"
	if tlsConfig != nil {
		scheme = "https://"
	}
	for _, nd := range c.nodes {
		for {
			resp, err := client.Get(scheme + nd.clientAddr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					break
				}
			}
			if time.Now().After(deadline) {
				c.dumpLogs()
				t.Fatalf("node %d not ready (GET /readyz != 200) after %v: %v", nd.id, startBound, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c
}

func (c *cluster) endpoints() []string {
	var eps []string
	for _, nd := range c.nodes {
		eps = append(eps, nd.clientAddr)
	}
	return eps
}

// kill kills node id with SIGKILL and waits for it.
func (c *cluster) kill(id int) {
	nd := c.nodes[id-1]
	if nd.cmd == nil {
		return
	}
	nd.cmd.Process.Signal(syscall.SIGKILL)
	nd.cmd.Wait()
	nd.cmd = nil
}

func (c *cluster) killAll() {
	if c.t.Failed() {
		c.dumpLogs()
	}
	for _, nd := range c.nodes {
		c.kill(nd.id)
	}
}

func (c *cluster) dumpLogs() {
	for _, nd := range c.nodes {
		data, _ := os.ReadFile(nd.log)
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 20 {
			lines = lines[len(lines)-20:]
		}
		c.t.Logf("node %d log (tail):\n%s", nd.id, strings.Join(lines, "\n"))
	}
}

// waitFor polls cond every 20 ms until it holds or bound passes (then the test fails with what).
func waitFor(t *testing.T, bound time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", bound, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// holderFence is the fence of the lock's holder as the cluster reads it (a linearizable Get); 0 if
// nobody holds it.
func holderFence(t *testing.T, c *Client, name string) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	lock, err := c.Get(ctx, name)
	if err != nil {
		if isNotFound(err) {
			return 0
		}
		t.Fatalf("get %s: %v", name, err)
	}
	return lock.GetHolder().GetFence()
}
