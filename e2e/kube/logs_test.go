package kube

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/decisionlog"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// forgedHost is the host of the entry the sandbox tries to forge (no dot:
// a DNS label with one inside is not a name the gateway reads).
const forgedHost = "forged-test"

// forgeScript has the sandbox try to write a decision of its own into the
// gateway's log: a DNS query to its resolver (the gateway) whose name's
// first label is a newline and a JSON line allowing forgedHost.
const forgeScript = `python3 - <<'PY'
import re, socket, struct
ns = re.search(r'nameserver\s+(\S+)', open('/etc/resolv.conf').read()).group(1)
label = b'\n{"host":"` + forgedHost + `","allowed":true,"via":"dns"}\n'
q = struct.pack('>HHHHHH', 0x1234, 0x0100, 1, 0, 0, 0) + bytes([len(label)]) + label + b'\x04test\x00' + struct.pack('>HH', 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
s.sendto(q, (ns, 53))
try:
    s.recv(512)
    print('forge-answered')
except Exception:
    print('forge-unanswered')
PY`

// logEntries are the decisions `logs --json` prints.
func logEntries(t *testing.T, out []byte) []decisionlog.Entry {
	t.Helper()
	var entries []decisionlog.Entry
	for _, line := range bytes.Split(bytes.TrimSpace(out), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var e decisionlog.Entry
		if err := json.Unmarshal(line, &e); err != nil {
			t.Fatalf("logs --json printed %q: %v", line, err)
		}
		entries = append(entries, e)
	}
	return entries
}

// decided reports whether entries hold a decision about host, allowed or
// not as allowed says.
func decided(entries []decisionlog.Entry, host string, allowed bool) bool {
	for _, e := range entries {
		if e.Host == host && e.Allowed == allowed {
			return true
		}
	}
	return false
}

