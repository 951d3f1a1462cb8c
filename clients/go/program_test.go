package holdfast

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// A program of one's own, outside this module, builds against it with Debian's packages and no module
// proxy, as README.md says (debian-vendor), and holds a lock on a real cluster.
func TestAProgramOfYourOwnBuildsWithDebianVendor(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Fatalf("no go command: %v", err)
	}
	here, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	ours, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	// This module's requirements, which the program's go.mod must list too (vendor mode reads no go.sum
	// and resolves nothing).
	requires := regexp.MustCompile(`(?m)^\t(\S+ v\S+)`).FindAllStringSubmatch(string(ours), -1)
	var goMod strings.Builder
	goMod.WriteString("module example.com/importer\n\ngo 1.19\n\nrequire github.com/holdfast/holdfast/clients/go v0.0.0\n\nrequire (\n")
	for _, r := range requires {
		goMod.WriteString("\t" + r[1] + " // indirect\n")
	}
	goMod.WriteString(")\n\nreplace github.com/holdfast/holdfast/clients/go => " + here + "\n")
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", goMod.String())
	write("main.go", `package main

import (
	"context"
	"fmt"
	"os"
	"time"

	holdfast "github.com/holdfast/holdfast/clients/go"
)

func main() {
	c := holdfast.New(holdfast.Config{Endpoints: os.Args[1:]})
	err := c.Do(context.Background(), "nightly-import", 2*time.Second, func(ctx context.Context, fence uint64) error {
		fmt.Println("fence", fence)
		return nil
	})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
}
`)
	run := func(name string, args ...string) string {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GO111MODULE=on", "GOPROXY=off", "GOFLAGS=-mod=vendor")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	run(filepath.Join(here, "debian-vendor"), dir)
	run("go", "build", "-o", "importer", ".")
	cl := startCluster(t, 3)
	out := run(filepath.Join(dir, "importer"), cl.endpoints()...)
	if !regexp.MustCompile(`^fence [1-9][0-9]*\n$`).MatchString(out) {
		t.Fatalf("the program printed %q", out)
	}
}
