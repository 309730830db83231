package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/kubeapi"
	"github.com/propio/propio-sandbox/internal/testenv"
	"go.yaml.in/yaml/v3"
)

// agentSandboxModule is the release of kubernetes-sigs/agent-sandbox whose
// CustomResourceDefinitions (k8s/crds in its module zip, fetched from the
// Go module proxy and checked against go.sum's database) the tests install.
const agentSandboxModule = "sigs.k8s.io/agent-sandbox@v0.1.0"

// agentSandboxCRDs are the CRDs the rendered objects need, by file of the
// module's k8s/crds, with the name each defines.
var agentSandboxCRDs = []struct{ file, name string }{
	{"agents.x-k8s.io_sandboxes.yaml", "sandboxes.agents.x-k8s.io"},
	{"extensions.agents.x-k8s.io_sandboxtemplates.yaml", "sandboxtemplates.extensions.agents.x-k8s.io"},
	{"extensions.agents.x-k8s.io_sandboxclaims.yaml", "sandboxclaims.extensions.agents.x-k8s.io"},
}

const crdPath = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"

// agentSandboxCRDDir downloads agent-sandbox's module and returns its
// k8s/crds directory.
func agentSandboxCRDDir(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", agentSandboxModule)
	cmd.Dir = t.TempDir() // outside any module: go.mod's requirements are not touched
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var mod struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); err != nil || jerr != nil || mod.Error != "" || mod.Dir == "" {
		t.Fatalf("downloading %s for its CRDs (from the Go module proxy): %v %s %s", agentSandboxModule, err, mod.Error, stderr.String())
	}
	return filepath.Join(mod.Dir, "k8s", "crds")
}

// installAgentSandboxCRDs installs agent-sandbox's CRDs, labelled as this
// test's, waits until the API server serves their kinds, and removes them
// when the test ends.
func installAgentSandboxCRDs(t *testing.T, c *kubeapi.Client) {
	t.Helper()
	dir := agentSandboxCRDDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, crd := range agentSandboxCRDs {
		raw, err := os.ReadFile(filepath.Join(dir, crd.file))
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatalf("reading %s: %v", crd.file, err)
		}
		meta := doc["metadata"].(map[string]any)
		meta["labels"] = map[string]any{"propio-sandbox.dev/test": "agent-sandbox-crds"}
		body, err := json.Marshal(doc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Do(ctx, http.MethodPost, crdPath, nil, body); err != nil {
			t.Fatalf("installing %s: %v", crd.name, err)
		}
		t.Cleanup(func() { removeCRD(t, c, crd.name) })
	}
	for _, kind := range []struct{ apiVersion, kind string }{
		{"agents.x-k8s.io/v1alpha1", "Sandbox"},
		{"extensions.agents.x-k8s.io/v1alpha1", "SandboxTemplate"},
		{"extensions.agents.x-k8s.io/v1alpha1", "SandboxClaim"},
	} {
		for {
			ok, err := c.Served(ctx, kind.apiVersion, kind.kind)
			if ok {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("the API server does not serve %s %s two minutes after its CRD was installed: %v", kind.apiVersion, kind.kind, err)
			}
			time.Sleep(200 * time.Millisecond) // the CRD's establishment, not an event here
		}
	}
}