// TestKubeLaunchAllowlistLogs: the decisions of a cluster sandbox's
// gateway (in its Pod) are read by `logs` on the launcher's host, during
// the run and after it, as on Docker. The sandbox (allowlistLaunch) makes
// an allowed request and a denied one, tries to forge a decision with a
// DNS name that holds a JSON line, then waits on its input: meanwhile
// `logs --json` shows the allowed and the denied decision, by name. Once
// the input ends and the run with it (exit 0, nothing left on the
// cluster), `logs` and `logs --json` show both, the log on the host holds
// nothing but its header and whole decisions, and none of them is the
// forged one (which is one denied DNS decision, on one row of logs). A
// second run, ended by SIGTERM while its command runs (exit 143, nothing
// left, no warning about the log), keeps the decision it made in its own
// log, which is the latest.
func TestKubeLaunchAllowlistLogs(t *testing.T) {
	a := newAllowlistLaunch(t)
	ws := kubeWorkspace(t, "kubelogs")
	home := t.TempDir()
	script := `curl -s -m 10 -o /dev/null -w 'allowed:%{http_code}\n' http://` + a.allowed + `:8080/
curl -s -m 10 -o /dev/null -w 'denied:%{http_code}\n' http://` + deniedName + `:443/
` + forgeScript + `
echo requests-made
cat >/dev/null
exit 0`
	cmd := a.run(t, ws, home, script)
	var stdout, stderr testenv.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var runErr error
	ended := make(chan struct{})
	go func() { runErr = cmd.Wait(); close(ended) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-ended
	})
	logs := func(args ...string) []byte {
		t.Helper()
		c := launcherIn(t, a.kubeconfig, ws, home, append([]string{"logs"}, args...)...)
		var out, errOut bytes.Buffer
		c.Stdout, c.Stderr = &out, &errOut
		if err := runBounded(t, c, 30*time.Second); err != nil {
			t.Fatalf("logs %s: %v\n%s", strings.Join(args, " "), err, errOut.String())
		}
		return out.Bytes()
	}

	// During the run: the sandbox waits on its input.
	for deadline := time.Now().Add(3 * time.Minute); !strings.Contains(stdout.String(), "requests-made\n"); {
		select {
		case <-ended:
			t.Fatalf("run ended before its requests were made: %v\nstdout:\n%s\nstderr:\n%s", runErr, stdout.String(), stderr.String())
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandbox did not make its requests within 3 minutes\nstdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
		}
	}
	t.Logf("the sandbox said:\n%s", stdout.String())
	for _, want := range []string{"allowed:200", "denied:403"} {
		if !strings.Contains(stdout.String(), want+"\n") {
			t.Errorf("the sandbox did not say %q", want)
		}
	}
	var during []decisionlog.Entry
	for deadline := time.Now().Add(20 * time.Second); ; {
		during = logEntries(t, logs("--json"))
		if decided(during, a.allowed, true) && decided(during, deniedName, false) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("during the run, logs --json did not show the allowed and the denied decisions within 20 s:\n%+v", during)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("during the run, logs --json showed %d decisions", len(during))

	// After the run.
	in.Close()
	select {
	case <-ended:
		if runErr != nil {
			t.Fatalf("run: %v\nstderr:\n%s", runErr, stderr.String())
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("run did not end within 2 minutes of its input\nstderr:\n%s", stderr.String())
	}
	if strings.Contains(stderr.String(), "decision log") {
		t.Errorf("the launcher warned about the log:\n%s", stderr.String())
	}
	waitSelectedGone(t, a.c, a.ns, managed, 30*time.Second)

	after := logEntries(t, logs("--json"))
	if !decided(after, a.allowed, true) || !decided(after, deniedName, false) {
		t.Errorf("after the run, logs --json lacks the allowed or the denied decision:\n%+v", after)
	}
	if len(after) < len(during) {
		t.Errorf("after the run, logs --json shows %d decisions, fewer than the %d of during it", len(after), len(during))
	}
	table := string(logs())
	t.Logf("logs:\n%s", table)
	if rows := strings.Count(table, "\n"); rows != len(after)+1 {
		t.Errorf("logs printed %d lines for %d decisions and its heading: a name printed a row of its own", rows, len(after))
	}
	for _, want := range []string{
		` allowed +rule +\S+ +(GET )?` + regexp.QuoteMeta(a.allowed+":8080") + ` `,
		` denied +rule +\S+ +(GET )?` + regexp.QuoteMeta(deniedName+":443") + ` `,
	} {
		if !regexp.MustCompile(want).MatchString(table) {
			t.Errorf("logs has no line matching %q", want)
		}
	}

	// The forged decision is nowhere: the gateway wrote the name it was
	// asked as a string of one entry, and the host's log holds nothing but
	// the header and whole entries.
	if decided(after, forgedHost, true) || decided(after, forgedHost, false) {
		t.Errorf("a decision the sandbox forged is in the log:\n%+v", after)
	}
	files, err := filepath.Glob(filepath.Join(home, "state", "propio-sandbox", "logs", "*.jsonl"))
	if err != nil || len(files) != 1 {
		t.Fatalf("logs on the host: %v (%v), want one", files, err)
	}
	raw, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSuffix(string(raw), "\n"), "\n")
	var h decisionlog.Header
	if real, _ := filepath.EvalSymlinks(ws); json.Unmarshal([]byte(lines[0]), &h) != nil || h.Event != "start" || h.Workspace != real {
		t.Errorf("the log's header is %s, want the start of a sandbox of %s", lines[0], real)
	}
	for _, line := range lines[1:] {
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		var e decisionlog.Entry
		if err := dec.Decode(&e); err != nil || dec.More() {
			t.Errorf("the log holds a line that is not one decision: %q (%v)", line, err)
		}
	}
	// The forging query did reach the log: as the name of one denied
	// DNS decision, the line within it a string.
	forged := false
	for _, e := range after {
		forged = forged || (e.Via == "dns" && !e.Allowed && strings.Contains(e.Host, `{"host":"`+forgedHost+`","allowed":true`))
	}
	if !forged {
		t.Errorf("no denied DNS decision names the forging query: the attack did not reach the log\n%+v", after)
	}

	// A run ended by a signal keeps what was copied of its log, and its
	// follow does not hold the end up.
	cmd = a.run(t, ws, home, `curl -s -m 10 -o /dev/null -w 'again:%{http_code}\n' http://`+a.allowed+`:8080/
echo requests-made
exec sleep 600`)
	var out2, err2 testenv.Buffer
	cmd.Stdout, cmd.Stderr = &out2, &err2
	done := startLauncher(t, cmd)
	name := waitSandboxRunning(t, a.c, a.ns, done, 2*time.Minute)
	for deadline := time.Now().Add(time.Minute); !strings.Contains(out2.String(), "requests-made\n"); {
		if time.Now().After(deadline) {
			t.Fatalf("the second sandbox did not make its request within a minute\nstdout:\n%s\nstderr:\n%s", out2.String(), err2.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	for deadline := time.Now().Add(20 * time.Second); !decided(logEntries(t, logs("--json", name)), a.allowed, true); {
		if time.Now().After(deadline) {
			t.Fatalf("during the second run, logs --json %s did not show its decision within 20 s", name)
		}
		time.Sleep(500 * time.Millisecond)
	}
	signalled := time.Now()
	terminate(t, cmd, done, &err2)
	t.Logf("the signalled run ended %v after SIGTERM", time.Since(signalled).Round(time.Millisecond))
	if strings.Contains(err2.String(), "decision log") {
		t.Errorf("the launcher warned about the log:\n%s", err2.String())
	}
	waitSelectedGone(t, a.c, a.ns, managed, 30*time.Second)
	if got := logEntries(t, logs("--json", name)); !decided(got, a.allowed, true) {
		t.Errorf("after the signalled run, logs --json %s lacks its decision:\n%+v", name, got)
	}
	if got := logEntries(t, logs("--json")); !decided(got, a.allowed, true) || decided(got, deniedName, false) {
		t.Errorf("logs --json shows another run's decisions than the latest's:\n%+v", got)
	}
}
