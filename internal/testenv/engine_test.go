package testenv_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

// TestPrivateDocker: a private dockerd runs the probe image it was given,
// is unreachable once stopped, keeps its images across a restart, starts
// again after a kill, and is removed with what it ran, even when killed with
// a container running.
func TestPrivateDocker(t *testing.T) {
	testenv.RequireEngine(t)
	e := testenv.PrivateDocker(t, testenv.ProbeImage)
	if out, err := e.Docker("run", "--rm", testenv.ProbeImage, "id"); err != nil || !strings.Contains(out, "uid=0") {
		t.Fatalf("running the probe on the private engine: %v\n%s", err, out)
	}
	if out, err := testenv.Docker("ps", "-aq", "--filter", "ancestor="+testenv.ProbeImage, "--filter", "label=private-engine-test"); err != nil || strings.TrimSpace(out) != "" {
		t.Fatalf("the shared engine lists what the private one ran: %v %s", err, out)
	}
	e.Stop()
	if _, err := e.Docker("version"); err == nil {
		t.Fatal("the stopped engine still answers")
	}
	e.Start()
	if _, err := e.Docker("image", "inspect", testenv.ProbeImage); err != nil {
		t.Fatalf("the image is gone after a restart: %v", err)
	}
	if _, err := e.Docker("run", "-d", "--label", "private-engine-test", testenv.ProbeImage, "sleep", "10m"); err != nil {
		t.Fatal(err)
	}
	e.Kill()
	if e.Running() {
		t.Fatal("the killed engine is said to run")
	}
	// Back after a crash, with the container it ran: the cleanup removes
	// it, and the engine.
	e.Start()
	if out, err := e.Docker("ps", "-aq", "--filter", "label=private-engine-test"); err != nil || strings.TrimSpace(out) == "" {
		t.Fatalf("the container is not listed after the restart: %v %q", err, out)
	}
	e.Kill()
}

// TestPrivateRemoteDocker: the private engine answers the docker CLI
// through ssh:// (with the test's ssh) and through tcp:// with TLS, and
// refuses a TLS client without the test's certificate.
func TestPrivateRemoteDocker(t *testing.T) {
	testenv.RequireEngine(t)
	r := testenv.PrivateRemoteDocker(t)
	cli := func(env []string, args ...string) (string, error) {
		cmd := exec.Command("docker", args...)
		cmd.Env = append(os.Environ(), env...)
		cmd.Env = append(cmd.Env, "DOCKER_CONFIG="+t.TempDir())
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	want, err := r.Docker("info", "--format", "{{.ID}}")
	if err != nil {
		t.Fatal(err)
	}
	ssh := []string{"PATH=" + r.SSHBin + ":" + os.Getenv("PATH"), "DOCKER_HOST=" + r.SSHHost}
	if out, err := cli(ssh, "info", "--format", "{{.ID}}"); err != nil || out != want {
		t.Errorf("docker info through %s: %v: %s, want %s", r.SSHHost, err, out, want)
	}
	tls := []string{"DOCKER_HOST=" + r.TLSHost, "DOCKER_TLS_VERIFY=1", "DOCKER_CERT_PATH=" + r.CertDir}
	if out, err := cli(tls, "info", "--format", "{{.ID}}"); err != nil || out != want {
		t.Errorf("docker info through %s: %v: %s, want %s", r.TLSHost, err, out, want)
	}
	if out, err := cli([]string{"DOCKER_HOST=" + r.TLSHost}, "info", "--format", "{{.ID}}"); err == nil && out == want {
		t.Errorf("docker info through %s without TLS answered: %s", r.TLSHost, out)
	}
}
