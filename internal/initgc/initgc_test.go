package initgc

import (
	"math"
	"os"
	"runtime/debug"
	"testing"
)

// Held from initialization, with a memory limit; restored as the
// environment set it, however many times Restore is called.
func TestHeldThenRestored(t *testing.T) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		t.Skip("GOGC or GOMEMLIMIT is set: the defaults are what this test restores")
	}
	if p := debug.SetGCPercent(-1); p != -1 {
		t.Errorf("the collector's percent before Restore = %d; want it held (-1)", p)
	}
	if l := debug.SetMemoryLimit(-1); l != held {
		t.Errorf("the memory limit before Restore = %d; want %d", l, held)
	}
	Restore()
	Restore()
	if p := debug.SetGCPercent(-1); p != 100 {
		t.Errorf("the collector's percent after Restore = %d; want the default 100", p)
	}
	debug.SetGCPercent(100)
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		t.Errorf("the memory limit after Restore = %d; want none", l)
	}
}
