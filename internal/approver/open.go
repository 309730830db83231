package approver

import (
	"bytes"
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Open opens url in the user's browser. The address, whose token lets one
// decide, never goes on a command line (which other users can read): the
// browser is handed a file of the user's own, in a private directory under
// stateDir, that redirects to it. The function returned removes the file.
func Open(ctx context.Context, url, stateDir string) (func(), error) {
	opener := "xdg-open"
	if runtime.GOOS == "darwin" {
		opener = "open"
	}
	path, err := exec.LookPath(opener)
	if err != nil {
		return nil, fmt.Errorf("no %s here", opener)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(stateDir, "ui-")
	if err != nil {
		return nil, err
	}
	remove := func() { os.RemoveAll(dir) }
	page := filepath.Join(dir, "open.html")
	body := `<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url=` + html.EscapeString(url) + `"><title>propio-sandbox ui</title>`
	if err := os.WriteFile(page, []byte(body), 0o600); err != nil {
		remove()
		return nil, err
	}
	cmd := exec.CommandContext(ctx, path, page)
	var stderr bytes.Buffer
	cmd.Stderr = &limited{&stderr, 512}
	if err := cmd.Start(); err != nil {
		remove()
		return nil, fmt.Errorf("running %s: %w", opener, err)
	}
	// The opener fails fast (no browser, no display); when it is still
	// running after a while, the browser it started is running.
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			remove()
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			return nil, fmt.Errorf("%s: %v: %s", opener, err, lines[len(lines)-1])
		}
	case <-time.After(openWait):
	}
	return remove, nil
}

// openWait is how long Open waits for the opener to fail.
const openWait = 2 * time.Second

// limited writes at most n bytes to w and drops the rest.
type limited struct {
	w *bytes.Buffer
	n int
}

func (l *limited) Write(p []byte) (int, error) {
	if room := l.n - l.w.Len(); room > 0 {
		l.w.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}
