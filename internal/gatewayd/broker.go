package gatewayd

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/gateway"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// fallbackRoots makes the roots the gateway verifies upstreams with when
// its container has no system store (FROM scratch, on a host whose store
// is not mounted in, as on macOS) Mozilla's, as Debian's ca-certificates
// ships them: what golang.org/x/crypto/x509roots/fallback does as it is
// imported, done here in the gateway only, and once, so that the
// launcher, the same executable, does not parse 150 certificates each
// time it starts.
var fallbackRoots = sync.OnceFunc(func() {
	pool := x509.NewCertPool()
	for r := range bundle.Roots() {
		cert, err := x509.ParseCertificate(r.Certificate)
		if err != nil {
			continue // x/crypto's own tests parse every one of them
		}
		if r.Constraint == nil {
			pool.AddCert(cert)
		} else {
			pool.AddCertWithConstraint(cert, r.Constraint)
		}
	}
	x509.SetFallbackRoots(pool)
})

// upstreamRoots are the roots the gateway verifies the upstreams whose TLS
// it terminates with: the system's (the store mounted at its usual place,
// else the ones built in) and the certificates of file, when given.
func upstreamRoots(file string) (*x509.CertPool, error) {
	fallbackRoots()
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if file == "" {
		return pool, nil
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("gateway: reading --upstream-ca: %w", err)
	}
	if !pool.AppendCertsFromPEM(data) {
		return nil, fmt.Errorf("gateway: --upstream-ca %s holds no PEM certificate", file)
	}
	return pool, nil
}

// takeRun gives cfg the run's secrets, from the run's file in the broker
// directory, which it removes. A directory without one is no error (a
// gateway prepared ahead of its run, or started again): intercepted
// connections are then refused until a run's file comes (watchRuns).
func takeRun(cfg *gateway.Config, dir string) (bool, error) {
	r, err := broker.TakeRun(dir)
	if errors.Is(err, broker.ErrNoRun) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("gateway: %w", err)
	}
	if err := cfg.SetRun(r); err != nil {
		return false, fmt.Errorf("gateway: the run's secrets: %w", err)
	}
	return true, nil
}

// watchRuns takes each run's file written into dir from now on (a run that
// adopts a gateway prepared ahead hands it its secrets so), until ctx ends,
// reporting each.
func watchRuns(ctx context.Context, cfg *gateway.Config, dir string, o *Options) error {
	return watchDir(ctx, dir, broker.RunFile, func() {
		ok, err := takeRun(cfg, dir)
		switch {
		case err != nil:
			o.report("note: %v", err)
		case ok:
			o.report("took a run's secrets from %s", dir)
		}
	})
}

// brokering sets cfg up to open the connections it must see: the roots it
// verifies upstreams with, the run's CA (made here, for the hosts it opens,
// its key kept in this process's memory alone), the run's secrets, and the
// watch for the next run's. The CA's certificate is written into the broker
// directory once the gateway listens (publishCA).
func brokering(ctx context.Context, cfg *gateway.Config, o *Options) error {
	roots, err := upstreamRoots(o.UpstreamCA)
	if err != nil {
		return err
	}
	cfg.UpstreamRoots = roots
	if o.Broker == "" {
		return nil
	}
	if cfg.Issuer, err = broker.NewIssuer(openedHosts(o), time.Now()); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	took, err := takeRun(cfg, o.Broker)
	if err != nil {
		return err
	}
	if !took {
		o.report("note: no run's secrets in %s yet: the connections the gateway must open are refused until a run writes them", o.Broker)
	}
	if err := watchRuns(ctx, cfg, o.Broker, o); err != nil {
		o.report("note: %v: a run's secrets written later are not taken", err)
	}
	return nil
}

// publishCA writes the run's CA certificate into the broker directory,
// where the launcher reads it for the sandbox's trust files: once the
// gateway listens, so that it also says the gateway is ready.
func publishCA(cfg *gateway.Config, o *Options) error {
	if o.Broker == "" {
		return nil
	}
	if err := broker.WriteCA(o.Broker, cfg.Issuer.CAPEM()); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}

// openedHosts are the hosts whose TLS the gateway may terminate, which its
// CA is constrained to: those of the secrets, and those of the allow rules
// that limit requests (all of them, the user's grants too, when the
// profile limits methods: network.methods).
func openedHosts(o *Options) []string {
	var hosts []string
	add := func(r egress.Rule) {
		if h := r.HostPattern(); h != "" && !slices.Contains(hosts, h) {
			hosts = append(hosts, h)
		}
	}
	for _, s := range o.Secrets {
		for _, r := range s.Hosts {
			add(r)
		}
	}
	for _, r := range o.Policy.Allow {
		if len(r.Methods) > 0 || len(r.Paths) > 0 || len(o.Policy.Methods) > 0 {
			add(r)
		}
	}
	return hosts
}

// ParseSecrets reads --secret NAME=RULE flags into the secrets and their
// hosts, in the order their names first come, and --secret-cleartext
// NAME=RULE flags into the hosts each may go to over plain HTTP: a rule of
// the same secret's --secret, as written.
func ParseSecrets(flags, cleartext []string) ([]gateway.SecretHosts, error) {
	var out []gateway.SecretHosts
	for _, v := range flags {
		name, r, err := parseSecretFlag("--secret", v)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(out, func(s gateway.SecretHosts) bool { return s.Name == name })
		if i < 0 {
			out = append(out, gateway.SecretHosts{Name: name})
			i = len(out) - 1
		}
		out[i].Hosts = append(out[i].Hosts, r)
	}
	for _, v := range cleartext {
		name, r, err := parseSecretFlag("--secret-cleartext", v)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(out, func(s gateway.SecretHosts) bool { return s.Name == name })
		if i < 0 || !slices.ContainsFunc(out[i].Hosts, func(h egress.Rule) bool { return h.Text == r.Text }) {
			return nil, fmt.Errorf("--secret-cleartext %s=%s: not a --secret rule of %s", name, r.Text, name)
		}
		out[i].Cleartext = append(out[i].Cleartext, r)
	}
	return out, nil
}

// parseSecretFlag reads one NAME=RULE flag.
func parseSecretFlag(flag, v string) (string, egress.Rule, error) {
	name, text, ok := strings.Cut(v, "=")
	if !ok || name == "" {
		return "", egress.Rule{}, fmt.Errorf("%s %q: want NAME=RULE", flag, v)
	}
	r, err := egress.ParseRule(text)
	if err != nil {
		return "", egress.Rule{}, fmt.Errorf("%s %s: %w", flag, name, err)
	}
	return name, r, nil
}
