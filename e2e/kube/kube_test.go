// Package kube holds the end-to-end tests against a real Kubernetes
// cluster: the one e2e/kube-cluster.sh builds and starts, named by
// PROPIO_KUBECONFIG (testenv.Kube says when they skip and when they fail).
// They are a package of their own so that `go test ./...` runs them beside
// the engine tests while CI's cluster is still starting.
package kube

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/kubeapi"
	"github.com/propio/propio-sandbox/internal/testenv"
	"go.yaml.in/yaml/v3"
)

// TestMain removes the built binaries when the tests end.
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.Cleanup()
	os.Exit(code)
}

func randomSuffix(t *testing.T) string {
	t.Helper()
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// namespace makes a namespace of the test's own, removed when it ends, and
// waits (bounded) until it can take Pods: its default service account.
func namespace(t *testing.T, c *kubeapi.Client) string {
	t.Helper()
	ns := "propio-test-" + randomSuffix(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"Namespace","metadata":{"name":%q}}`, ns)
	if _, err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces", nil, []byte(body)); err != nil {
		t.Fatalf("making namespace %s: %v", ns, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+ns, nil, nil); err != nil && !kubeapi.IsNotFound(err) {
			t.Errorf("removing namespace %s: %v", ns, err)
		}
	})
	for {
		_, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/serviceaccounts/default", nil, nil)
		if err == nil {
			return ns
		}
		if ctx.Err() != nil {
			t.Fatalf("namespace %s has no default service account after a minute: %v", ns, err)
		}
		time.Sleep(200 * time.Millisecond) // the controller's work, not an event here
	}
}

// runtimeClass makes a RuntimeClass of the test's own whose handler is the
// node's runc, removed when the test ends.
func runtimeClass(t *testing.T, c *kubeapi.Client) string {
	t.Helper()
	name := "propio-test-" + randomSuffix(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	body := fmt.Sprintf(`{"apiVersion":"node.k8s.io/v1","kind":"RuntimeClass","metadata":{"name":%q},"handler":"runc"}`, name)
	if _, err := c.Do(ctx, http.MethodPost, "/apis/node.k8s.io/v1/runtimeclasses", nil, []byte(body)); err != nil {
		t.Fatalf("making runtime class %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := c.Do(ctx, http.MethodDelete, "/apis/node.k8s.io/v1/runtimeclasses/"+name, nil, nil); err != nil {
			t.Errorf("removing runtime class %s: %v", name, err)
		}
	})
	return name
}

// workspace makes a workspace with files the profiles' rules match:
// hidden files, a readonly directory, a git directory.
func workspace(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "kube_ws")
	for _, f := range []string{".env", "certs/server.pem", ".propio/notes", ".git/config", ".git/hooks/pre-commit", "src/main.go"} {
		p := filepath.Join(dir, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// documents splits a YAML stream into its documents, each as JSON.
func documents(t *testing.T, stream []byte) [][]byte {
	t.Helper()
	dec := yaml.NewDecoder(bytes.NewReader(stream))
	var out [][]byte
	for {
		var doc map[string]any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("reading the rendered YAML: %v", err)
		}
		b, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
}

// TestKubeRenderDryRun renders profiles for --target kubernetes and has the
// API server's server-side dry run admit every object, with strict field
// validation: the Pod (its security context, runtime class, resources,
// memory-backed emptyDirs, deadline), the NetworkPolicy, the Secret and
// the ConfigMap. An unknown field is refused by the same dry run, so the
// validation is live. The value of a passed variable is in no output.
func TestKubeRenderDryRun(t *testing.T) {
	c, _ := testenv.Kube(t)
	launcher := testenv.Launcher(t)
	ns := namespace(t, c)
	rc := runtimeClass(t, c)

	ws := workspace(t)
	custom := filepath.Join(t.TempDir(), "custom.yaml")
	profileText := fmt.Sprintf(`version: 1
extends: offline
image: propio-sandbox/agent:latest
command: ["sh", "-c", "echo $$(HOME)"]
env:
  pass: [TERM, PROPIO_TEST_SECRET]
  set: {GREETING: "hello $$(USER)"}
resources: {cpus: 0.5, memory: 512m, timeout: 90s}
security: {runtime: %s}
`, rc)
	if err := os.WriteFile(custom, []byte(profileText), 0o644); err != nil {
		t.Fatal(err)
	}
	// An allowlist: its gateway's Pod and the two policies are admitted
	// too (run does not make them yet).
	allow := filepath.Join(t.TempDir(), "allow.yaml")
	if err := os.WriteFile(allow, []byte("version: 1\nextends: offline\nnetwork: {mode: allowlist, allow: [allowed.test], deny: [denied.test]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const secret = "propio-test-value-7f3a9c"
	for _, p := range []string{"offline", "open", custom, allow} {
		t.Run(filepath.Base(p), func(t *testing.T) {
			cmd := exec.Command(launcher, "render", "--target", "kubernetes", "-p", p, "-n", ns)
			cmd.Dir = ws
			cmd.Env = append(os.Environ(), "PROPIO_TEST_SECRET="+secret, "TERM="+secret)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("render: %v\n%s", err, stderr.String())
			}
			if bytes.Contains(out, []byte(secret)) || bytes.Contains(stderr.Bytes(), []byte(secret)) {
				t.Fatalf("a passed variable's value is in the render's output")
			}
			docs := documents(t, out)
			kinds := map[string]int{}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for _, doc := range docs {
				var head kubeapi.Object
				if err := json.Unmarshal(doc, &head); err != nil {
					t.Fatal(err)
				}
				kinds[head.Kind]++
				back, err := c.Create(ctx, "", doc, kubeapi.CreateOptions{DryRun: true})
				if err != nil {
					t.Fatalf("the API server's dry run refused %s %s: %v", head.Kind, head.Metadata.Name, err)
				}
				if head.Kind == "Pod" && p == custom {
					checkAdmittedPod(t, back, rc)
				}
			}
			if kinds["Pod"] == 0 || kinds["Secret"] == 0 {
				t.Errorf("rendered kinds %v, want a Pod and a Secret", kinds)
			}
			switch filepath.Base(p) {
			case "allow.yaml":
				if kinds["Pod"] != 2 || kinds["NetworkPolicy"] != 2 {
					t.Errorf("allowlist: kinds %v, want the gateway's Pod and the sandbox's, and two policies", kinds)
				}
			case "custom.yaml":
			default:
				if strings.Contains(p, "offline") != (kinds["NetworkPolicy"] > 0) {
					t.Errorf("profile %s: kinds %v (a NetworkPolicy exactly for network none)", p, kinds)
				}
			}
			// The dry run is live: the same Pod with a field the schema
			// does not have is refused.
			for _, doc := range docs {
				if !bytes.Contains(doc, []byte(`"kind":"Pod"`)) {
					continue
				}
				bad := bytes.Replace(doc, []byte(`"restartPolicy":`), []byte(`"restartPolicyy":"Never","restartPolicy":`), 1)
				_, err := c.Create(ctx, "", bad, kubeapi.CreateOptions{DryRun: true})
				if err == nil || !strings.Contains(err.Error(), "restartPolicyy") {
					t.Errorf("a Pod with an unknown field: %v, want the dry run to refuse it", err)
				}
			}
		})
	}
	// Nothing was stored: the namespace holds no Pod.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	list, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pods struct{ Items []any }
	if err := json.Unmarshal(list, &pods); err != nil || len(pods.Items) != 0 {
		t.Errorf("after dry runs the namespace holds %d pods (%v)", len(pods.Items), err)
	}
}

// checkAdmittedPod checks the Pod as the API server admitted it: what the
// profile says survived admission.
func checkAdmittedPod(t *testing.T, raw []byte, rc string) {
	t.Helper()
	var pod struct {
		Spec struct {
			RuntimeClassName      string `json:"runtimeClassName"`
			ActiveDeadlineSeconds int64  `json:"activeDeadlineSeconds"`
			Containers            []struct {
				Args []string `json:"args"`
				Env  []struct {
					Name  string `json:"name"`
					Value string `json:"value"`
				} `json:"env"`
				Resources struct {
					Limits map[string]string `json:"limits"`
				} `json:"resources"`
			} `json:"containers"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(raw, &pod); err != nil {
		t.Fatal(err)
	}
	s := pod.Spec
	if s.RuntimeClassName != rc || s.ActiveDeadlineSeconds != 90 {
		t.Errorf("admitted pod: runtime class %q, deadline %d; want %q, 90", s.RuntimeClassName, s.ActiveDeadlineSeconds, rc)
	}
	if len(s.Containers) != 1 || s.Containers[0].Resources.Limits["cpu"] != "500m" || (s.Containers[0].Resources.Limits["memory"] != "512Mi" && s.Containers[0].Resources.Limits["memory"] != "536870912") {
		t.Errorf("admitted pod: containers %+v, want cpu 500m and memory 512Mi", s.Containers)
	}
	for _, e := range s.Containers[0].Env {
		if e.Name == "GREETING" && e.Value != "hello $$(USER)" {
			t.Errorf("admitted pod: GREETING=%q, want the $ escaped", e.Value)
		}
	}
	// $(VAR) is left to the shell, not expanded by Kubernetes: the
	// admitted Pod keeps the escape, which the kubelet undoes.
	if len(s.Containers) == 1 && (len(s.Containers[0].Args) != 3 || s.Containers[0].Args[2] != "echo $$(HOME)") {
		t.Errorf("admitted pod: args %q, want the $ escaped", s.Containers[0].Args)
	}
}
