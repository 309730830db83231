package gatewayd

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/propio/propio-sandbox/internal/ask"
	"github.com/propio/propio-sandbox/internal/gateway"
)

// serveAsk makes the gateway ask (cfg.Ask) and serves the ask socket in
// o.Ask, the sandbox's ask directory, which only the launching user can
// enter (the launcher made it 0700) and which only this container has. It
// returns what stops it.
func serveAsk(cfg *gateway.Config, o Options) (stop func(), err error) {
	s, err := ask.Open(o.Ask)
	if err != nil {
		return nil, fmt.Errorf("gateway: reading the ask directory: %w", err)
	}
	// An approver that holds the sandbox is on its way: a request waits
	// for it.
	b := &ask.Broker{Project: s.Project, Workspace: s.Workspace, Timeout: o.AskTimeout, Expect: func() bool { return ask.Held(o.Ask) }}
	if b.Timeout <= 0 {
		return nil, errors.New("gateway: --ask-timeout must be a positive duration")
	}
	sock := filepath.Join(o.Ask, ask.SocketName)
	_ = os.Remove(sock) // a socket of an earlier gateway of this sandbox
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, fmt.Errorf("gateway: serving the ask socket: %w", err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("gateway: serving the ask socket: %w", err)
	}
	srv := &http.Server{Handler: b.Handler()}
	go srv.Serve(l)
	cfg.Ask = b
	o.report("asking about unlisted destinations on %s (timeout %s)", sock, b.Timeout)
	return func() { srv.Close(); os.Remove(sock) }, nil
}
