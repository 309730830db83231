package decisionlog

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

func appendTo(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); !ok(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 5 s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFollowCopiesAsTheLogGrows: a log that is not there yet is waited
// for, what is appended comes as it is, and what is appended just after
// the stop (the settling) comes too, before Follow returns.
func TestFollowCopiesAsTheLogGrows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.jsonl")
	var out testenv.Buffer
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- Follow(context.Background(), path, &out, stop) }()
	time.Sleep(3 * followPoll)
	appendTo(t, path, "one\n")
	waitFor(t, "the first line", func() bool { return out.String() == "one\n" })
	appendTo(t, path, "two\n")
	waitFor(t, "the second line", func() bool { return out.String() == "one\ntwo\n" })
	close(stop)
	time.Sleep(SettleQuiet / 3)
	appendTo(t, path, "three\n")
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(SettleMax + 2*time.Second):
		t.Fatal("Follow did not return after its stop")
	}
	if got := out.String(); got != "one\ntwo\nthree\n" {
		t.Errorf("Follow copied %q", got)
	}
}

// TestFollowEndsWithItsContext: a Follow whose context ends returns at
// once, with the context's error.
func TestFollowEndsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Follow(ctx, filepath.Join(t.TempDir(), "none.jsonl"), &testenv.Buffer{}, nil) }()
	cancel()
	select {
	case err := <-done:
		if err != context.Canceled {
			t.Errorf("Follow returned %v, want context.Canceled", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Follow did not return when its context ended")
	}
}

// TestCopyFromKeepsWholeEntriesOnly: whole entries are written again, one
// per line; a line that is not an entry (garbage, an unknown field, two
// values on one line, an over-long line) and a last line without its
// newline are left out, and the error says how many were.
func TestCopyFromKeepsWholeEntriesOnly(t *testing.T) {
	good := func(host string) string {
		b, _ := json.Marshal(Entry{Time: t0, Via: "dns", Host: host, Allowed: true, Reason: "allow rule"})
		return string(b) + "\n"
	}
	in := good("a.test") + "not json\n" + `{"host":"x.test","forged":true}` + "\n" +
		good("b.test")[:len(good("b.test"))-1] + " " + good("c.test") +
		`{"host":"` + strings.Repeat("y", maxLine) + `"}` + "\n" +
		good("d.test") + good("e.test")[:20]
	var out bytes.Buffer
	err := NewWriter(&out).CopyFrom(strings.NewReader(in))
	if err == nil || !strings.Contains(err.Error(), "4 line(s) left out") {
		t.Errorf("CopyFrom returned %v, want 4 lines left out", err)
	}
	var hosts []string
	for _, line := range strings.SplitAfter(out.String(), "\n") {
		if line == "" {
			continue
		}
		var e Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil || !strings.HasSuffix(line, "\n") {
			t.Fatalf("CopyFrom wrote %q (%v)", line, err)
		}
		hosts = append(hosts, e.Host)
	}
	if strings.Join(hosts, ",") != "a.test,d.test" {
		t.Errorf("CopyFrom kept %v, want a.test,d.test", hosts)
	}
}
