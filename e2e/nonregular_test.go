package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestNonRegularRepoProfileFIFO: an agent in a sandbox of a workspace that
// had no .propio at start makes .propio/sandbox.yaml a FIFO. A blocking read
// of it would hang the user's next command there for good; run, doctor,
// trust and validate each fail at once instead, naming the file, and
// nothing is created.
func TestNonRegularRepoProfileFIFO(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	p := s.Profile(probeOffline)
	probeOK(t, probeRun(s, p, "fs", "mkdir .propio", "mkfifo .propio/sandbox.yaml"), "done 2")
	st, err := os.Lstat(filepath.Join(s.Workspace, ".propio", "sandbox.yaml"))
	if err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Fatalf("the sandbox did not leave a FIFO at .propio/sandbox.yaml: %v %v", st, err)
	}
	for _, args := range [][]string{{"run", "--", "exit", "0"}, {"doctor"}, {"trust"}, {"validate"}} {
		// A regression hangs: bound each command well below the harness's
		// two minutes, so that it fails saying which.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		r, err := execute(ctx, s.Command(ctx, args...))
		cancel()
		if err != nil {
			t.Fatalf("%v with a FIFO for a profile: %v", args, err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("%v took %v", args, took)
		}
		if r.Code != 1 || !strings.Contains(r.Stderr, "profile file .propio/sandbox.yaml is a FIFO (named pipe), not a regular file") {
			t.Errorf("%v: want exit 1 naming the FIFO:\n%s", args, r)
		}
		if left := s.Leftovers(); len(left) > 0 {
			t.Errorf("%v left %v", args, left)
		}
	}
}