// removeCRD deletes the CRD name and waits (bounded) until it is gone, so
// that the cluster serves its kind no more.
func removeCRD(t *testing.T, c *kubeapi.Client, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Do(ctx, http.MethodDelete, crdPath+"/"+name, nil, nil); err != nil && !kubeapi.IsNotFound(err) {
		t.Errorf("removing CRD %s: %v", name, err)
		return
	}
	for {
		_, err := c.Do(ctx, http.MethodGet, crdPath+"/"+name, nil, nil)
		if kubeapi.IsNotFound(err) {
			return
		}
		if ctx.Err() != nil {
			t.Errorf("CRD %s is still there a minute after its deletion: %v", name, err)
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestKubeRenderAgentSandbox renders profiles with --as sandbox and --as
// template and has the cluster's API server admit them by render's own
// --server-dry-run, and by the test's dry run of each object, once
// kubernetes-sigs/agent-sandbox's CRDs (v0.1.0's, from its module) are
// installed: the Sandbox's and the SandboxTemplate's pod template, as
// admitted, keeps every isolation field of the Pod. Before they are
// installed, --server-dry-run fails saying the cluster does not serve
// Sandbox, with a hint, and prints or writes nothing.
func TestKubeRenderAgentSandbox(t *testing.T) {
	c, kubeconfig := testenv.Kube(t)
	launcher := testenv.Launcher(t)
	ns := namespace(t, c)
	rc := runtimeClass(t, c)
	ws := workspace(t)
	custom := filepath.Join(t.TempDir(), "custom.yaml")
	profileText := `version: 1
extends: offline
image: propio-sandbox/agent:latest
env:
  pass: [TERM, PROPIO_TEST_SECRET]
resources: {cpus: 0.5, memory: 512m, timeout: 90s}
security: {runtime: ` + rc + `}
`
	if err := os.WriteFile(custom, []byte(profileText), 0o644); err != nil {
		t.Fatal(err)
	}
	const secret = "propio-test-value-5e1d0b"
	render := func(t *testing.T, args ...string) ([]byte, string, error) {
		t.Helper()
		cmd := exec.Command(launcher, append([]string{"render", "--target", "kubernetes", "-n", ns}, args...)...)
		cmd.Dir = ws
		cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig, "PROPIO_TEST_SECRET="+secret, "TERM="+secret)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if bytes.Contains(out, []byte(secret)) || strings.Contains(stderr.String(), secret) {
			t.Fatalf("render %v: a passed variable's value is in its output", args)
		}
		return out, stderr.String(), err
	}

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if ok, err := c.Served(ctx, "agents.x-k8s.io/v1alpha1", "Sandbox"); err != nil || ok {
		t.Fatalf("before the test installs them, the cluster serves Sandbox (%v, %v): remove agent-sandbox's CRDs from the test cluster", ok, err)
	}
	t.Run("missing", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "out.yaml")
		out, stderr, err := render(t, "-p", "offline", "--as", "sandbox", "--server-dry-run", "-o", file)
		if err == nil {
			t.Fatalf("render --server-dry-run without the CRDs succeeded:\n%s", out)
		}
		if !strings.Contains(stderr, "error: the cluster does not serve Sandbox (agents.x-k8s.io/v1alpha1): its CustomResourceDefinition is not installed") ||
			!strings.Contains(stderr, "hint: install the CustomResourceDefinitions of kubernetes-sigs/agent-sandbox") {
			t.Errorf("stderr %q, want the missing kind and the hint", stderr)
		}
		if len(out) != 0 {
			t.Errorf("stdout %q, want nothing", out)
		}
		if _, err := os.Stat(file); !os.IsNotExist(err) {
			t.Errorf("the output file is there (%v)", err)
		}
		// The bare Pod needs no CRD: the same cluster admits it.
		if out, stderr, err := render(t, "-p", "offline", "--server-dry-run"); err != nil || !bytes.Contains(out, []byte("\nkind: Pod\n")) {
			t.Errorf("render --server-dry-run of the bare Pod: %v\n%s", err, stderr)
		}
	})

	installAgentSandboxCRDs(t, c)
	for _, as := range []string{"sandbox", "template"} {
		for _, p := range []string{"offline", "open", custom} {
			t.Run(as+"/"+filepath.Base(p), func(t *testing.T) {
				want, stderr, err := render(t, "-p", p, "--as", as)
				if err != nil {
					t.Fatalf("render: %v\n%s", err, stderr)
				}
				got, stderr, err := render(t, "-p", p, "--as", as, "--server-dry-run")
				if err != nil {
					t.Fatalf("render --server-dry-run: %v\n%s", err, stderr)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("render --server-dry-run printed other bytes than render")
				}
				kinds := map[string]bool{}
				for _, doc := range documents(t, got) {
					var head kubeapi.Object
					if err := json.Unmarshal(doc, &head); err != nil {
						t.Fatal(err)
					}
					kinds[head.Kind] = true
					back, err := c.Create(ctx, "", doc, kubeapi.CreateOptions{DryRun: true})
					if err != nil {
						t.Fatalf("the API server's dry run refused %s %s: %v", head.Kind, head.Metadata.Name, err)
					}
					if head.Kind == "Sandbox" || head.Kind == "SandboxTemplate" {
						checkAdmittedTemplate(t, doc, back, p == custom, rc)
						// The CRD's validation is live: an unknown field of
						// the pod template's spec is refused.
						bad := bytes.Replace(doc, []byte(`"restartPolicy":`), []byte(`"restartPolicyy":"Never","restartPolicy":`), 1)
						if _, err := c.Create(ctx, "", bad, kubeapi.CreateOptions{DryRun: true}); err == nil || !strings.Contains(err.Error(), "restartPolicyy") {
							t.Errorf("a %s with an unknown field: %v, want the dry run to refuse it", head.Kind, err)
						}
					}
				}
				wantKinds := map[string][]string{"sandbox": {"Sandbox"}, "template": {"SandboxTemplate", "SandboxClaim"}}[as]
				for _, k := range wantKinds {
					if !kinds[k] {
						t.Errorf("rendered kinds %v, want %v", kinds, wantKinds)
					}
				}
				if kinds["Pod"] {
					t.Errorf("rendered kinds %v: a bare Pod beside the %s", kinds, as)
				}
			})
		}
	}
	// Nothing was stored: the namespace holds no Sandbox, template or claim.
	for _, path := range []string{
		"/apis/agents.x-k8s.io/v1alpha1/namespaces/" + ns + "/sandboxes",
		"/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/" + ns + "/sandboxtemplates",
		"/apis/extensions.agents.x-k8s.io/v1alpha1/namespaces/" + ns + "/sandboxclaims",
		"/api/v1/namespaces/" + ns + "/pods",
	} {
		list, err := c.Do(ctx, http.MethodGet, path, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		var items struct{ Items []any }
		if err := json.Unmarshal(list, &items); err != nil || len(items.Items) != 0 {
			t.Errorf("after dry runs %s holds %d objects (%v)", path, len(items.Items), err)
		}
	}
}

// admittedTemplate is the part of a Sandbox's or a SandboxTemplate's pod
// template that isolates the sandbox.
type admittedTemplate struct {
	Metadata struct {
		Labels map[string]string `json:"labels"`
	} `json:"metadata"`
	Spec struct {
		RuntimeClassName             string `json:"runtimeClassName"`
		ActiveDeadlineSeconds        int64  `json:"activeDeadlineSeconds"`
		AutomountServiceAccountToken *bool  `json:"automountServiceAccountToken"`
		EnableServiceLinks           *bool  `json:"enableServiceLinks"`
		SecurityContext              struct {
			RunAsUser      *int64 `json:"runAsUser"`
			RunAsNonRoot   *bool  `json:"runAsNonRoot"`
			SeccompProfile struct {
				Type string `json:"type"`
			} `json:"seccompProfile"`
		} `json:"securityContext"`
		Containers []struct {
			Name            string `json:"name"`
			Image           string `json:"image"`
			SecurityContext struct {
				Privileged               *bool `json:"privileged"`
				AllowPrivilegeEscalation *bool `json:"allowPrivilegeEscalation"`
				ReadOnlyRootFilesystem   *bool `json:"readOnlyRootFilesystem"`
				Capabilities             struct {
					Drop []string `json:"drop"`
				} `json:"capabilities"`
			} `json:"securityContext"`
			Resources struct {
				Limits map[string]string `json:"limits"`
			} `json:"resources"`
			VolumeMounts []struct {
				MountPath string `json:"mountPath"`
				ReadOnly  bool   `json:"readOnly"`
			} `json:"volumeMounts"`
		} `json:"containers"`
		Volumes []struct {
			Name     string `json:"name"`
			EmptyDir *struct {
				Medium    string `json:"medium"`
				SizeLimit string `json:"sizeLimit"`
			} `json:"emptyDir"`
		} `json:"volumes"`
	} `json:"spec"`
}

// checkAdmittedTemplate checks the pod template of a Sandbox or a
// SandboxTemplate as the API server admitted it (a CRD's structural
// schema prunes what it does not know) against the one rendered: every
// isolation field survived, with its value; and the values that hold for
// any profile (and, for the custom one, its runtime class, deadline and
// limits) are there.
func checkAdmittedTemplate(t *testing.T, rendered, admitted []byte, custom bool, rc string) {
	t.Helper()
	var obj [2]struct {
		Spec struct {
			PodTemplate admittedTemplate `json:"podTemplate"`
		} `json:"spec"`
	}
	for i, raw := range [][]byte{rendered, admitted} {
		if err := json.Unmarshal(raw, &obj[i]); err != nil {
			t.Fatal(err)
		}
	}
	want, pt := obj[0].Spec.PodTemplate, obj[1].Spec.PodTemplate
	if !reflect.DeepEqual(want, pt) {
		w, _ := json.Marshal(want)
		g, _ := json.Marshal(pt)
		t.Errorf("the admitted pod template differs from the rendered one:\nrendered %s\nadmitted %s", w, g)
	}
	s := pt.Spec
	if pt.Metadata.Labels["propio-sandbox.dev/role"] != "sandbox" || pt.Metadata.Labels["propio-sandbox.dev/sandbox"] == "" {
		t.Errorf("admitted pod template's labels %v, want the sandbox's (the policy selects its Pod by them)", pt.Metadata.Labels)
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken || s.SecurityContext.SeccompProfile.Type != "RuntimeDefault" {
		t.Errorf("admitted pod template: token %v, seccomp %q; want no service account token, RuntimeDefault", s.AutomountServiceAccountToken, s.SecurityContext.SeccompProfile.Type)
	}
	memory := false
	for _, v := range s.Volumes {
		memory = memory || (v.EmptyDir != nil && v.EmptyDir.Medium == "Memory" && v.EmptyDir.SizeLimit != "")
	}
	if !memory {
		t.Errorf("admitted pod template: no memory-backed emptyDir with a size limit (the tmpfs)")
	}
	if len(s.Containers) == 0 {
		t.Fatalf("admitted pod template has no container")
	}
	c := s.Containers[0].SecurityContext
	if c.Privileged == nil || *c.Privileged || c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation || len(c.Capabilities.Drop) != 1 || c.Capabilities.Drop[0] != "ALL" {
		t.Errorf("admitted pod template's sandbox container: privileged %v, escalation %v, drop %v; want neither, and ALL dropped", c.Privileged, c.AllowPrivilegeEscalation, c.Capabilities.Drop)
	}
	if custom {
		lim := s.Containers[0].Resources.Limits
		if s.RuntimeClassName != rc || s.ActiveDeadlineSeconds != 90 || lim["cpu"] != "500m" || lim["memory"] == "" || c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem {
			t.Errorf("admitted pod template: runtime class %q, deadline %d, limits %v, read-only root %v; want %q, 90, cpu 500m and a memory limit, true", s.RuntimeClassName, s.ActiveDeadlineSeconds, lim, c.ReadOnlyRootFilesystem, rc)
		}
	}
}
