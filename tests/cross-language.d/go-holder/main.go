// The Go holder of tests/cross-language: holds a session lock with clients/go's API.
//
// Usage: go-holder NAME LEASE LOG RELEASE_FILE BOUND ENDPOINT...   (LEASE, BOUND: Go durations)
//
// Waits in NAME's queue (owner "xlang-go"); once granted, appends "go start FENCE" to LOG; holds until
// RELEASE_FILE exists, then appends "go end FENCE" and unlocks (exit 0). If the lock is lost, it appends
// "go lost FENCE" and exits 3. Gives up (exit 4) if not granted or not told to release within BOUND.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	holdfast "github.com/holdfast/holdfast/clients/go"
)

func logLine(path, line string) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-holder:", err)
		os.Exit(5)
	}
	defer f.Close()
	if _, err := f.WriteString(line + "\n"); err != nil {
		fmt.Fprintln(os.Stderr, "go-holder:", err)
		os.Exit(5)
	}
	_ = f.Sync()
}

func main() {
	if len(os.Args) < 7 {
		fmt.Fprintln(os.Stderr, "usage: go-holder NAME LEASE LOG RELEASE_FILE BOUND ENDPOINT...")
		os.Exit(2)
	}
	name, logPath, releaseFile := os.Args[1], os.Args[3], os.Args[4]
	lease, err := time.ParseDuration(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-holder: lease:", err)
		os.Exit(2)
	}
	bound, err := time.ParseDuration(os.Args[5])
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-holder: bound:", err)
		os.Exit(2)
	}
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	c := holdfast.New(holdfast.Config{Endpoints: os.Args[6:], Owner: "xlang-go"})
	defer c.Close()
	held, err := c.Lock(ctx, name, lease)
	if err != nil {
		fmt.Fprintln(os.Stderr, "go-holder: lock:", err)
		os.Exit(4)
	}
	fence := held.Fence()
	logLine(logPath, fmt.Sprintf("go start %d", fence))
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-held.Done():
			logLine(logPath, fmt.Sprintf("go lost %d", fence))
			fmt.Fprintln(os.Stderr, "go-holder: lost:", held.Err())
			os.Exit(3)
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "go-holder: never told to release")
			_ = held.Unlock(context.Background())
			os.Exit(4)
		case <-tick.C:
			if _, err := os.Stat(releaseFile); err == nil {
				select {
				case <-held.Done():
					logLine(logPath, fmt.Sprintf("go lost %d", fence))
					os.Exit(3)
				default:
				}
				logLine(logPath, fmt.Sprintf("go end %d", fence))
				uctx, ucancel := context.WithTimeout(context.Background(), 10*time.Second)
				err := held.Unlock(uctx)
				ucancel()
				if err != nil {
					fmt.Fprintln(os.Stderr, "go-holder: unlock not confirmed:", err)
				}
				return
			}
		}
	}
}
