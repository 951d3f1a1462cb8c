package holdfast

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// certificate makes a certificate for 127.0.0.1 and localhost, good for servers and clients, signed by
// parent (self-signed when parent is nil: a CA). Answers it, its key, and their PEM.
func certificate(t *testing.T, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour)}
	if parent == nil {
		tmpl.Subject = pkix.Name{CommonName: "holdfast go test CA"}
		tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
		tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
		parent, parentKey = tmpl, key
	} else {
		tmpl.Subject = pkix.Name{CommonName: "localhost"}
		tmpl.DNSNames = []string{"localhost"}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.KeyUsage = x509.KeyUsageDigitalSignature
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	keyDer, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDer})
}

func TestTLSOption(t *testing.T) {
	dir := t.TempDir()
	ca, caKey, caPEM, _ := certificate(t, nil, nil)
	_, _, nodePEM, nodeKeyPEM := certificate(t, ca, caKey)
	write := func(name string, data []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	tlsConfig := &tls.Config{RootCAs: pool}
	cl := startClusterWith(t, 3, []string{"--tls-cert", write("node.pem", nodePEM), "--tls-key", write("node.key", nodeKeyPEM),
		"--tls-ca", write("ca.pem", caPEM)}, tlsConfig)
	c := New(Config{Endpoints: cl.endpoints(), TLS: tlsConfig})
	defer c.Close()
	if err := c.Do(ctxT(t, 10*time.Second), "over-tls", lease, func(_ context.Context, fence uint64) error {
		if fence == 0 {
			t.Error("fence 0")
		}
		return nil
	}); err != nil {
		t.Fatalf("Do over TLS: %v", err)
	}
	// Without TLS the node does not answer the session: unavailable after the bounded attempts.
	plain := New(Config{Endpoints: cl.endpoints()})
	defer plain.Close()
	if _, err := plain.Lock(ctxT(t, 10*time.Second), "over-tls", lease); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a cleartext client of a TLS cluster: %v, want ErrUnavailable", err)
	}
}

func TestAPIKeyOption(t *testing.T) {
	cl := startClusterWith(t, 3, []string{"--auth", "--open-signup"}, nil)
	signup := func() string {
		resp, err := http.Post("http://"+cl.endpoints()[0]+"/v1/signup", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			APIKey string `json:"api_key"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || body.APIKey == "" {
			t.Fatalf("signup: %d %v", resp.StatusCode, err)
		}
		return body.APIKey
	}
	key := signup()
	c := New(Config{Endpoints: cl.endpoints(), APIKey: key})
	defer c.Close()
	held, err := c.Lock(ctxT(t, 10*time.Second), "keyed", lease)
	if err != nil {
		t.Fatalf("Lock with an API key: %v", err)
	}
	if f := holderFence(t, c, "keyed"); f != held.Fence() {
		t.Fatalf("the key's namespace reads fence %d, held %d", f, held.Fence())
	}
	// Another key is another namespace: the lock is free there.
	other := New(Config{Endpoints: cl.endpoints(), APIKey: signup()})
	defer other.Close()
	if err := other.TryDo(ctxT(t, 10*time.Second), "keyed", lease, func(context.Context, uint64) error { return nil }); err != nil {
		t.Fatalf("the same name under another key: %v", err)
	}
	for _, bad := range []string{"", "hf_not-a-key"} {
		anon := New(Config{Endpoints: cl.endpoints(), APIKey: bad})
		if _, err := anon.Lock(ctxT(t, 10*time.Second), "keyed", lease); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("key %q: %v, want ErrUnauthenticated", bad, err)
		}
		anon.Close()
	}
	held.Unlock(ctxT(t, 5*time.Second))
}
