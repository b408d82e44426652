// Command lease-compat runs the Go reference lease manager (lease.go) as one
// node contending for one key, so the TypeScript module can be tested
// against it over a shared bucket (see compat_test.ts in the repo root).
//
// lease.go is not part of this repo: the test copies it from
// ../shared/reference/lease.go into package lease/ of a temp build dir,
// beside this file, go.mod and go.sum, and builds the binary there. By hand,
// from the repo root:
//
//	d=$(mktemp -d) && mkdir "$d/lease" && cp compat/go/* "$d" &&
//	  cp ../shared/reference/lease.go "$d/lease" && (cd "$d" && go build -o lease-compat .)
//
// The program loops Guard(key, write) until -duration has passed or it gets
// SIGTERM/SIGINT, then calls Close (which only stops renewal, so its lease
// expires after the TTL) and exits 0. It prints one JSON object per line on
// stdout, t being Unix milliseconds:
//
//	{"ev":"ready","t":...,"node":"go-a","pid":123}
//	{"ev":"start","t":...,"node":"go-a","rev":17}   write begins; rev: the entry's revision read inside the write, omitted if not ours
//	{"ev":"end","t":...,"node":"go-a"}              write ends
//	{"ev":"refused","t":...,"node":"go-a","kind":"not_holder","err":"store lease held by another node"}
//	{"ev":"exit","t":...,"node":"go-a","writes":42}
//
// kind is "not_holder" (errors.Is ErrNotHolder), "unavailable" (errors.Is
// ErrUnavailable) or "other". Setup errors go to stderr with exit code 1.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"leasecompat/lease"
)

type event struct {
	Ev     string `json:"ev"`
	T      int64  `json:"t"`
	Node   string `json:"node"`
	Pid    int    `json:"pid,omitempty"`
	Rev    uint64 `json:"rev,omitempty"`
	Kind   string `json:"kind,omitempty"`
	Err    string `json:"err,omitempty"`
	Writes int    `json:"writes,omitempty"`
}

var enc = json.NewEncoder(os.Stdout)

// emit writes one line; os.Stdout is unbuffered, so each event reaches the
// reader in one write, in order.
func emit(e event) {
	e.T = time.Now().UnixMilli()
	if err := enc.Encode(e); err != nil {
		fail("stdout: %v", err)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "lease-compat: "+format+"\n", args...)
	os.Exit(1)
}

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	v, ok := os.LookupEnv(name)
	if !ok || v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		fail("%s must be a Go duration such as 1500ms: %v", name, err)
	}
	return d
}

func main() {
	server := flag.String("server", env("NATS_URL", nats.DefaultURL), "NATS server URL (env NATS_URL)")
	node := flag.String("node", env("LEASE_NODE", ""), "this node's id, stored as the lease value (env LEASE_NODE; required)")
	ttl := flag.Duration("ttl", envDuration("LEASE_TTL", 2*time.Second), "lease TTL, used when lease.New creates the bucket (env LEASE_TTL)")
	key := flag.String("key", env("LEASE_KEY", "k"), "store key to contend for (env LEASE_KEY)")
	duration := flag.Duration("duration", envDuration("LEASE_DURATION", 5*time.Second), "how long to run before Close and exit (env LEASE_DURATION)")
	hold := flag.Duration("hold", envDuration("LEASE_HOLD", 30*time.Millisecond), "how long each guarded write lasts (env LEASE_HOLD)")
	pause := flag.Duration("pause", envDuration("LEASE_PAUSE", 10*time.Millisecond), "pause between Guard calls (env LEASE_PAUSE)")
	flag.Parse()
	if *node == "" {
		fail("-node (or LEASE_NODE) is required")
	}

	// Signals are caught from the start, so a SIGTERM that arrives during
	// setup still ends the run through Close.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)

	nc, err := nats.Connect(*server, nats.Name("lease-compat "+*node), nats.Timeout(5*time.Second))
	if err != nil {
		fail("connect %s: %v", *server, err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		fail("jetstream: %v", err)
	}
	m, err := lease.New(js, *node, *ttl)
	if err != nil {
		fail("lease.New: %v", err)
	}
	// A second handle on the bucket, only to report the revision a write
	// runs under; Manager keeps its own private.
	kv, err := js.KeyValue(lease.Bucket)
	if err != nil {
		fail("bucket %q: %v", lease.Bucket, err)
	}
	emit(event{Ev: "ready", Node: *node, Pid: os.Getpid()})

	deadline := time.NewTimer(*duration)
	defer deadline.Stop()
	writes := 0
loop:
	for {
		// Checked between guards only, so a write in progress always ends
		// (and prints "end") before Close.
		select {
		case <-deadline.C:
			break loop
		case <-stop:
			break loop
		default:
		}
		err := m.Guard(*key, func() error {
			var rev uint64
			if e, err := kv.Get(*key); err == nil && string(e.Value()) == *node {
				rev = e.Revision()
			}
			emit(event{Ev: "start", Node: *node, Rev: rev})
			time.Sleep(*hold)
			writes++
			emit(event{Ev: "end", Node: *node})
			return nil
		})
		if err != nil {
			kind := "other"
			switch {
			case errors.Is(err, lease.ErrNotHolder):
				kind = "not_holder"
			case errors.Is(err, lease.ErrUnavailable):
				kind = "unavailable"
			}
			emit(event{Ev: "refused", Node: *node, Kind: kind, Err: err.Error()})
		}
		time.Sleep(*pause)
	}
	m.Close()
	emit(event{Ev: "exit", Node: *node, Writes: writes})
}
