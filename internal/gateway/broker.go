package gateway

// Credential brokering and request limits: which connections the gateway
// opens (terminating TLS with the run's CA), the sentinels it replaces in
// the requests it sees, and the real values it masks in their responses.
// The connections themselves are intercept.go's.

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"

	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/egress"
)

// SecretHosts names a secret's variable and the hosts its real value may go
// to; the value itself comes with the run (Config.SetRun).
type SecretHosts struct {
	Name  string
	Hosts []egress.Rule
}

// covers reports whether the secret may go to host:port.
func (s SecretHosts) covers(host string, port uint16) bool {
	return slices.ContainsFunc(s.Hosts, func(r egress.Rule) bool { return r.Covers(host, port) })
}

// run is what the gateway holds of a run: the issuer of its certificates
// and the secrets with their values.
type run struct {
	issuer  *broker.Issuer
	secrets []liveSecret
}

type liveSecret struct {
	SecretHosts
	sentinel, value string
}

// SetRun gives the gateway the values of a run's secrets (a prepared
// gateway, or one started again, gets its run's so): from then on it opens
// the connections it must see, with Config.Issuer, which must be set. A
// secret of the run that the gateway was not started with (Config.Secrets)
// is an error: the hosts it may go to are fixed when the gateway starts,
// with what it forwards in the kernel.
func (c *Config) SetRun(r broker.Run) error {
	if c.Issuer == nil {
		return errors.New("the gateway has no CA")
	}
	live := &run{issuer: c.Issuer}
	for _, s := range r.Secrets {
		i := slices.IndexFunc(c.Secrets, func(h SecretHosts) bool { return h.Name == s.Name })
		switch {
		case i < 0:
			return fmt.Errorf("the run's secret %s is not one the gateway brokers", s.Name)
		case s.Sentinel == "" || s.Value == "":
			return fmt.Errorf("the run's secret %s has no sentinel or no value", s.Name)
		}
		live.secrets = append(live.secrets, liveSecret{SecretHosts: c.Secrets[i], sentinel: s.Sentinel, value: s.Value})
	}
	c.run.Store(live)
	return nil
}

// intercepts reports whether the gateway must see the requests of an
// allowed connection to host:port: a secret may go there, or the rules
// limit its requests by method or path.
func (c *Config) intercepts(host string, port uint16) bool {
	if slices.ContainsFunc(c.Secrets, func(s SecretHosts) bool { return s.covers(host, port) }) {
		return true
	}
	return c.Policy.Limited(host, port)
}

// interceptsName reports whether the gateway must see the connections to
// name on some port its rules allow: the kernel must not forward it.
func (c *Config) interceptsName(name string, ports []uint16) bool {
	return slices.ContainsFunc(ports, func(p uint16) bool { return c.intercepts(name, p) })
}

// sentinelPrefix starts every sentinel (broker.NewSentinel): a header
// without it holds none, and costs one search.
const sentinelPrefix = "propio-sentinel-"

// brokerHeaders puts the real values in place of the sentinels in h, for
// the secrets whose hosts cover host:port, wherever they are in a header's
// value (and inside a Basic credential); any other sentinel stays as it is.
// It returns the names of the secrets put in and of those left.
func (r *run) brokerHeaders(host string, port uint16, h http.Header) (put, left []string) {
	if r == nil {
		return nil, nil
	}
	for name, values := range h {
		for i, v := range values {
			if basic, ok := strings.CutPrefix(v, "Basic "); ok && strings.EqualFold(name, "Authorization") {
				if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(basic)); err == nil && bytes.Contains(dec, []byte(sentinelPrefix)) {
					out := r.replace(host, port, string(dec), &put, &left)
					values[i] = "Basic " + base64.StdEncoding.EncodeToString([]byte(out))
					continue
				}
			}
			if strings.Contains(v, sentinelPrefix) {
				values[i] = r.replace(host, port, v, &put, &left)
			}
		}
	}
	return put, left
}

// replace puts in v the values of the secrets that may go to host:port, and
// notes the names put in and left.
func (r *run) replace(host string, port uint16, v string, put, left *[]string) string {
	for _, s := range r.secrets {
		if !strings.Contains(v, s.sentinel) {
			continue
		}
		if s.covers(host, port) {
			v = strings.ReplaceAll(v, s.sentinel, s.value)
			*put = appendOnce(*put, s.Name)
		} else {
			*left = appendOnce(*left, s.Name)
		}
	}
	return v
}

