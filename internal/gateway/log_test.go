package gateway

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// entryLog collects the gateway's log for a test to read.
type entryLog struct{ testenv.Buffer }

// entries parses the log strictly: every line one Entry, no unknown field.
func (l *entryLog) entries(t *testing.T) []decisionlog.Entry {
	t.Helper()
	text := l.String()
	var out []decisionlog.Entry
	for line := range strings.Lines(text) {
		d := json.NewDecoder(strings.NewReader(line))
		d.DisallowUnknownFields()
		var e decisionlog.Entry
		if err := d.Decode(&e); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if e.Time.IsZero() {
			t.Errorf("log line %q has no time", line)
		}
		out = append(out, e)
	}
	return out
}

// wait returns the log once it holds n entries, and fails if it holds more
// a moment later (or fewer after ioTimeout).
func (l *entryLog) wait(t *testing.T, n int) []decisionlog.Entry {
	t.Helper()
	deadline := time.Now().Add(ioTimeout)
	for len(l.entries(t)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("waited %v for %d log entries, have %d: %+v", ioTimeout, n, len(l.entries(t)), l.entries(t))
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	got := l.entries(t)
	if len(got) != n {
		t.Fatalf("want %d log entries, have %d: %+v", n, len(got), got)
	}
	return got
}

// waitFor returns the first entry for host with the given via, waiting up to
// five seconds for the gateway to write it (a connection is logged when it
// ends).
func (l *entryLog) waitFor(t *testing.T, via, host string) decisionlog.Entry {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		for _, e := range l.entries(t) {
			if e.Via == via && e.Host == host {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s log entry for %q; the log: %+v", via, host, l.entries(t))
		}
		time.Sleep(10 * time.Millisecond)
	}
}
