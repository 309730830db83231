package cli

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

func TestPruneLogsKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	for i := range 10 {
		path := filepath.Join(dir, "propio-x-"+strconv.Itoa(i)+".jsonl")
		if err := os.WriteFile(path, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		at := base.Add(time.Duration(i) * time.Minute) // 9 is the newest
		os.Chtimes(path, at, at)
	}
	other := filepath.Join(dir, "notes.txt")
	os.WriteFile(other, []byte("not a log"), 0o600)

	pruneLogs(dir, 4)
	for i := range 10 {
		_, err := os.Stat(filepath.Join(dir, "propio-x-"+strconv.Itoa(i)+".jsonl"))
		if kept := err == nil; kept != (i >= 6) {
			t.Errorf("log %d kept=%v, want kept only for the 4 newest", i, kept)
		}
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("a file that is not a log was removed: %v", err)
	}
}