// sentinelsIn are the names of the secrets whose sentinels s holds (the
// request's URL: never brokered, only noted).
func (r *run) sentinelsIn(s string) []string {
	if r == nil || !strings.Contains(s, sentinelPrefix) {
		return nil
	}
	var names []string
	for _, sec := range r.secrets {
		if strings.Contains(s, sec.sentinel) {
			names = append(names, sec.Name)
		}
	}
	return names
}

func appendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// values are the real values a response from host:port may carry back: of
// the secrets that may go there. None when none may.
func (r *run) values(host string, port uint16) []liveSecret {
	if r == nil {
		return nil
	}
	var out []liveSecret
	for _, s := range r.secrets {
		if s.covers(host, port) {
			out = append(out, s)
		}
	}
	return out
}

// maskHeaders masks each of the values in h, in place, with as many *.
func maskHeaders(h http.Header, secrets []liveSecret, masked *[]string) {
	for _, vals := range h {
		for i, v := range vals {
			for _, s := range secrets {
				if strings.Contains(v, s.value) {
					v = strings.ReplaceAll(v, s.value, strings.Repeat("*", len(s.value)))
					*masked = appendOnce(*masked, s.Name)
				}
			}
			vals[i] = v
		}
	}
}

// masker masks the real values in a response body as it streams, each with
// as many * (so the length, and Content-Length, stay), and then in its
// trailers. It reads into the caller's buffer and masks there; it holds back
// only an end that could begin a value (copied aside until the next read),
// so a stream (an event of server-sent events) is not delayed by it.
type masker struct {
	r       io.ReadCloser
	secrets []liveSecret
	trailer http.Header // the response's, filled once the body has ended
	masked  *[]string
	longest int // the longest value's length

	held []byte // read, masked as far as it can be, not given yet
	err  error
	done bool
}

func newMasker(r io.ReadCloser, secrets []liveSecret, trailer http.Header, masked *[]string) *masker {
	m := &masker{r: r, secrets: secrets, trailer: trailer, masked: masked}
	for _, s := range secrets {
		m.longest = max(m.longest, len(s.value))
	}
	return m
}

func (m *masker) Read(p []byte) (int, error) {
	if len(p) <= m.longest { // too small to read into: go through a buffer
		buf := make([]byte, 2*m.longest+1)
		n, err := m.Read(buf)
		m.held = append(buf[copy(p, buf[:n]):n:n], m.held...)
		return min(n, len(p)), err
	}
	for {
		h := copy(p, m.held)
		m.held = m.held[:0]
		if m.err != nil {
			if h > 0 {
				return h, nil // held back: no value can complete it now
			}
			if errors.Is(m.err, io.EOF) && !m.done {
				m.done = true
				maskHeaders(m.trailer, m.secrets, m.masked)
			}
			return 0, m.err
		}
		n, err := m.r.Read(p[h:])
		m.err = err
		n += h
		m.mask(p[:n])
		keep := 0
		if err == nil {
			keep = m.partial(p[:n])
		}
		m.held = append(m.held, p[n-keep:n]...)
		if n-keep > 0 {
			return n - keep, nil
		}
	}
}

// mask masks every whole value in b.
func (m *masker) mask(b []byte) {
	for _, s := range m.secrets {
		v := []byte(s.value)
		for from := 0; ; {
			i := bytes.Index(b[from:], v)
			if i < 0 {
				break
			}
			for j := from + i; j < from+i+len(v); j++ {
				b[j] = '*'
			}
			from += i + len(v)
			*m.masked = appendOnce(*m.masked, s.Name)
		}
	}
}

// partial is the length of the longest end of b that begins a value: it
// is held back until the next read says whether the value follows.
func (m *masker) partial(b []byte) int {
	longest := 0
	for _, s := range m.secrets {
		for n := min(len(s.value)-1, len(b)); n > longest; n-- {
			if b[len(b)-n] == s.value[0] && string(b[len(b)-n:]) == s.value[:n] {
				longest = n
				break
			}
		}
	}
	return longest
}

func (m *masker) Close() error { return m.r.Close() }
