package kube

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/kube"
	"github.com/propio/propio-sandbox/internal/kubeapi"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// objects generates the objects of the offline profile for a workspace of
// the test's own, with a command that waits.
func objects(t *testing.T, name string) *generator.KubeObjects {
	t.Helper()
	p, err := profile.Locations{}.Load("offline")
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(t.TempDir(), name)
	if err := os.MkdirAll(ws, 0o755); err != nil {
		t.Fatal(err)
	}
	h := generator.Host{Workspace: ws, Home: t.TempDir(), UID: 1000, GID: 1000, EnvNames: []string{"TERM", "COLORTERM"},
		Passwd: "/accounts/1000-1000.passwd", Group: "/accounts/1000-1000.group"}
	o := generator.Options{Project: name, Command: []string{"sleep", "600"}}
	objs, err := generator.Kubernetes(p, h, o, generator.KubeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The test node has two cores; the Pods of parallel tests share them.
	for _, cs := range [][]generator.KubeContainer{objs.Pod.Spec.InitContainers, objs.Pod.Spec.Containers} {
		for i := range cs {
			cs[i].Resources.Limits["cpu"], cs[i].Resources.Requests["cpu"] = "100m", "100m"
			cs[i].Resources.Limits["memory"], cs[i].Resources.Requests["memory"] = "64Mi", "64Mi"
		}
	}
	return objs
}

// count is how many objects of the sandbox name each kind has.
func count(t *testing.T, c *kubeapi.Client, ns, name string) map[string]int {
	t.Helper()
	return countSelected(t, c, ns, generator.KubeLabelSandbox+"="+name)
}

// countSelected is how many objects the label selector selects in the
// namespace, by kind, those being deleted left out.
func countSelected(t *testing.T, c *kubeapi.Client, ns, selector string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[string]int{}
	for _, k := range []struct{ av, kind string }{{"v1", "Pod"}, {"v1", "Secret"}, {"v1", "ConfigMap"}, {"networking.k8s.io/v1", "NetworkPolicy"}} {
		p, _ := kubeapi.Path(k.av, k.kind, ns)
		raw, err := c.Do(ctx, http.MethodGet, p, map[string][]string{"labelSelector": {selector}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Items []struct {
				Metadata struct {
					DeletionTimestamp string `json:"deletionTimestamp"`
				} `json:"metadata"`
			} `json:"items"`
		}
		if err := json.Unmarshal(raw, &list); err != nil {
			t.Fatal(err)
		}
		for _, it := range list.Items {
			if it.Metadata.DeletionTimestamp == "" {
				out[k.kind]++
			}
		}
	}
	return out
}

// waitGone waits, bounded, until the sandbox has no object left.
func waitGone(t *testing.T, c *kubeapi.Client, ns, name string, limit time.Duration) {
	t.Helper()
	waitSelectedGone(t, c, ns, generator.KubeLabelSandbox+"="+name, limit)
}

// waitSelectedGone waits, bounded, until the label selector selects no
// object in the namespace.
func waitSelectedGone(t *testing.T, c *kubeapi.Client, ns, selector string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		left := countSelected(t, c, ns, selector)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v, %s still selects %v", limit, selector, left)
		}
		time.Sleep(250 * time.Millisecond) // the garbage collector's work
	}
}

