// Package gateway is the egress gateway of allowlist sandboxes: the only way
// out of a sandbox's internal network. Every connection is decided by an
// egress.Policy and written to a JSON-lines decision log.
//
// Two ways through, both on:
//   - explicit: an HTTP proxy (absolute-URI requests and CONNECT) and a SOCKS5
//     proxy, for tools that honour HTTP_PROXY, HTTPS_PROXY and ALL_PROXY;
//   - transparent: a DNS responder that answers allowed names with the
//     gateway's own address and refuses the rest, a TLS listener that routes
//     by SNI, an HTTP listener that routes by Host, and TCP forwards for
//     host:port rules, for tools that ignore proxy variables.
//
// The network is reached only through Config.Resolve and Config.Dial, so tests
// point the gateway at servers they started themselves.
package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/propio/propio-sandbox/internal/egress"
)

// Config is what one gateway enforces and how it reaches the outside.
type Config struct {
	Policy egress.Policy
	// Profile names the profile file, for the hint in a denial.
	Profile string
	// Resolve looks up an allowed name upstream. Default: net.DefaultResolver.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial connects to an upstream address. Default: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// Log receives one entry per decision. Required.
	Log *Logger
	// Now is the clock of the log. Default: time.Now.
	Now func() time.Time
}

func (c *Config) resolve(ctx context.Context, host string) ([]netip.Addr, error) {
	if c.Resolve != nil {
		return c.Resolve(ctx, host)
	}
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

func (c *Config) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if c.Dial != nil {
		return c.Dial(ctx, network, addr)
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

func (c *Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// Entry is one decision in the log.
type Entry struct {
	Time      time.Time `json:"time"`
	Client    string    `json:"client"` // the sandbox-side address
	Via       string    `json:"via"`    // http, connect, socks5, dns, sni, host, tcp
	Host      string    `json:"host"`
	Port      uint16    `json:"port"`
	Allowed   bool      `json:"allowed"`
	Rule      string    `json:"rule,omitempty"` // the rule that decided, as written
	Reason    string    `json:"reason"`
	BytesUp   int64     `json:"bytes_up"`   // sandbox to upstream
	BytesDown int64     `json:"bytes_down"` // upstream to sandbox
	Error     string    `json:"error,omitempty"`
}

// Logger writes entries as JSON lines; it is safe for concurrent use.
type Logger struct {
	mu sync.Mutex
	w  io.Writer
}

// NewLogger writes to w.
func NewLogger(w io.Writer) *Logger { return &Logger{w: w} }

// Write logs one entry.
func (l *Logger) Write(e Entry) error {
	line, err := json.Marshal(e)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(append(line, '\n'))
	return err
}

// decide asks the policy and returns the log entry it starts.
func (c *Config) decide(client net.Addr, via, host string, port uint16) Entry {
	d := c.Policy.Decide(host, port)
	e := Entry{Time: c.now().UTC(), Via: via, Host: host, Port: port, Allowed: d.Allowed, Rule: d.Rule, Reason: d.Reason}
	if client != nil {
		e.Client = client.String()
	}
	return e
}

// DenialHint is what a denied client is told: the host and the profile line
// that would allow it.
func (c *Config) DenialHint(host string, port uint16, reason string) string {
	where := "the profile"
	if c.Profile != "" {
		where = c.Profile
	}
	return "propio-sandbox gateway: " + egress.Suggest(host, port) + " is not allowed (" + reason + ").\n" +
		"To allow it, add to network.allow in " + where + ":\n    - \"" + egress.Suggest(host, port) + "\"\n"
}
