package kube

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/kubeapi"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// agentImage is the image the rendered Pods run here: it has tar (the
// workspace's copy) and bash (the attacks below).
const agentImage = "propio-sandbox/agent:latest"

// loadImage copies an image from Docker into the test cluster's node
// (e2e/kube-cluster.sh load), once per image and test binary.
func loadImage(t *testing.T, image string) {
	t.Helper()
	v, _ := loads.LoadOrStore(image, &imageLoad{})
	l := v.(*imageLoad)
	l.once.Do(func() {
		cmd := exec.Command("bash", filepath.Join(testenv.RepoRoot(), "e2e", "kube-cluster.sh"), "load", image)
		out, err := cmd.CombinedOutput()
		if err != nil {
			l.err = fmt.Errorf("%v: %s", err, out)
		}
	})
	if l.err != nil {
		t.Fatalf("loading %s into the cluster's node: %v", image, l.err)
	}
	// The node's status lists it once the kubelet has looked again.
	c, _ := testenv.Kube(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		raw, err := c.Do(ctx, http.MethodGet, "/api/v1/nodes", nil, nil)
		if err == nil && bytes.Contains(raw, []byte(`"docker.io/`+image+`"`)) {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("no node lists %s in its status after 2 minutes: %v", image, err)
		}
		time.Sleep(time.Second) // the kubelet's status update, not an event here
	}
}

// loads are the images loaded into the node, by name.
var loads sync.Map

// imageLoad is the load of one image.
type imageLoad struct {
	once sync.Once
	err  error
}

// workspaceTar is the workspace as the init container takes it.
func workspaceTar(t *testing.T, dir string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

type podState struct {
	Status struct {
		Phase                 string            `json:"phase"`
		InitContainerStatuses []containerStatus `json:"initContainerStatuses"`
		ContainerStatuses     []containerStatus `json:"containerStatuses"`
	} `json:"status"`
}

type containerStatus struct {
	Name  string `json:"name"`
	State struct {
		Running *struct{} `json:"running"`
		Waiting *struct {
			Reason  string `json:"reason"`
			Message string `json:"message"`
		} `json:"waiting"`
		Terminated *struct {
			ExitCode int    `json:"exitCode"`
			Reason   string `json:"reason"`
		} `json:"terminated"`
	} `json:"state"`
}

// waitPod polls the Pod until done says so, for at most limit (the
// kubelet's progress is not an event this client subscribes to).
func waitPod(t *testing.T, c *kubeapi.Client, ns, name string, limit time.Duration, done func(podState) bool) podState {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var last podState
	for {
		raw, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+name, nil, nil)
		if err == nil {
			last = podState{}
			if err := json.Unmarshal(raw, &last); err != nil {
				t.Fatal(err)
			}
			if done(last) {
				return last
			}
		}
		if ctx.Err() != nil {
			t.Fatalf("pod %s/%s: not there within %v; last status %+v (%v)", ns, name, limit, last.Status, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubeRenderedSandboxIsolates creates the objects render prints for
// real, copies the workspace in through the init container's standard
// input, and attacks from inside the sandbox: with network none (offline)
// the NetworkPolicy denies egress to the API server's Service and to the
// cluster's DNS, a hidden file reads empty, a readonly path cannot be
// written, and the exit code comes back; the same attacks with network
// open succeed, so the denials are the policy's.
func TestKubeRenderedSandboxIsolates(t *testing.T) {
	c, _ := testenv.Kube(t)
	launcher := testenv.Launcher(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ws := workspace(t)
	if err := os.WriteFile(filepath.Join(ws, ".env"), []byte("API_KEY=hidden-value"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ws, "src", "main.go"), []byte("package main // copied"), 0o644); err != nil {
		t.Fatal(err)
	}
	attack := `echo "main:$(cat /workspace/src/main.go)"
echo "env:[$(cat /workspace/.env)]"
touch /workspace/.propio/x 2>/dev/null && echo readonly-broken || echo readonly-held
timeout 5 bash -c 'exec 3<>/dev/tcp/10.96.0.1/443' 2>/dev/null && echo egress-open || echo egress-denied
timeout 10 getent hosts kubernetes.default.svc.cluster.local >/dev/null && echo dns-open || echo dns-denied
echo "term:$TERM"
exit 7`
	for _, tc := range []struct {
		profile string
		want    []string
	}{
		{"offline", []string{"egress-denied", "dns-denied"}},
		{"open", []string{"egress-open", "dns-open"}},
	} {
		// One after the other: each Pod asks for the node's two cores.
		t.Run(tc.profile, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "kube_"+tc.profile)
			if err := os.CopyFS(dir, os.DirFS(ws)); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(launcher, "render", "--target", "kubernetes", "-p", tc.profile, "-n", ns, "--", "bash", "-c", attack)
			cmd.Dir = dir
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("render: %v", err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			var pod string
			for _, doc := range documents(t, out) {
				var head kubeapi.Object
				if err := json.Unmarshal(doc, &head); err != nil {
					t.Fatal(err)
				}
				if head.Kind == "Secret" {
					// What run does: the passed variables' values.
					doc = bytes.Replace(doc, []byte(`"TERM":""`), []byte(`"TERM":"xterm-test"`), 1)
				}
				if head.Kind == "Pod" {
					pod = head.Metadata.Name
					t.Cleanup(func() {
						ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
						defer cancel()
						q := url.Values{"gracePeriodSeconds": {"0"}}
						if _, err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+ns+"/pods/"+pod, q, nil); err != nil {
							t.Errorf("removing pod %s: %v", pod, err)
						}
					})
				}
				if _, err := c.Create(ctx, "", doc, kubeapi.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			initRunning := func(s podState) bool {
				return len(s.Status.InitContainerStatuses) == 1 && s.Status.InitContainerStatuses[0].State.Running != nil
			}
			waitPod(t, c, ns, pod, 2*time.Minute, initRunning)
			err = c.Attach(ctx, ns, pod, kubeapi.StreamOptions{Container: "workspace-copy", Stdin: true, Stdout: true, Stderr: true},
				bytes.NewReader(workspaceTar(t, dir)), io.Discard, os.Stderr)
			if err != nil {
				t.Fatalf("copying the workspace in: %v", err)
			}
			final := waitPod(t, c, ns, pod, 2*time.Minute, func(s podState) bool {
				return s.Status.Phase == "Succeeded" || s.Status.Phase == "Failed"
			})
			if len(final.Status.InitContainerStatuses) != 1 || final.Status.InitContainerStatuses[0].State.Terminated == nil ||
				final.Status.InitContainerStatuses[0].State.Terminated.ExitCode != 0 {
				t.Fatalf("the workspace's copy did not end well: %+v", final.Status.InitContainerStatuses)
			}
			term := final.Status.ContainerStatuses[0].State.Terminated
			if term == nil || term.ExitCode != 7 {
				t.Errorf("the sandbox's exit: %+v, want code 7", term)
			}
			logs, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+pod+"/log", url.Values{"container": {"sandbox"}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := string(logs)
			t.Logf("the sandbox said:\n%s", got)
			for _, want := range append([]string{"main:package main // copied", "env:[]", "readonly-held", "term:xterm-test"}, tc.want...) {
				if !strings.Contains(got, want+"\n") {
					t.Errorf("the sandbox did not say %q", want)
				}
			}
			if strings.Contains(got, "hidden-value") {
				t.Error("the hidden .env was read")
			}
		})
	}
}
