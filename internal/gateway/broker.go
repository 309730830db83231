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
	"net/http"
	"slices"
	"strings"
	"sync"

	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/egress"
)

// SecretHosts names a secret's variable and the hosts its real value may go
// to, over TLS; the value itself comes with the run (Config.SetRun).
// Cleartext are those of the hosts it may go to over plain HTTP too, as
// the profile says explicitly (secrets.NAME.cleartext_hosts).
type SecretHosts struct {
	Name      string
	Hosts     []egress.Rule
	Cleartext []egress.Rule
}

// covers reports whether the secret may go to host:port (over TLS).
func (s SecretHosts) covers(host string, port uint16) bool {
	return slices.ContainsFunc(s.Hosts, func(r egress.Rule) bool { return r.Covers(host, port) })
}

// mayGo reports whether the secret may go to host:port in a request sent
// over TLS (overTLS) or plain HTTP.
func (s SecretHosts) mayGo(host string, port uint16, overTLS bool) bool {
	if !s.covers(host, port) {
		return false
	}
	return overTLS || slices.ContainsFunc(s.Cleartext, func(r egress.Rule) bool { return r.Covers(host, port) })
}

// run is what the gateway holds of a run: the issuer of its certificates
// and the secrets with their values.
type run struct {
	issuer   *broker.Issuer
	secrets  []liveSecret
	matchers sync.Map // the indices of some secrets, "0,2," -> *matcher of their values
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

// brokeredHeaders is what brokerHeaders did with the sentinels of a request's
// headers: the secrets whose values it put in, those whose sentinels it
// left as they were (another host's), and those it held back because the
// request is plain HTTP and they go to this host over TLS only.
type brokeredHeaders struct {
	put, left, cleartext []string
}

// brokerHeaders puts the real values in place of the sentinels in h, for
// the secrets that may go to host:port over TLS (overTLS) or plain HTTP,
// wherever they are in a header's value (and inside a Basic credential);
// any other sentinel stays as it is. When cleartext is not empty, the
// request must not be sent: h holds values in clear.
func (r *run) brokerHeaders(host string, port uint16, overTLS bool, h http.Header) (b brokeredHeaders) {
	if r == nil {
		return b
	}
	for name, values := range h {
		for i, v := range values {
			if basic, ok := strings.CutPrefix(v, "Basic "); ok && strings.EqualFold(name, "Authorization") {
				if dec, err := base64.StdEncoding.DecodeString(strings.TrimSpace(basic)); err == nil && bytes.Contains(dec, []byte(sentinelPrefix)) {
					out := r.replace(host, port, overTLS, string(dec), &b)
					values[i] = "Basic " + base64.StdEncoding.EncodeToString([]byte(out))
					continue
				}
			}
			if strings.Contains(v, sentinelPrefix) {
				values[i] = r.replace(host, port, overTLS, v, &b)
			}
		}
	}
	return b
}

// replace puts in v the values of the secrets that may go to host:port, and
// notes the names put in, left, and held back from plain HTTP.
func (r *run) replace(host string, port uint16, overTLS bool, v string, b *brokeredHeaders) string {
	for _, s := range r.secrets {
		if !strings.Contains(v, s.sentinel) {
			continue
		}
		switch {
		case s.mayGo(host, port, overTLS):
			v = strings.ReplaceAll(v, s.sentinel, s.value)
			b.put = appendOnce(b.put, s.Name)
		case s.covers(host, port):
			b.cleartext = appendOnce(b.cleartext, s.Name)
		default:
			b.left = appendOnce(b.left, s.Name)
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

// matcher finds the real values a response from host:port may carry back:
// of the secrets that may go there (over TLS or not: a value put in over
// TLS may come back on any connection). Nil when none may.
func (r *run) matcher(host string, port uint16) *matcher {
	if r == nil {
		return nil
	}
	var secrets []liveSecret
	var key strings.Builder
	for i, s := range r.secrets {
		if s.covers(host, port) {
			secrets = append(secrets, s)
			fmt.Fprintf(&key, "%d,", i)
		}
	}
	if len(secrets) == 0 {
		return nil
	}
	// One matcher per set of secrets, not per host: a wildcard's names are
	// many, the sets few.
	if m, ok := r.matchers.Load(key.String()); ok {
		return m.(*matcher)
	}
	m, _ := r.matchers.LoadOrStore(key.String(), newMatcher(secrets))
	return m.(*matcher)
}
