package approver

import (
	"context"
	"fmt"
	"html"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
	if err := cmd.Start(); err != nil {
		remove()
		return nil, fmt.Errorf("running %s: %w", opener, err)
	}
	go cmd.Wait()
	return remove, nil
}
