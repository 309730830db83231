package e2e

// A mount request with write access, end to end: the agent asks from
// inside a real sandbox (network none) for write access to a host
// directory, the real CLI allows it, the agent changes its copy; the host
// directory stays as it was, and once the sandbox ends what the agent
// wrote is a changeset that changes, diff and apply review and apply.

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/ask"
)

func TestAgentRequestsMountWrite(t *testing.T) {
	requireAgentImage(t)
	s := newSandbox(t)
	s.RuntimeDir()
	data := filepath.Join(s.Home, "notes")
	writeFiles(t, data, map[string]string{"todo.txt": "one\n", "keep.txt": "as it was\n"})
	hostUnchanged := func(when string) {
		t.Helper()
		for name, want := range map[string]string{"todo.txt": "one\n", "keep.txt": "as it was\n"} {
			if b, err := os.ReadFile(filepath.Join(data, name)); err != nil || string(b) != want {
				t.Errorf("%s: host %s is %q (%v); want %q", when, name, b, err, want)
			}
		}
		if _, err := os.Stat(filepath.Join(data, "added.txt")); err == nil {
			t.Errorf("%s: added.txt is on the host", when)
		}
	}
	r := startRunning(t, s, "image: propio-sandbox/agent:latest\nagent_requests: [mount]\nnetwork: {mode: none}\n")
	ap := startApprover(t, s)

	got := inSandbox(r, agentAsk(`{"kind":"mount","mount":{"source":"`+data+`","write":true},"reason":"update the notes"}`))
	req := ap.next(ask.EventPending).Request
	if req.Kind != ask.KindMount || req.Mount == nil || !req.Mount.Write || req.Mount.Source != data {
		t.Fatalf("request = %+v", req)
	}
	decide(t, s, "allow", req.ID, "once")
	a := parseAnswer(t, recv(t, got))
	path, _ := a.Result["path"].(string)
	if a.Decision != ask.Allow || a.Error != "" || path != "/run/propio-sandbox/mounts-rw/notes" {
		t.Fatalf("answer %+v", a)
	}
	if out := recv(t, inSandbox(r, "printf 'one\\ntwo\\n' > "+path+"/todo.txt && echo new > "+path+"/added.txt && cat "+path+"/todo.txt "+path+"/keep.txt")); out != "one\ntwo\nas it was" {
		t.Fatalf("writing the copy inside: %q", out)
	}
	hostUnchanged("while the sandbox runs")

	res := r.Stop()
	hostUnchanged("after the sandbox ended")
	m := regexp.MustCompile(`changeset (\S+) holds what the agent wrote to ` + regexp.QuoteMeta(data)).FindStringSubmatch(res.Stderr)
	if m == nil {
		t.Fatalf("the run did not say where the changeset is:\n%s", res)
	}
	t.Log(m[0])
	id := m[1]
	if out := cli(t, s, "changes").Stdout; !strings.Contains(out, id) {
		t.Errorf("changes does not list %s:\n%s", id, out)
	}
	diff := cli(t, s, "diff", id).Stdout
	for _, want := range []string{"+two", "added.txt", "+new"} {
		if !strings.Contains(diff, want) {
			t.Errorf("diff lacks %q:\n%s", want, diff)
		}
	}
	if strings.Contains(diff, "keep.txt") {
		t.Errorf("diff shows the unchanged keep.txt:\n%s", diff)
	}
	cli(t, s, "apply", id)
	for name, want := range map[string]string{"todo.txt": "one\ntwo\n", "added.txt": "new\n", "keep.txt": "as it was\n"} {
		if b, err := os.ReadFile(filepath.Join(data, name)); err != nil || string(b) != want {
			t.Errorf("after apply: host %s is %q (%v); want %q", name, b, err, want)
		}
	}
}
