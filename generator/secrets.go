package generator

import (
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/broker"
	"github.com/propio/propio-sandbox/internal/profile"
)

// Where the brokering's files are: the run's broker directory in the
// gateway (it takes the run's file there), the profile's upstream_ca in
// the gateway, the host's trust store in the gateway, and the run's trust
// files in the agent.
const (
	GatewayBrokerDir      = "/broker"
	GatewayUpstreamCA     = "/upstream-ca.pem"
	SystemTrustStore      = "/etc/ssl/certs/ca-certificates.crt"
	AgentCADir            = "/run/propio-sandbox-ca"
	javaTrustStoreOptions = "-Djavax.net.ssl.trustStore=" + AgentCADir + "/" + broker.TrustStoreFile +
		" -Djavax.net.ssl.trustStoreType=JKS -Djavax.net.ssl.trustStorePassword=" + broker.TrustStorePassword
)

// ExtensionBroker is what the launcher does for brokering, as the
// extension says it: the secrets whose values it reads (by name, each with
// where its value comes from, never the value), and whether the gateway
// opens connections, so that the run needs a CA.
type ExtensionBroker struct {
	// Secrets maps each secret given to the sandbox to where its value is
	// read (env NAME, file PATH, command ARGS).
	Secrets map[string]string
	// Opens: the gateway terminates TLS for some hosts (a secret's, or a
	// rule's with methods or paths): the run has a CA.
	Opens bool
}

// ActiveSecrets are the secrets of p given to a sandbox on h, sorted: those
// read from a file or a command, and those read from an environment
// variable that is set (one that is not gives the sandbox no variable, as
// env.pass does).
func ActiveSecrets(p *profile.Profile, h Host) []string {
	var names []string
	for _, name := range p.SecretNames() {
		s := p.Secrets[name]
		if s.From.Env == "" || slices.Contains(h.EnvNames, s.From.Env) {
			names = append(names, name)
		}
	}
	return names
}

// Opens reports whether the gateway of p on h terminates TLS for some
// hosts: a secret is given, or an allow rule limits requests.
func Opens(p *profile.Profile, h Host) bool {
	if len(ActiveSecrets(p, h)) > 0 || len(p.Network.Methods) > 0 {
		return true
	}
	return slices.ContainsFunc(p.Network.Allow, func(r profile.Rule) bool { return r.Limited() })
}

// SecretSource is where a secret's value is read, as the launcher reads
// it: a relative file is the profile's, and ~ and the variables are
// expanded.
func SecretSource(s *profile.Secret, h Host) profile.SecretSource {
	from := s.From
	if from.File != "" {
		from.File = profile.Expand(from.File, h.Vars())
		if !filepath.IsAbs(from.File) {
			from.File = filepath.Join(s.Dir, from.File)
		}
	}
	if len(from.Command) > 0 {
		from.Command = slices.Clone(from.Command)
		for i, a := range from.Command {
			from.Command[i] = profile.Expand(a, h.Vars())
		}
	}
	return from
}

// UpstreamCA is the host path of network.upstream_ca: expanded, relative to
// the profile file that set it; "" when it is not set.
func UpstreamCA(p *profile.Profile, h Host) string {
	f := p.Network.UpstreamCA
	if f == "" {
		return ""
	}
	f = profile.Expand(f, h.Vars())
	if !filepath.IsAbs(f) {
		f = filepath.Join(p.Network.UpstreamCADir, f)
	}
	return filepath.Clean(f)
}

// brokering adds to the gateway g, and the agent, what credential brokering
// and request limits need, and returns the extension's part: nil when the
// gateway opens nothing.
//
// The gateway gets each secret's name and hosts (--secret), those it may go
// to over plain HTTP (--secret-cleartext), the profile's
// methods, its upstream_ca and the host's trust store, and the run's broker
// directory, where it writes the certificate of the CA it makes and the
// launcher leaves the values (never in its command, environment or
// labels). The agent gets each secret's
// variable by name (the launcher fills in the sentinel, never the value),
// and the run's trust files: the image's store with the CA, mounted over
// the system store and named by the variables clients read.
func brokering(p *profile.Profile, h Host, o Options, g, agent *types.ServiceConfig) *ExtensionBroker {
	// No secret's variable ever comes from the host, whatever env.pass
	// says: a secret's sandbox side is its sentinel or nothing.
	for _, name := range p.SecretNames() {
		delete(agent.Environment, name)
	}
	if !Opens(p, h) {
		return nil
	}
	ext := &ExtensionBroker{Secrets: map[string]string{}, Opens: true}
	for _, name := range ActiveSecrets(p, h) {
		s := p.Secrets[name]
		ext.Secrets[name] = SecretSource(s, h).String()
		for _, r := range s.Hosts {
			g.Command = append(g.Command, "--secret", name+"="+r.Text)
		}
		for _, r := range s.Cleartext {
			g.Command = append(g.Command, "--secret-cleartext", name+"="+r.Text)
		}
		agent.Environment[name] = nil // filled in with the run's sentinel
	}
	if len(p.Network.Methods) > 0 {
		g.Command = append(g.Command, "--methods", strings.Join(p.Network.Methods, ","))
	}
	g.Command = append(g.Command, "--broker", GatewayBrokerDir)
	g.Volumes = append(g.Volumes, bind(filepath.Join(h.BrokerDir, o.Project), GatewayBrokerDir, false))
	if ca := UpstreamCA(p, h); ca != "" {
		g.Command = append(g.Command, "--upstream-ca", GatewayUpstreamCA)
		g.Volumes = append(g.Volumes, bind(ca, GatewayUpstreamCA, true))
	}
	if h.SystemRoots != "" {
		g.Volumes = append(g.Volumes, bind(h.SystemRoots, SystemTrustStore, true))
	}

	caDir := filepath.Join(h.CADir, o.Project)
	agent.Volumes = append(agent.Volumes, bind(caDir, AgentCADir, true))
	store := h.TrustStore
	if store == "" {
		store = SystemTrustStore
	}
	agent.Volumes = append(agent.Volumes, bind(filepath.Join(caDir, broker.BundleFile), store, true))
	bundle := path.Join(AgentCADir, broker.BundleFile)
	for _, v := range []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO"} {
		agent.Environment[v] = ptr(bundle)
	}
	agent.Environment["NODE_EXTRA_CA_CERTS"] = ptr(path.Join(AgentCADir, broker.CAFile))
	java := javaTrustStoreOptions
	if v, ok := p.Env.Set["JAVA_TOOL_OPTIONS"]; ok && v != "" {
		java += " " + profile.Expand(v, h.Vars())
	}
	agent.Environment["JAVA_TOOL_OPTIONS"] = ptr(java)
	return ext
}
