package e2e

// Secrets brokered by the gateway, end to end: a profile names a secret,
// the sandbox holds a sentinel, and the gateway puts the real value in its
// place only in requests to the hosts the secret names, over TLS it
// terminates with the run's CA (the upstream's certificate verified against
// the test CA, given as network.upstream_ca). The test's own TLS server
// (probe serve, its certificate from makeTestCA) prints the credentials it
// gets. Real clients run inside the agent image: curl (HTTP/1.1 and
// HTTP/2, through the proxy and the transparent path), Node's fetch,
// Python's urllib, git; and the value is looked for everywhere it must not
// be: the sandbox's files and environment, both containers' configuration,
// render, the decision log, the gateway's output, the launcher's.

import (
	"compress/gzip"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// brokerNames are the names of the test's TLS server, each with what the
// profile does with it; bad.test is not in its certificate.
var brokerNames = []string{"llm.test", "api.test", "other.test", "plain.test", "bad.test"}

// startBrokerInternet is a network with one probe server under every name
// of brokerNames, its certificate (for all but bad.test) from a test CA.
func startBrokerInternet(t *testing.T) *internet {
	t.Helper()
	requireEngine(t)
	in := &internet{t: t, Network: "propio-e2e-broker-" + randomID(), IP: map[string]string{}, ids: map[string]string{}}
	if _, err := docker("network", "create", "--label", "dev.propio-sandbox.e2e=1", in.Network); err != nil {
		t.Fatalf("creating the test internet: %v", err)
	}
	t.Cleanup(func() {
		for _, id := range in.ids {
			docker("rm", "-f", id)
		}
		testenv.RemoveNetwork(t, in.Network)
	})
	in.CADir = filepath.Join(t.TempDir(), "certs")
	makeTestCA(t, in.CADir, brokerNames[:len(brokerNames)-1]...)
	args := []string{"run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", in.Network, "-v", in.CADir + ":/certs:ro"}
	for _, n := range brokerNames {
		args = append(args, "--network-alias", n)
	}
	id, err := docker(append(args, ProbeImage, "serve", "upstream")...)
	if err != nil {
		t.Fatalf("starting the server: %v", err)
	}
	in.ids["upstream"] = strings.TrimSpace(id)
	in.waitLog("upstream", "serving upstream")
	return in
}

const brokerProfile = `image: propio-sandbox/agent:latest
network:
  mode: allowlist
  allow:
    - llm.test
    - other.test
    - plain.test
    - bad.test
    - {host: api.test, methods: [GET, HEAD]}
  upstream_ca: %[1]s/ca.pem
secrets:
  LLM_TOKEN:
    from: {env: HOST_LLM_TOKEN}
    hosts: [llm.test, bad.test]
  CLEAR_TOKEN:
    from: {env: HOST_CLEAR_TOKEN}
    hosts: [plain.test]
    cleartext_hosts: [plain.test]
mounts:
  - {source: %[1]s, target: /certs}
`

// TestSecretsBrokered runs a sandbox with a brokered secret and attacks and
// uses it from inside.
func TestSecretsBrokered(t *testing.T) {
	t.Parallel()
	requireAgentImage(t)
	s := newSandbox(t)
	in := startBrokerInternet(t)
	value := "sk-e2e-" + randomID() + randomID() + randomID()
	clearValue := "sk-e2e-clear-" + randomID()
	s.Env = append(s.Env, "HOST_LLM_TOKEN="+value, "HOST_CLEAR_TOKEN="+clearValue)
	profileYAML := fmt.Sprintf(brokerProfile, in.CADir)
	r := startAllowlist(t, s, in, profileYAML)
	// sh runs a bash script in the sandbox, args as $0, $1...
	sh := func(t *testing.T, script string, args ...string) (string, bool) {
		t.Helper()
		out, err := docker(append([]string{"exec", r.Agent, "bash", "-c", script}, args...)...)
		return out, err == nil
	}
	// got waits for the server to print a line holding line (the
	// credentials it got).
	got := func(t *testing.T, line string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(in.Logs("upstream"), line) {
			if time.Now().After(deadline) {
				t.Errorf("the server never printed %q:\n%s", line, in.Logs("upstream"))
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	const mask = "[masked:LLM_TOKEN]"
	basic := base64.StdEncoding.EncodeToString([]byte("x-access-token:" + value))

	var sentinel string
	t.Run("the sandbox holds a sentinel", func(t *testing.T) {
		out, _ := sh(t, "printenv LLM_TOKEN")
		sentinel = strings.TrimSpace(out)
		if !regexp.MustCompile(`^propio-sentinel-LLM_TOKEN-[0-9a-f]{32}$`).MatchString(sentinel) {
			t.Fatalf("LLM_TOKEN inside is %q, want a sentinel", sentinel)
		}
	})
	t.Run("the value is nowhere inside", func(t *testing.T) {
		// Every file the sandbox can read (but the kernel's), and the
		// environment of its first process.
		out, _ := sh(t, "grep -rIlsF --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev -e \"$0\" / ; grep -cF \"$0\" /proc/1/environ; echo searched", value)
		if strings.TrimSpace(out) != "0\nsearched" {
			t.Errorf("the value is found inside:\n%s", out)
		}
		// No private key: the run's CA's stays with the gateway.
		out, _ = sh(t, "grep -rlsF 'PRIVATE KEY' /run/propio-sandbox-ca /etc/ssl/certs /tmp /home/sandbox /workspace; echo searched")
		if strings.TrimSpace(out) != "searched" {
			t.Errorf("a private key inside:\n%s", out)
		}
	})

	clients := []struct{ name, script, want string }{
		{"curl through the proxy", `curl -sS --fail --http1.1 https://llm.test/h/curl-proxy -H "Authorization: Bearer $LLM_TOKEN"`,
			fmt.Sprintf(`headers HTTP/1.1 GET /h/curl-proxy authorization="Bearer %s"`, value)},
		{"curl over HTTP/2, transparent", `curl -sS --fail --noproxy '*' --http2 -o /dev/null -w '%{http_version}' https://llm.test/h/curl-h2 -H "x-api-key: $LLM_TOKEN"`,
			fmt.Sprintf(`headers HTTP/2.0 GET /h/curl-h2 authorization="" x-api-key=%q`, value)},
		{"node fetch, transparent", `node -e 'fetch("https://llm.test/h/node", {headers: {authorization: "Bearer " + process.env.LLM_TOKEN}}).then(r => { if (!r.ok) process.exit(1); return r.text() }).then(console.log)'`,
			fmt.Sprintf(`headers HTTP/1.1 GET /h/node authorization="Bearer %s"`, value)},
		{"python urllib through the proxy", `python3 -c 'import os, urllib.request as u; print(u.urlopen(u.Request("https://llm.test/h/python", headers={"Authorization": "Bearer " + os.environ["LLM_TOKEN"]})).read().decode())'`,
			fmt.Sprintf(`headers HTTP/1.1 GET /h/python authorization="Bearer %s"`, value)},
		{"git, Basic", `git ls-remote "https://x-access-token:$LLM_TOKEN@llm.test/git/repo.git" 2>&1; true`,
			fmt.Sprintf(` GET /git/repo.git/info/refs authorization="Basic %s"`, basic)},
	}
	for _, c := range clients {
		t.Run(c.name, func(t *testing.T) {
			out, ok := sh(t, c.script)
			if !ok {
				t.Fatalf("failed:\n%s", out)
			}
			if c.name == "curl over HTTP/2, transparent" && strings.TrimSpace(out) != "2" {
				t.Errorf("curl spoke HTTP %q to the gateway, want 2", out)
			}
			got(t, c.want)
			if strings.Contains(out, value) {
				t.Errorf("the client saw the value:\n%s", out)
			}
		})
	}

	t.Run("an echo comes back masked", func(t *testing.T) {
		out, _ := sh(t, `curl -sS https://llm.test/echo -H "Authorization: Bearer $LLM_TOKEN"`)
		if strings.TrimSpace(out) != "you sent Bearer "+mask {
			t.Errorf("the echo reached the sandbox as %q, want the value masked", out)
		}
	})
	// The attacks of issue 28: the secret's host is made to send the value
	// back in a form the gateway did not mask, and the agent reads it.
	readBack := func(t *testing.T, script string) string {
		t.Helper()
		out, _ := sh(t, script)
		if l := leak(out, value); l != "" {
			t.Errorf("the value came back, %s:\n%q", l, out)
		}
		return out
	}
	t.Run("read back: a gzip-compressed echo", func(t *testing.T) {
		// The client asks for gzip and unpacks what comes, as the agent
		// would; the server compresses when asked, and one (/echo/gzip)
		// whatever it is asked.
		for _, path := range []string{"/echo", "/echo/gzip"} {
			out := readBack(t, `curl -sS -D /tmp/head -o /tmp/body -H 'Accept-Encoding: gzip, deflate, br' https://llm.test`+path+` -H "Authorization: Bearer $LLM_TOKEN"
tr A-Z a-z </tmp/head; gunzip -c /tmp/body 2>/dev/null || cat /tmp/body`)
			if !strings.HasSuffix(out, "\r\n\r\nyou sent Bearer "+mask+"\n") || strings.Contains(out, "content-encoding") || strings.Contains(out, "content-length") {
				t.Errorf("%s: %q, want the echo masked, with no encoding and no length", path, out)
			}
		}
		got(t, `echo accept-encoding="identity"`)
		if strings.Contains(in.Logs("upstream"), `echo accept-encoding="gzip`) {
			t.Error("the server was asked for gzip")
		}
	})
	t.Run("read back: an encoding the gateway cannot decode", func(t *testing.T) {
		out := readBack(t, `curl -sS -w '\n%{http_code}' https://llm.test/echo/br -H "Authorization: Bearer $LLM_TOKEN"`)
		if !strings.Contains(out, `Content-Encoding "br", which the gateway cannot decode`) || !strings.HasSuffix(out, "\n502") {
			t.Errorf("%q, want a 502 saying why", out)
		}
	})
	t.Run("read back: the gateway's own Basic credential", func(t *testing.T) {
		// curl sends https://x:SENTINEL@host/ as Basic base64(x:SENTINEL);
		// the gateway puts the value in, the server echoes the credential.
		out := readBack(t, `curl -sS "https://x:$LLM_TOKEN@llm.test/echo"`)
		if !strings.HasPrefix(out, "you sent Basic ") || !strings.Contains(out, mask) {
			t.Errorf("%q, want the credential masked", out)
		}
	})
	t.Run("read back: part of the value", func(t *testing.T) {
		// "Bearer " is 7 characters: the value starts at 7.
		for _, w := range [][2]int{{7, 8}, {12, 9}, {20, 30}, {3, 12}, {len("Bearer ") + len(value) - 8, 8}} {
			out := readBack(t, fmt.Sprintf(`curl -sS "https://llm.test/echo/part?from=%d&len=%d" -H "Authorization: Bearer $LLM_TOKEN"`, w[0], w[1]))
			if !strings.Contains(out, mask+"...\n") {
				t.Errorf("characters %d to %d: %q, want them masked", w[0], w[0]+w[1], out)
			}
		}
	})
	t.Run("read back: a range at a time", func(t *testing.T) {
		out := readBack(t, `curl -sS -w '\n%{http_code}' -r 16-22 https://llm.test/echo/range -H "Authorization: Bearer $LLM_TOKEN"`)
		if out != "you sent Bearer "+mask+"\n\n200" {
			t.Errorf("%q, want the whole echo masked", out)
		}
		if strings.Contains(in.Logs("upstream"), `range="bytes`) {
			t.Error("the server was asked for a range")
		}
	})
	t.Run("plain HTTP to the secret's host", func(t *testing.T) {
		// A secret's host without a port takes port 80: the value goes in
		// no plain HTTP request, through the proxy or the transparent path.
		for _, via := range []string{"proxy", "transparent"} {
			flag := ""
			if via == "transparent" {
				flag = "--noproxy '*'"
			}
			out := readBack(t, `curl -sS `+flag+` -w '\n%{http_code}' http://llm.test/h/clear-`+via+` -H "Authorization: Bearer $LLM_TOKEN"`)
			if !strings.Contains(out, "over TLS only: nothing was sent") || !strings.Contains(out, "Use https://llm.test/h/clear-"+via) || !strings.HasSuffix(out, "\n403") {
				t.Errorf("%s: %q, want a 403 saying to use https", via, out)
			}
			if e := requestEntry(t, s, "llm.test"); e == nil || e["path"] != "/h/clear-"+via || e["status"] != float64(403) || fmt.Sprint(e["sentinels"]) != "[LLM_TOKEN]" {
				t.Errorf("%s: the log says %v, want the request refused with its sentinel", via, e)
			}
		}
		if logs := in.Logs("upstream"); strings.Contains(logs, "/h/clear-") {
			t.Errorf("a plain HTTP request with the sentinel reached the server:\n%s", logs)
		}
	})
	t.Run("elsewhere the sentinel stays", func(t *testing.T) {
		// other.test is passed through: curl trusts the test CA alone and
		// sees the server's own certificate.
		if out, ok := sh(t, `curl -sS --fail --cacert /certs/ca.pem https://other.test/h/other -H "Authorization: Bearer $LLM_TOKEN"`); !ok {
			t.Fatalf("other.test, with its own certificate: %s", out)
		}
		got(t, fmt.Sprintf(` GET /h/other authorization="Bearer %s"`, sentinel))
		// llm.test's TLS is the gateway's: the test CA alone does not
		// vouch for it.
		if out, ok := sh(t, `curl -sS --cacert /certs/ca.pem https://llm.test/h/x`); ok {
			t.Errorf("llm.test verified against the server's own CA: its TLS was not terminated:\n%s", out)
		}
		// Opened (its methods are limited) but not the secret's host, and
		// plain HTTP: the sentinel goes as it is, and is logged.
		sh(t, `curl -sS --fail https://api.test/h/api -H "Authorization: Bearer $LLM_TOKEN"`)
		got(t, fmt.Sprintf(` GET /h/api authorization="Bearer %s"`, sentinel))
		sh(t, `curl -sS --fail http://plain.test/h/plain -H "Authorization: Bearer $LLM_TOKEN"`)
		got(t, fmt.Sprintf(`headers HTTP/1.1 GET /h/plain authorization="Bearer %s"`, sentinel))
		for _, host := range []string{"api.test", "plain.test"} {
			if e := requestEntry(t, s, host); e == nil || fmt.Sprint(e["sentinels"]) != "[LLM_TOKEN]" {
				t.Errorf("%s: the log does not say LLM_TOKEN's sentinel left as it was: %v", host, e)
			}
		}
	})
	t.Run("in clear where the profile says so", func(t *testing.T) {
		// CLEAR_TOKEN's cleartext_hosts name plain.test.
		if out, ok := sh(t, `curl -sS --fail http://plain.test/h/clear -H "Authorization: Bearer $CLEAR_TOKEN"`); !ok {
			t.Fatalf("plain.test in clear: %s", out)
		}
		got(t, fmt.Sprintf(`headers HTTP/1.1 GET /h/clear authorization="Bearer %s"`, clearValue))
	})
	t.Run("methods limit a host", func(t *testing.T) {
		out, _ := sh(t, `curl -sS -X POST -w '\n%{http_code}' https://api.test/h/post`)
		if !strings.Contains(out, "POST api.test/h/post is not allowed") || !strings.Contains(out, "allows GET, HEAD only") ||
			!strings.Contains(out, "profile.yaml:5 ") || !strings.HasSuffix(strings.TrimSpace(out), "403") {
			t.Errorf("a POST to api.test: %s", out)
		}
		if strings.Contains(in.Logs("upstream"), "/h/post") {
			t.Error("the denied POST reached the server")
		}
	})
	t.Run("the upstream's certificate is verified", func(t *testing.T) {
		out, _ := sh(t, `curl -sS -w '\n%{http_code}' https://bad.test/h/bad -H "Authorization: Bearer $LLM_TOKEN"`)
		if !strings.Contains(out, "the upstream's certificate is not trusted") || !strings.HasSuffix(strings.TrimSpace(out), "502") {
			t.Errorf("bad.test, whose certificate names it not: %s", out)
		}
		if strings.Contains(in.Logs("upstream"), "/h/bad") {
			t.Error("the request went to a server whose certificate failed")
		}
	})
	t.Run("streams", func(t *testing.T) {
		for _, flag := range []string{"--http1.1", "--http2"} {
			// The first event arrives before the server sends the second:
			// it waits for /release, which the client asks once it has it.
			out, ok := sh(t, `curl -sSN `+flag+` https://llm.test/sse > /tmp/sse & pid=$!
for i in $(seq 400); do grep -q first /tmp/sse && break; sleep 0.05; done
grep -q first /tmp/sse || { echo "no first event"; kill $pid; exit 3; }
curl -sS https://llm.test/release >/dev/null; wait $pid; cat /tmp/sse`)
			if !ok || out != "data: first\n\ndata: second\n\n" {
				t.Errorf("%s: %q", flag, out)
			}
		}
	})
	t.Run("Java's trust store", func(t *testing.T) {
		out, _ := sh(t, `printf '%s\n' "$JAVA_TOOL_OPTIONS"; od -An -tx1 -N4 /run/propio-sandbox-ca/truststore.jks`)
		if !strings.Contains(out, "-Djavax.net.ssl.trustStore=/run/propio-sandbox-ca/truststore.jks") || !strings.Contains(out, "fe ed fe ed") {
			t.Errorf("JAVA_TOOL_OPTIONS and the trust store: %s", out)
		}
	})

	project := composeProject(t, r.Agent)
	brokerDir := filepath.Join(s.Home, ".local", "state", "propio-sandbox", "broker", project)
	caDir := filepath.Join(s.Home, ".local", "state", "propio-sandbox", "ca", project)
	t.Run("nowhere outside", func(t *testing.T) {
		for _, c := range []string{r.Agent, gatewayContainer(t, s)} {
			out, err := docker("inspect", c)
			if err != nil || strings.Contains(out, value) {
				t.Errorf("docker inspect %s holds the value (%v)", c, err)
			}
		}
		if env, _ := docker("inspect", "-f", "{{range .Config.Env}}{{println .}}{{end}}", r.Agent); !strings.Contains(env, "LLM_TOKEN="+sentinel) {
			t.Errorf("the agent's configuration lacks its sentinel:\n%s", env)
		}
		if out, _ := docker("logs", gatewayContainer(t, s)); strings.Contains(out, value) {
			t.Error("the gateway's output holds the value")
		}
		if _, err := os.Stat(filepath.Join(brokerDir, "run.json")); !os.IsNotExist(err) {
			t.Errorf("the run's file is still in %s once the gateway runs: %v", brokerDir, err)
		}
		if res := s.Run("", "logs", "--json"); strings.Contains(res.Stdout+res.Stderr, value) || !strings.Contains(res.Stdout, `"secrets":["LLM_TOKEN"]`) {
			t.Errorf("logs --json: the value shows, or no request names the secret put in:\n%s", res)
		}
		res := s.Run("", "render", "-p", s.Profile(profileYAML))
		if res.Code != 0 || strings.Contains(res.Stdout+res.Stderr, value) || !strings.Contains(res.Stdout, "      - LLM_TOKEN\n") ||
			!strings.Contains(res.Stdout, "LLM_TOKEN=llm.test") || !strings.Contains(res.Stdout, "LLM_TOKEN: env HOST_LLM_TOKEN") {
			t.Errorf("render:\n%s", res)
		}
	})
	t.Run("Java reads the trust store", func(t *testing.T) {
		keytool, err := exec.LookPath("keytool")
		if err != nil {
			t.Skip("no keytool on this host")
		}
		out, err := exec.Command(keytool, "-list", "-keystore", filepath.Join(caDir, "truststore.jks"), "-storepass", "changeit").CombinedOutput()
		bundle, _ := os.ReadFile(filepath.Join(caDir, "bundle.pem"))
		want := fmt.Sprintf("Your keystore contains %d entries", strings.Count(string(bundle), "BEGIN CERTIFICATE"))
		if err != nil || !strings.Contains(string(out), want) {
			t.Errorf("keytool -list: %v, want %q:\n%.400s", err, want, out)
		}
	})

	res := r.Stop()
	if strings.Contains(res.Stdout+res.Stderr, value) {
		t.Errorf("the launcher printed the value:\n%s", res)
	}
	for _, d := range []string{brokerDir, caDir} {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s is left once the sandbox ended: %v", d, err)
		}
	}
}

// leak says how out holds a piece of value (8 characters or more in a row)
// that an agent could read: as it is, gzip-compressed, in base64 (at any
// offset), percent-encoded or in hex; "" when it holds none.
func leak(out, value string) string {
	piece := func(s string) bool {
		for i := 0; i+8 <= len(value); i++ {
			if strings.Contains(s, value[i:i+8]) {
				return true
			}
		}
		return false
	}
	if piece(out) {
		return "as it is"
	}
	if zr, err := gzip.NewReader(strings.NewReader(out)); err == nil {
		if b, _ := io.ReadAll(zr); piece(string(b)) {
			return "gzip-compressed"
		}
	}
	if u, err := url.QueryUnescape(out); err == nil && piece(u) {
		return "percent-encoded"
	}
	for _, tok := range regexp.MustCompile(`[A-Za-z0-9+/_=-]{8,}`).FindAllString(out, -1) {
		for from := range 2 {
			if b, err := hex.DecodeString(tok[from : from+(len(tok)-from)/2*2]); err == nil && piece(string(b)) {
				return "in hex"
			}
		}
		tok = strings.TrimRight(tok, "=")
		for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
			for from := range 4 {
				t := tok[min(from, len(tok)):]
				t = t[:len(t)/4*4]
				if b, err := enc.DecodeString(t); err == nil && piece(string(b)) {
					return "in base64"
				}
			}
		}
	}
	return ""
}

// requestEntry is the last decision logged for a request to host.
func requestEntry(t *testing.T, s *sandbox, host string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var last map[string]any
		for _, e := range decisions(t, s, false) {
			if e["host"] == host && e["method"] != nil {
				last = e
			}
		}
		if last != nil || time.Now().After(deadline) {
			return last
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// composeProject is the Compose project of a container.
func composeProject(t *testing.T, container string) string {
	t.Helper()
	out, err := docker("inspect", "-f", `{{index .Config.Labels "com.docker.compose.project"}}`, container)
	if err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("the project of %s: %v %q", container, err, out)
	}
	return strings.TrimSpace(out)
}

// TestSecretErrors: a secret whose value cannot be read stops the launch
// before anything is made, with an error that says which and where, and
// never the value; a command that fails has what it printed masked.
func TestSecretErrors(t *testing.T) {
	t.Parallel()
	s := newSandbox(t)
	in := startBrokerInternet(t)
	const printed = "sk-e2e-printed-by-the-command"
	s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network, "E2E_PRINTED="+printed)
	for name, tc := range map[string]struct {
		from string
		want []string
	}{
		"missing file": {"{file: ./no-such-token}", []string{"secrets.T: reading its value (file ", "no-such-token): ", "does not exist"}},
		"failing command": {`{command: [sh, -c, "echo $$E2E_PRINTED; echo bad token $$E2E_PRINTED >&2; exit 4"]}`,
			[]string{"secrets.T: reading its value (command sh -c ", "exit status 4: bad token ***", "hint: make its source give the value"}},
	} {
		t.Run(name, func(t *testing.T) {
			p := s.Profile(fmt.Sprintf("network:\n  mode: allowlist\n  allow: [llm.test]\nsecrets:\n  T: {from: %s, hosts: [llm.test]}\n", tc.from))
			res := s.Run("", "run", "-p", p, "--", "exit", "0")
			if res.Code != 1 || strings.Contains(res.Stdout+res.Stderr, printed) {
				t.Errorf("want exit 1 and no value:\n%s", res)
			}
			for _, w := range tc.want {
				if !strings.Contains(res.Stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, res.Stderr)
				}
			}
			var left []string
			for _, kind := range []string{"broker", "ca"} {
				entries, _ := os.ReadDir(filepath.Join(s.Home, ".local", "state", "propio-sandbox", kind))
				for _, e := range entries {
					left = append(left, kind+"/"+e.Name())
				}
			}
			if len(left) > 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

// TestReadOnlyWeb: network.methods [GET, HEAD, OPTIONS] makes every allowed
// host read-only, over HTTPS (the gateway terminates TLS to see the method;
// the sandbox trusts the run's CA) and plain HTTP, through the proxy and
// the transparent path; a rule's own methods win; a path limit holds.
func TestReadOnlyWeb(t *testing.T) {
	t.Parallel()
	requireAgentImage(t)
	s := newSandbox(t)
	in := startBrokerInternet(t)
	r := startAllowlist(t, s, in, fmt.Sprintf(`image: propio-sandbox/agent:latest
network:
  mode: allowlist
  methods: [GET, HEAD, OPTIONS]
  allow:
    - other.test
    - {host: plain.test, methods: ["*"], paths: ["/h/open/**"]}
  upstream_ca: %s/ca.pem
`, in.CADir))
	for _, c := range []struct {
		name, cmd string
		code      string
	}{
		{"GET over HTTPS", "curl -s -o /dev/null -w '%{http_code}' https://other.test/h/ro-get", "200"},
		{"HEAD, transparent", "curl -s -o /dev/null -w '%{http_code}' --noproxy '*' -I https://other.test/h/ro-head", "200"},
		{"POST over HTTPS", "curl -s -o /dev/null -w '%{http_code}' -X POST https://other.test/h/ro-post", "403"},
		{"DELETE, transparent", "curl -s -o /dev/null -w '%{http_code}' --noproxy '*' -X DELETE https://other.test/h/ro-delete", "403"},
		{"POST over plain HTTP", "curl -s -o /dev/null -w '%{http_code}' -X POST http://other.test/h/ro-plain", "403"},
		{"a rule's own methods", "curl -s -o /dev/null -w '%{http_code}' -X POST https://plain.test/h/open/x", "200"},
		{"and its paths", "curl -s -o /dev/null -w '%{http_code}' https://plain.test/h/closed", "403"},
	} {
		t.Run(c.name, func(t *testing.T) {
			out, _ := docker("exec", r.Agent, "bash", "-c", c.cmd)
			if strings.TrimSpace(out) != c.code {
				t.Errorf("%s: %q, want %s", c.cmd, out, c.code)
			}
		})
	}
	logs := in.Logs("upstream")
	for _, denied := range []string{"/h/ro-post", "/h/ro-delete", "/h/ro-plain", "/h/closed"} {
		if strings.Contains(logs, denied) {
			t.Errorf("%s reached the server", denied)
		}
	}
	var denials int
	for _, e := range decisions(t, s, true) {
		if e["method"] != nil && e["status"] == float64(403) {
			denials++
		}
	}
	if denials != 4 {
		t.Errorf("logs --denied lists %d refused requests, want 4", denials)
	}
}
