package gatewayd

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/broker"
)

// TestTakesTheRun: the gateway makes its CA, constrained to the hosts it
// opens, and writes its certificate (never its key) into the broker
// directory once it listens; it takes the run's file at start, and each one
// a run writes later (as into a gateway prepared ahead), leaving none on
// disk; one that names a secret the gateway does not broker is refused and
// said.
func TestTakesTheRun(t *testing.T) {
	dir, err := broker.MakeDir(t.TempDir(), "proj")
	if err != nil {
		t.Fatal(err)
	}
	newRun := func(name string) broker.Run {
		return broker.Run{Secrets: []broker.Secret{{Name: name, Sentinel: broker.NewSentinel(name), Value: "sk-value"}}}
	}
	if err := broker.WriteRun(dir, newRun("LLM_TOKEN")); err != nil {
		t.Fatal(err)
	}
	r := &reports{}
	o := options(t, []string{"llm.test"}, 0, r)
	o.Log = filepath.Join(t.TempDir(), "log.jsonl")
	o.Broker = dir
	if o.Secrets, err = ParseSecrets([]string{"LLM_TOKEN=llm.test", "LLM_TOKEN=llm.test:8443"}, []string{"LLM_TOKEN=llm.test:8443"}); err != nil {
		t.Fatal(err)
	}
	if len(o.Secrets) != 1 || len(o.Secrets[0].Hosts) != 2 || len(o.Secrets[0].Cleartext) != 1 {
		t.Fatalf("ParseSecrets: %+v, want one secret with two hosts, one in clear", o.Secrets)
	}
	for _, clear := range []string{"LLM_TOKEN=other.test", "OTHER=llm.test", "LLM_TOKEN"} {
		if _, err := ParseSecrets([]string{"LLM_TOKEN=llm.test"}, []string{clear}); err == nil {
			t.Errorf("--secret-cleartext %s: no error", clear)
		}
	}
	lines, stop := start(t, o, r)
	defer stop()
	if want := "serving on 127.0.0.1 (1 allow, 0 deny rules, 1 secrets; connections relayed in user space)"; lines[len(lines)-1] != want {
		t.Errorf("reported %q, want %q", lines, want)
	}
	gone := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(filepath.Join(dir, broker.RunFile)); errors.Is(err, os.ErrNotExist) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the run's file is still there 10s after it was written")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	gone()
	caPEM, err := broker.ReadCA(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode([]byte(caPEM))
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil || !slices.Equal(ca.PermittedDNSDomains, []string{"llm.test"}) || len(ca.PermittedIPRanges) != 0 {
		t.Errorf("the gateway's CA: %v, constrained to %v %v, want llm.test alone", err, ca.PermittedDNSDomains, ca.PermittedIPRanges)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if b, _ := os.ReadFile(filepath.Join(dir, e.Name())); strings.Contains(string(b), "PRIVATE KEY") {
			t.Errorf("%s in the broker directory holds a private key", e.Name())
		}
	}

	if err := broker.WriteRun(dir, newRun("LLM_TOKEN")); err != nil {
		t.Fatal(err)
	}
	gone()
	if err := broker.WriteRun(dir, newRun("OTHER")); err != nil {
		t.Fatal(err)
	}
	gone()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r.mu.Lock()
		got := slices.Clone(r.lines)
		r.mu.Unlock()
		took := slices.ContainsFunc(got, func(l string) bool { return strings.HasPrefix(l, "took a run's secrets from "+dir) })
		refused := slices.ContainsFunc(got, func(l string) bool {
			return strings.Contains(l, "the run's secret OTHER is not one the gateway brokers")
		})
		if took && refused {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reported %q: want a run taken, and OTHER refused", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, l := range r.lines {
		if strings.Contains(l, "sk-value") {
			t.Errorf("a report holds the value: %q", l)
		}
	}
}

func TestParseSecretsErrors(t *testing.T) {
	for _, bad := range []string{"NOEQUALS", "=llm.test", "T=*.com"} {
		if _, err := ParseSecrets([]string{bad}, nil); err == nil {
			t.Errorf("ParseSecrets(%q) took it", bad)
		}
	}
}

// TestFallbackRoots: a gateway whose container has no system store (FROM
// scratch) still verifies upstreams, with the roots built in. The store is
// read once per process, so the check runs in a process of its own whose
// environment points the store at nothing.
func TestFallbackRoots(t *testing.T) {
	if os.Getenv("PROPIO_TEST_NO_STORE") == "1" {
		pool, err := upstreamRoots("")
		if err != nil {
			t.Fatal(err)
		}
		//lint:ignore SA1019 the count of a pool made here, not the system's
		if n := len(pool.Subjects()); n < 100 {
			t.Fatalf("with no system store, the gateway has %d roots; want the built-in ones (over 100)", n)
		}
		return
	}
	empty := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFallbackRoots$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PROPIO_TEST_NO_STORE=1", "SSL_CERT_FILE="+filepath.Join(empty, "none.pem"), "SSL_CERT_DIR="+empty)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
}
