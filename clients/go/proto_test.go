package holdfast

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// The generated code in holdfastpb is checked in; this regenerates it from proto/ with protoc,
// protoc-gen-go and protoc-gen-go-grpc (clients/go/test installs them) and fails if it differs.
func TestGeneratedCodeMatchesTheProto(t *testing.T) {
	for _, tool := range []string{"protoc", "protoc-gen-go", "protoc-gen-go-grpc"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (apt-get install protobuf-compiler protoc-gen-go protoc-gen-go-grpc; clients/go/test does): %v", tool, err)
		}
	}
	out := t.TempDir()
	gen := exec.Command("sh", "generate.sh", out)
	if output, err := gen.CombinedOutput(); err != nil {
		t.Fatalf("generate.sh: %v\n%s", err, output)
	}
	for _, file := range []string{"locks.pb.go", "locks_grpc.pb.go"} {
		want, err := os.ReadFile(filepath.Join(out, "holdfastpb", file))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("holdfastpb", file))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("holdfastpb/%s differs from what proto/holdfast/v1/locks.proto generates: run clients/go/generate.sh", file)
		}
	}
}