// TestKubeCleanupOwned: Create makes the Pod the owner of the Secret, the
// ConfigMap and the NetworkPolicy, so that deleting the Pod alone (by
// anyone: a user, a deadline's end is not a deletion, a node's drain)
// removes them; and Remove, by label, removes everything a killed
// launcher left. The Secret holds the passed variables' values.
func TestKubeCleanupOwned(t *testing.T) {
	c, _ := testenv.Kube(t)
	ns := namespace(t, c)
	cl := kube.New(c, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	objs := objects(t, "owned")
	env := func(n string) (string, bool) { return map[string]string{"TERM": "xterm-owned"}[n], n == "TERM" }
	made, err := cl.Create(ctx, objs, env)
	if err != nil {
		t.Fatal(err)
	}
	if got := count(t, c, ns, "owned"); got["Pod"] != 1 || got["Secret"] != 1 || got["ConfigMap"] != 1 || got["NetworkPolicy"] != 1 {
		t.Fatalf("made %v", got)
	}
	raw, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/secrets/owned-env", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	var secret struct {
		Metadata struct {
			OwnerReferences []struct{ Kind, Name, UID string } `json:"ownerReferences"`
		} `json:"metadata"`
		Data map[string][]byte `json:"data"`
	}
	if err := json.Unmarshal(raw, &secret); err != nil {
		t.Fatal(err)
	}
	if string(secret.Data["TERM"]) != "xterm-owned" {
		t.Errorf("the Secret's TERM is %q", secret.Data["TERM"])
	}
	if _, ok := secret.Data["COLORTERM"]; ok {
		t.Error("a variable the host lacks is in the Secret")
	}
	if len(secret.Metadata.OwnerReferences) != 1 || secret.Metadata.OwnerReferences[0].UID != made.UID {
		t.Errorf("the Secret's owners %+v, want the Pod %s", secret.Metadata.OwnerReferences, made.UID)
	}
	list, err := cl.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "owned" {
		t.Errorf("List: %+v, %v", list, err)
	}

	// The Pod deleted by someone else: the garbage collector takes the rest.
	if _, err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+ns+"/pods/owned", map[string][]string{"gracePeriodSeconds": {"0"}}, nil); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, ns, "owned", time.Minute)

	// A launcher killed after it made some objects, before the Pod: Remove
	// finds them by label.
	objs = objects(t, "killed")
	for _, obj := range []any{objs.Policies[0], *objs.Secret} {
		b, _ := json.Marshal(obj)
		if _, err := c.Create(ctx, ns, b, kubeapi.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := cl.Remove(ctx, "killed"); err != nil {
		t.Fatal(err)
	}
	waitGone(t, c, ns, "killed", 30*time.Second)

	// A Create that fails half-way leaves nothing: the Pod is refused
	// (a container name that is not a DNS label), after the others were made.
	objs = objects(t, "refused")
	objs.Pod.Spec.Containers[0].Name = "Not_A_Label"
	if _, err := cl.Create(ctx, objs, env); err == nil || !strings.Contains(err.Error(), "Not_A_Label") {
		t.Fatalf("a Pod with an invalid container name: %v, want the API server's refusal", err)
	}
	waitGone(t, c, ns, "refused", 30*time.Second)
}

// TestKubePreflight: the admin with the image on the node passes; a
// missing runtime class and a missing image are named; an identity
// without rights in the namespace (a service account's token) is told
// each thing it may not do (exec too for the policy's probe and the
// changeset's keeper).
func TestKubePreflight(t *testing.T) {
	c, file := testenv.Kube(t)
	loadImage(t, agentImage)
	ns := namespace(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	objs := objects(t, "preflight")
	if err := kube.New(c, ns).Preflight(ctx, objs); err != nil {
		t.Fatalf("the admin: %v", err)
	}
	objs.Pod.Spec.RuntimeClassName = "propio-no-such-class"
	objs.Pod.Spec.Containers[0].Image = "propio-sandbox/not-loaded:1"
	err := kube.New(c, ns).Preflight(ctx, objs)
	var pe *kube.PreflightError
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), `runtime class "propio-no-such-class" does not exist`) ||
		!strings.Contains(err.Error(), "no node has the image propio-sandbox/not-loaded:1") {
		t.Errorf("a missing runtime class and image: %v", err)
	}

	// A service account with no Role: its token, in a kubeconfig of its own.
	sa := `{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"nobody"}}`
	if _, err := c.Create(ctx, ns, []byte(sa), kubeapi.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	raw, err := c.Do(ctx, http.MethodPost, "/api/v1/namespaces/"+ns+"/serviceaccounts/nobody/token", nil,
		[]byte(`{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":600}}`))
	if err != nil {
		t.Fatal(err)
	}
	var tr struct {
		Status struct{ Token string } `json:"status"`
	}
	if err := json.Unmarshal(raw, &tr); err != nil || tr.Status.Token == "" {
		t.Fatalf("token request: %v", err)
	}
	cfg, err := kubeapi.LoadConfig(file, "")
	if err != nil {
		t.Fatal(err)
	}
	cfg.TLS = cfg.TLS.Clone()
	cfg.TLS.Certificates = nil
	cfg.Token = tr.Status.Token
	err = kube.New(kubeapi.New(cfg), ns).Preflight(ctx, objects(t, "preflight"))
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "you may not create pods in namespace "+ns) ||
		!strings.Contains(err.Error(), "you may not create pods/attach") {
		t.Errorf("an identity without rights: %v", err)
	}
	if strings.Contains(err.Error(), tr.Status.Token) {
		t.Error("the error shows the token")
	}
	// The policy's hold is probed with an exec (network none), and the
	// changeset's copy out is one in the keeper container; a sandbox with
	// neither needs none.
	if !strings.Contains(err.Error(), "you may not create pods/exec in namespace "+ns) {
		t.Errorf("an identity without rights, for a sandbox whose policy denies egress: %v", err)
	}
	open := objects(t, "preflight")
	open.Policies = nil
	if err := kube.New(kubeapi.New(cfg), ns).Preflight(ctx, open); err == nil || strings.Contains(err.Error(), "pods/exec") {
		t.Errorf("a sandbox with no policy and no keeper: %v, want no exec asked for", err)
	}
	open.Pod.Spec.Containers = append(open.Pod.Spec.Containers, generator.KubeContainer{Name: generator.KubeKeeperContainer, Image: agentImage, ImagePullPolicy: "Never"})
	err = kube.New(kubeapi.New(cfg), ns).Preflight(ctx, open)
	if !errors.As(err, &pe) || !strings.Contains(err.Error(), "you may not create pods/exec in namespace "+ns) {
		t.Errorf("an identity without rights, for a sandbox with a keeper: %v", err)
	}
}
