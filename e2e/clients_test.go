package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// resolveC is a tiny client of the C library's resolver: getaddrinfo for
// its argument (A and AAAA, as every program asks), one address a line.
// Built with musl-gcc -static, it is a musl client, as the native binaries
// of many agent CLIs are (a static Go binary is not: Go has its own
// resolver).
const resolveC = `#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

int main(int argc, char **argv) {
	struct addrinfo hints, *res, *p;
	char buf[64];
	int rc;
	if (argc != 2) return 64;
	memset(&hints, 0, sizeof hints);
	hints.ai_socktype = SOCK_STREAM;
	rc = getaddrinfo(argv[1], "80", &hints, &res);
	if (rc != 0) {
		fprintf(stderr, "%s: %s\n", argv[1], gai_strerror(rc));
		return 2;
	}
	for (p = res; p; p = p->ai_next) {
		void *a = p->ai_family == AF_INET ? (void *)&((struct sockaddr_in *)p->ai_addr)->sin_addr
		                                  : (void *)&((struct sockaddr_in6 *)p->ai_addr)->sin6_addr;
		printf("%s\n", inet_ntop(p->ai_family, a, buf, sizeof buf));
	}
	return 0;
}
`

// buildMuslResolve compiles resolveC with musl-gcc (Debian's musl-tools)
// into a new directory and returns it; it skips (fails under
// PROPIO_E2E=require) when musl-gcc is missing.
func buildMuslResolve(t *testing.T) string {
	t.Helper()
	gcc, err := exec.LookPath("musl-gcc")
	if err != nil {
		dockerfileSkipOrFail(t, "no musl-gcc to build a musl client (apt-get install musl-tools): %v", err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "resolve.c")
	if err := os.WriteFile(src, []byte(resolveC), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gcc, "-static", "-O2", "-o", filepath.Join(dir, "resolve-musl"), src).CombinedOutput(); err != nil {
		t.Fatalf("musl-gcc: %v\n%s", err, out)
	}
	os.Remove(src)
	return dir
}

// clientsScript runs, in the default image, a glibc client (getent) and a
// musl client resolving a denied and an allowed name, each timed, then
// Node's fetch to an allowed name and to a port the rules do not allow on
// an allowed name (8080: fetch itself refuses "bad ports" such as 7 and 22). One line per step: "NAME rc=RC ms=MS".
const clientsScript = `ms() { echo $(( $(date +%s%N) / 1000000 )); }
timed() {
	local label=$1; shift
	local s=$(ms); "$@" >/dev/null 2>&1; local rc=$?
	echo "$label rc=$rc ms=$(( $(ms) - s ))"
}
timed glibc-denied getent ahosts denied.test
timed musl-denied /opt/musl/resolve-musl denied.test
timed glibc-allowed getent ahosts allowed.test
timed musl-allowed /opt/musl/resolve-musl allowed.test
node -e '
const fetchOne = (label, url) => new Promise((done) => {
	const t0 = Date.now();
	let settled = false;
	const end = (what) => { settled = true; console.log(label + " " + what + " ms=" + (Date.now() - t0)); done(); };
	process.on("exit", () => { if (!settled) console.log(label + " never-settled"); });
	fetch(url).then((r) => end("resolved status=" + r.status), (e) => end("rejected code=" + ((e.cause && (e.cause.code || e.cause.message)) || e.message)));
});
(async () => {
	await fetchOne("node-allowed", "http://allowed.test/node");
	await fetchOne("node-denied-port", "http://tcp.test:8080/");
})();
'
`

// TestAllowlistClients: real clients through the transparent path, timed.
// A denied name fails at once for a glibc client (getent) and a musl client
// alike: the gateway answers NXDOMAIN, which musl does not retry as it
// retried REFUSED (about 5 s per name). A port the rules do not allow on an
// allowed name is refused as a closed port is, so Node's fetch rejects
// (ECONNREFUSED) instead of never settling. Both ways the gateway can carry
// connections: kernel forwarding and user space.
func TestAllowlistClients(t *testing.T) {
	requireAgentImage(t)
	musl := buildMuslResolve(t)
	for _, kernel := range []bool{true, false} {
		name := map[bool]string{true: "kernel", false: "user-space"}[kernel]
		t.Run(name, func(t *testing.T) {
			if kernel {
				requireKernelForwarding(t)
			}
			s := newSandbox(t)
			in := newInternet(t)
			s.Env = append(s.Env, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
			prof := fmt.Sprintf("image: propio-sandbox/agent:latest\nnetwork:\n  mode: allowlist\n  allow: [allowed.test, \"tcp.test:22\"]\n%smounts:\n  - {source: %s, target: /opt/musl}\n",
				map[bool]string{true: "", false: "  bandwidth: 10gbit\n"}[kernel], musl)
			res := s.Run("", "run", "-p", s.Profile(prof), "--", "bash", "-c", clientsScript)
			if res.Code != 0 {
				t.Fatalf("run:\n%s", res)
			}
			steps := clientSteps(res.Stdout)
			t.Logf("%s: %v", name, steps)
			for _, c := range []struct{ step, want string }{
				{"glibc-denied", "rc=2"}, // getent: key not found
				{"musl-denied", "rc=2"},
				{"glibc-allowed", "rc=0"},
				{"musl-allowed", "rc=0"},
				{"node-allowed", "resolved status=200"},
				{"node-denied-port", "rejected code=ECONNREFUSED"},
			} {
				if !strings.Contains(steps[c.step], c.want) {
					t.Errorf("%s: got %q, want %q; output:\n%s", c.step, steps[c.step], c.want, res)
				}
			}
			// A fast failure, generously bounded: the stall this replaces
			// was 5 s per name (musl's retry of REFUSED).
			for _, step := range []string{"glibc-denied", "musl-denied", "node-denied-port"} {
				if d := stepTime(steps[step]); d < 0 || d > 2500*time.Millisecond {
					t.Errorf("%s took %v (%q), want a failure within 2.5 s", step, d, steps[step])
				}
			}

			// The log: the denied name once, though two clients asked for
			// its A and AAAA: once within the gateway's 5 s, which a loaded
			// machine's clients may take longer than; the refused port as a
			// denial.
			var dnsDenied []time.Time
			var entries []map[string]any
			for _, e := range decisions(t, s, true) {
				if e["via"] == "dns" && e["host"] == "denied.test" {
					at, err := time.Parse(time.RFC3339Nano, fmt.Sprint(e["time"]))
					if err != nil {
						t.Fatalf("a decision's time: %v", err)
					}
					dnsDenied = append(dnsDenied, at)
					entries = append(entries, e)
				}
			}
			if len(dnsDenied) == 0 {
				t.Error("logs --denied has no dns entry for denied.test")
			}
			for i := 1; i < len(dnsDenied); i++ {
				if dnsDenied[i].Sub(dnsDenied[i-1]) < 5*time.Second {
					t.Errorf("logs --denied has dns entries for denied.test within 5 s of each other, want one: %v", entries)
					break
				}
			}
			if kernel && !logged(decisions(t, s, true), "nat", "tcp.test", false) {
				t.Errorf("logs --denied has no nat entry for tcp.test:8080")
			}
		})
	}
}

var stepLine = regexp.MustCompile(`^([a-z-]+) (.*)$`)

// clientSteps maps each step of clientsScript's output to the rest of its line.
func clientSteps(out string) map[string]string {
	steps := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if m := stepLine.FindStringSubmatch(strings.TrimSpace(line)); m != nil {
			steps[m[1]] = m[2]
		}
	}
	return steps
}

// stepTime is the ms=N of a step, or -1.
func stepTime(step string) time.Duration {
	_, after, ok := strings.Cut(step, "ms=")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(strings.Fields(after)[0])
	if err != nil {
		return -1
	}
	return time.Duration(n) * time.Millisecond
}
