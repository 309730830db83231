package kube

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/kube"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// runObjects generates the objects of profile name for a workspace dir,
// running command, with small resources (the node has two cores).
func runObjects(t *testing.T, name, dir string, command ...string) *generator.KubeObjects {
	t.Helper()
	p, err := profile.Locations{}.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	h := generator.Host{Workspace: dir, Home: t.TempDir(), UID: 1000, GID: 1000, EnvNames: []string{"TERM"},
		Passwd: "/accounts/1000-1000.passwd", Group: "/accounts/1000-1000.group"}
	objs, err := generator.Kubernetes(p, h, generator.Options{Project: "run-" + filepath.Base(dir), Command: command}, generator.KubeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cs := range [][]generator.KubeContainer{objs.Pod.Spec.InitContainers, objs.Pod.Spec.Containers} {
		for i := range cs {
			cs[i].Resources.Limits["cpu"], cs[i].Resources.Requests["cpu"] = "200m", "200m"
			cs[i].Resources.Limits["memory"], cs[i].Resources.Requests["memory"] = "128Mi", "128Mi"
		}
	}
	return objs
}

// TestKubeRun runs a sandbox on the cluster with kube.Run: the workspace
// copied in, the command's output (both streams) and its input through
// pipes, its exit code back, and nothing left after it; a run whose
// context ends (the launcher's signal) ends at once and leaves nothing.
func TestKubeRun(t *testing.T) {
	c, _ := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	cl := kube.New(c, ns)

	dir := filepath.Join(t.TempDir(), "kuberun")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "hello.txt"), []byte("from the workspace"), 0o644); err != nil {
		t.Fatal(err)
	}
	objs := runObjects(t, "offline", dir, "bash", "-c", `cat hello.txt; echo; echo to-stderr >&2; read line; echo "got:$line"; echo "term:$TERM"; exit 3`)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	var first time.Duration
	code, err := cl.Run(ctx, kube.RunSpec{
		Objects:   objs,
		Env:       func(n string) (string, bool) { return "xterm-run", n == "TERM" },
		Workspace: bytes.NewReader(workspaceTar(t, dir)),
		Streams:   kube.Streams{In: strings.NewReader("typed input\n"), Out: &out},
		Started:   func() { first = time.Since(start) },
	})
	if err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("from Run to the sandbox running: %v; to its end: %v", first, time.Since(start))
	if code != 3 {
		t.Errorf("exit code %d, want 3", code)
	}
	for _, want := range []string{"from the workspace\n", "to-stderr\n", "got:typed input\n", "term:xterm-run\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output %q lacks %q", out.String(), want)
		}
	}
	waitGone(t, c, ns, objs.Pod.Metadata.Name, 30*time.Second)

	// The launcher's signal: the context ends while the command runs.
	objs = runObjects(t, "open", dir, "sleep", "600")
	ctx2, cancel2 := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := cl.Run(ctx2, kube.RunSpec{
			Objects: objs, Env: func(string) (string, bool) { return "", false },
			Workspace: bytes.NewReader(workspaceTar(t, dir)),
			Started:   cancel2,
		})
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a cancelled run returned no error")
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("a cancelled run did not end within 2 minutes")
	}
	waitGone(t, c, ns, objs.Pod.Metadata.Name, 30*time.Second)
}

// TestKubeRunTimeout: the profile's timeout, the Pod's activeDeadlineSeconds,
// ends a run whose command would go on, and says so.
func TestKubeRunTimeout(t *testing.T) {
	c, _ := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	dir := filepath.Join(t.TempDir(), "kubetimeout")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	objs := runObjects(t, "open", dir, "sleep", "600")
	deadline := int64(8)
	objs.Pod.Spec.ActiveDeadlineSeconds = &deadline
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	_, err := kube.New(c, ns).Run(ctx, kube.RunSpec{
		Objects: objs, Env: func(string) (string, bool) { return "", false },
		Workspace: bytes.NewReader(workspaceTar(t, dir)),
	})
	if err == nil || !strings.Contains(err.Error(), "timeout") {
		t.Fatalf("a run past its deadline: %v, want the timeout named", err)
	}
	if d := time.Since(start); d > time.Minute {
		t.Errorf("the run past its 8 s deadline took %v", d)
	}
	waitGone(t, c, ns, objs.Pod.Metadata.Name, 30*time.Second)
}

// TestKubeRunPolicyHeld: before the command of a sandbox whose policy denies
// egress can start, Run checks from inside its Pod that the policy holds;
// a policy that does not hold it (here: one that selects no Pod, as a CNI
// that enforces nothing would leave any) ends the run with ErrNotEnforced,
// and nothing is left.
func TestKubeRunPolicyHeld(t *testing.T) {
	c, _ := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	dir := filepath.Join(t.TempDir(), "kubepolicy")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	objs := runObjects(t, "offline", dir, "echo", "ran")
	objs.Policies[0].Spec.PodSelector.MatchLabels = map[string]string{generator.KubeLabelSandbox: "no-such-pod"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	_, err := kube.New(c, ns).Run(ctx, kube.RunSpec{
		Objects: objs, Env: func(string) (string, bool) { return "", false },
		Workspace: bytes.NewReader(workspaceTar(t, dir)),
		Streams:   kube.Streams{Out: &out},
	})
	if !errors.Is(err, kube.ErrNotEnforced) {
		t.Errorf("a run whose policy does not hold: %v, want ErrNotEnforced", err)
	}
	if strings.Contains(out.String(), "ran") {
		t.Error("the command ran although its policy did not hold")
	}
	waitGone(t, c, ns, objs.Pod.Metadata.Name, 30*time.Second)
}
