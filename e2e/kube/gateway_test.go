package kube

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/gatewayimage"
	"github.com/propio/propio-sandbox/internal/kube"
	"github.com/propio/propio-sandbox/internal/kubeapi"
	"github.com/propio/propio-sandbox/internal/testenv"
)

// removePod deletes a test's Pod at once when the test ends.
func removePod(t *testing.T, c *kubeapi.Client, ns, name string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		q := url.Values{"gracePeriodSeconds": {"0"}}
		if _, err := c.Do(ctx, http.MethodDelete, "/api/v1/namespaces/"+ns+"/pods/"+name, q, nil); err != nil && !kubeapi.IsNotFound(err) {
			t.Errorf("removing pod %s: %v", name, err)
		}
	})
}

// runningIP waits (bounded) until the Pod runs and has an address.
func runningIP(t *testing.T, c *kubeapi.Client, ns, name string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		raw, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+name, nil, nil)
		var pod struct {
			Status struct {
				Phase string `json:"phase"`
				PodIP string `json:"podIP"`
			} `json:"status"`
		}
		if err == nil && json.Unmarshal(raw, &pod) == nil && pod.Status.Phase == "Running" && pod.Status.PodIP != "" {
			return pod.Status.PodIP
		}
		if ctx.Err() != nil || pod.Status.Phase == "Failed" || pod.Status.Phase == "Succeeded" {
			t.Fatalf("pod %s does not run with an address: %v %s", name, err, raw)
		}
		time.Sleep(300 * time.Millisecond) // the kubelet's progress, not an event here
	}
}

// internet starts the test's internet: a server Pod in namespace ns
// (python's http.server on 8080, listing /etc), and returns its address.
func internet(t *testing.T, c *kubeapi.Client, ns string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	server := fmt.Sprintf(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"internet","labels":{"propio-test":"internet"}},
"spec":{"automountServiceAccountToken":false,"restartPolicy":"Never","securityContext":{"runAsUser":65534,"runAsGroup":65534},
"containers":[{"name":"http","image":%q,"imagePullPolicy":"Never","command":["python3","-m","http.server","8080","--directory","/etc"]}]}}`, agentImage)
	if _, err := c.Create(ctx, ns, []byte(server), kubeapi.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	removePod(t, c, ns, "internet")
	return runningIP(t, c, ns, "internet")
}

// allowProfile writes the allowlist profile of the gateway tests.
func allowProfile(t *testing.T) string {
	t.Helper()
	prof := filepath.Join(t.TempDir(), "allow.yaml")
	if err := os.WriteFile(prof, []byte("version: 1\nextends: offline\nnetwork: {mode: allowlist, allow: [\"allowed.test:8080\"], deny: [denied.test]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return prof
}

// internetAliases are the test's internet's names, which the gateway's Pod
// alone is given.
func internetAliases(serverIP string) []generator.KubeHostAlias {
	return []generator.KubeHostAlias{{IP: serverIP, Hostnames: []string{"allowed.test", "denied.test"}}}
}

// gatewayAttack is what the sandbox tries behind its gateway, the server
// of the test's internet at serverIP; it exits 7.
func gatewayAttack(serverIP string) string {
	return `curl -s -m 10 http://allowed.test:8080/ | grep -q 'Directory listing' && echo proxy-reached || echo proxy-failed
curl -s -m 10 --noproxy '*' http://allowed.test:8080/ | grep -q 'Directory listing' && echo byname-reached || echo byname-failed
curl -s -m 10 -o /dev/null -w 'denied:%{http_code}\n' http://denied.test:8080/
timeout 5 bash -c 'exec 3<>/dev/tcp/` + serverIP + `/8080' 2>/dev/null && echo server-open || echo server-denied
timeout 5 bash -c 'exec 3<>/dev/tcp/10.96.0.1/443' 2>/dev/null && echo api-open || echo api-denied
timeout 5 bash -c 'exec 3<>/dev/tcp/10.96.0.10/53' 2>/dev/null && echo dns-open || echo dns-denied
timeout 10 getent hosts kubernetes.default.svc.cluster.local >/dev/null && echo name-open || echo name-denied
exit 7`
}

// checkGatewayAttack checks what the sandbox said of gatewayAttack.
func checkGatewayAttack(t *testing.T, got string) {
	t.Helper()
	for _, want := range []string{"proxy-reached", "byname-reached", "denied:403", "server-denied", "api-denied", "dns-denied", "name-denied"} {
		if !strings.Contains(got, want+"\n") {
			t.Errorf("the sandbox did not say %q", want)
		}
	}
}

// gatewayWorld is what every allowlist test on the cluster starts with:
// the cluster, the launcher, the sandbox's image and the gateway's (the
// launcher's, built into Docker when missing) loaded into the node, the
// test's namespace, and the test's internet (internet) at serverIP.
type gatewayWorld struct {
	c                        *kubeapi.Client
	kubeconfig, launcher, ns string
	gwImage, serverIP        string
}

// newGatewayWorld makes a gatewayWorld.
func newGatewayWorld(t *testing.T) gatewayWorld {
	t.Helper()
	c, kubeconfig := testenv.Kube(t)
	launcher := testenv.Launcher(t)
	loadImage(t, agentImage)
	gwImage := testenv.GatewayImage(t, launcher)
	loadImage(t, gwImage)
	ns := namespace(t, c)
	return gatewayWorld{c: c, kubeconfig: kubeconfig, launcher: launcher, ns: ns, gwImage: gwImage, serverIP: internet(t, c, ns)}
}

// TestKubeRenderedGateway creates the objects render prints for an
// allowlist (the address of the gateway's Pod put where render shows
// its placeholder, as run is to do) and attacks from inside the sandbox.
// The test's internet is a server Pod of its own, which the gateway
// alone knows by the names allowed.test and denied.test (host aliases
// the test gives the gateway's Pod). Through the proxy, and by name
// without it (the gateway's resolver, its user-space relay), the
// sandbox reaches allowed.test:8080; denied.test is refused by the
// gateway; the server's own address, the API server's Service, the
// cluster's DNS Service and its names are out of reach (the
// NetworkPolicy: the sandbox reaches its gateway alone).
func TestKubeRenderedGateway(t *testing.T) {
	w := newGatewayWorld(t)
	c, launcher, gwImage, ns, serverIP := w.c, w.launcher, w.gwImage, w.ns, w.serverIP
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	ws := workspace(t)
	prof := allowProfile(t)
	attack := gatewayAttack(serverIP)
	cmd := exec.Command(launcher, "render", "--target", "kubernetes", "-p", prof, "-n", ns, "--", "bash", "-c", attack)
	cmd.Dir = ws
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render: %v\n%s", err, stderr.String())
	}
	placeholder := []byte(generator.KubeGatewayPlaceholder.String())
	var sandboxDoc []byte
	var pod, gateway string
	for _, doc := range documents(t, out) {
		var head kubeapi.Object
		if err := json.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		if head.Kind == "Pod" && strings.HasSuffix(head.Metadata.Name, "-gateway") {
			gateway = head.Metadata.Name
			var obj map[string]any
			if err := json.Unmarshal(doc, &obj); err != nil {
				t.Fatal(err)
			}
			spec := obj["spec"].(map[string]any)
			if img := spec["containers"].([]any)[0].(map[string]any)["image"]; img != gwImage {
				t.Errorf("the gateway's image is %v, want the launcher's %s", img, gwImage)
			}
			// The test's internet, by name, for the gateway alone.
			spec["hostAliases"] = internetAliases(serverIP)
			if doc, err = json.Marshal(obj); err != nil {
				t.Fatal(err)
			}
			removePod(t, c, ns, gateway)
		}
		if head.Kind == "Pod" && head.Metadata.Name != gateway {
			pod, sandboxDoc = head.Metadata.Name, doc // created once the gateway has an address
			continue
		}
		if _, err := c.Create(ctx, "", doc, kubeapi.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if gateway == "" || pod == "" || !bytes.Contains(sandboxDoc, placeholder) {
		t.Fatalf("render gave gateway %q and sandbox %q (naming the placeholder: %v)", gateway, pod, bytes.Contains(sandboxDoc, placeholder))
	}
	gwIP := runningIP(t, c, ns, gateway)
	gatewayLog := func() string {
		logs, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+gateway+"/log", url.Values{"container": {"gateway"}}, nil)
		if err != nil {
			return err.Error()
		}
		return string(logs)
	}
	// What run is to do: the gateway Pod's address in place of the placeholder.
	sandboxDoc = bytes.ReplaceAll(sandboxDoc, placeholder, []byte(gwIP))
	if _, err := c.Create(ctx, "", sandboxDoc, kubeapi.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	removePod(t, c, ns, pod)
	waitPod(t, c, ns, pod, 2*time.Minute, func(s podState) bool {
		return len(s.Status.InitContainerStatuses) == 1 && s.Status.InitContainerStatuses[0].State.Running != nil
	})
	if err := c.Attach(ctx, ns, pod, kubeapi.StreamOptions{Container: "workspace-copy", Stdin: true, Stdout: true, Stderr: true},
		bytes.NewReader(workspaceTar(t, ws)), io.Discard, os.Stderr); err != nil {
		t.Fatalf("copying the workspace in: %v", err)
	}
	final := waitPod(t, c, ns, pod, 3*time.Minute, func(s podState) bool {
		return s.Status.Phase == "Succeeded" || s.Status.Phase == "Failed"
	})
	if term := final.Status.ContainerStatuses[0].State.Terminated; term == nil || term.ExitCode != 7 {
		t.Errorf("the sandbox's exit: %+v, want code 7", term)
	}
	logs, err := c.Do(ctx, http.MethodGet, "/api/v1/namespaces/"+ns+"/pods/"+pod+"/log", url.Values{"container": {"sandbox"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := string(logs)
	t.Logf("the sandbox said:\n%s", got)
	checkGatewayAttack(t, got)
	if t.Failed() {
		t.Logf("the gateway said:\n%s", gatewayLog())
	}
}

// TestKubeRunAllowlist runs an allowlist's sandbox with kube.Run: its
// gateway's Pod first, the sandbox's naming the gateway's address once it
// has one, the policy's hold probed before the command starts. The same
// attacks as TestKubeRenderedGateway's hold, the exit code comes back,
// the gateway's decision log comes out of its Pod (GatewayLog) with the
// allowed and the denied name, and nothing is left, the gateway's Pod
// included.
func TestKubeRunAllowlist(t *testing.T) {
	w := newGatewayWorld(t)
	c, gwImage, ns, serverIP := w.c, w.gwImage, w.ns, w.serverIP
	cl := kube.New(c, ns)

	dir := filepath.Join(t.TempDir(), "kubeallow")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	objs := runObjects(t, allowProfile(t), dir, "bash", "-c", gatewayAttack(serverIP))
	if objs.Gateway == nil || !objs.GatewayPlaceholder {
		t.Fatalf("no gateway, or one named by its address already: %+v", objs.Gateway)
	}
	objs.Gateway.Spec.Containers[0].Image = gwImage
	objs.Gateway.Spec.HostAliases = internetAliases(serverIP)
	var out, log bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	var first time.Duration
	code, err := cl.Run(ctx, kube.RunSpec{
		Objects:          objs,
		Env:              func(string) (string, bool) { return "", false },
		Workspace:        bytes.NewReader(workspaceTar(t, dir)),
		Streams:          kube.Streams{Out: &out},
		Started:          func() { first = time.Since(start) },
		Warn:             func(w string) { t.Errorf("run warned: %s", w) },
		GatewayLog:       &log,
		GatewayLogFollow: objs.GatewayLogFollow(gatewayimage.Binary),
	})
	if err != nil {
		t.Fatalf("run: %v\noutput:\n%s", err, out.String())
	}
	t.Logf("from Run to the sandbox running (its gateway first): %v; the sandbox said:\n%s", first, out.String())
	if code != 7 {
		t.Errorf("exit code %d, want 7", code)
	}
	checkGatewayAttack(t, out.String())
	// The gateway's log came out of its Pod, whole, before the Pod went.
	var entries []decisionlog.Entry
	if err := decisionlog.NewWriter(io.Discard).CopyFrom(bytes.NewReader(log.Bytes())); err != nil || !bytes.HasSuffix(log.Bytes(), []byte("\n")) {
		t.Errorf("the gateway's log that came out is not whole entries: %v\n%s", err, log.String())
	}
	for _, line := range bytes.Split(bytes.TrimSpace(log.Bytes()), []byte("\n")) {
		var e decisionlog.Entry
		if json.Unmarshal(line, &e) == nil {
			entries = append(entries, e)
		}
	}
	if !decided(entries, "allowed.test", true) || !decided(entries, "denied.test", false) {
		t.Errorf("the gateway's log that came out lacks allowed.test allowed or denied.test denied:\n%s", log.String())
	}
	waitGone(t, c, ns, objs.Pod.Metadata.Name, 30*time.Second)
}

// allowlistLaunch is what a test of `run --engine kubernetes` with an
// allowlist has: a gatewayWorld whose internet (the server Pod at
// serverIP) is behind the Service "internet" of the namespace (whose
// name the gateway resolves by the cluster's DNS: a name of the test
// cluster's own), and a profile (prof) that allows that name (allowed)
// on 8080 and denies the API server's name (deniedName).
type allowlistLaunch struct {
	gatewayWorld
	prof, allowed string
}

// deniedName is the name the allowlist launches' profile denies.
const deniedName = "kubernetes.default.svc.cluster.local"

// newAllowlistLaunch makes an allowlistLaunch: a gatewayWorld, the
// Service, the profile.
func newAllowlistLaunch(t *testing.T) *allowlistLaunch {
	t.Helper()
	w := newGatewayWorld(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	svc := `{"apiVersion":"v1","kind":"Service","metadata":{"name":"internet"},"spec":{"selector":{"propio-test":"internet"},"ports":[{"port":8080,"targetPort":8080}]}}`
	if _, err := w.c.Create(ctx, w.ns, []byte(svc), kubeapi.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	allowed := "internet." + w.ns + ".svc.cluster.local"
	prof := smallProfile(t, "offline", fmt.Sprintf("network: {mode: allowlist, allow: [%q], deny: [%s]}\n", allowed+":8080", deniedName))
	return &allowlistLaunch{gatewayWorld: w, prof: prof, allowed: allowed}
}

// run is the launcher's `run --engine kubernetes` of the profile in the
// namespace, with the directories of home, running bash -c script.
func (a *allowlistLaunch) run(t *testing.T, ws, home, script string) *exec.Cmd {
	t.Helper()
	return launcherIn(t, a.kubeconfig, ws, home, "run", "--engine", "kubernetes", "-n", a.ns, "-p", a.prof, "--", "bash", "-c", script)
}

// TestKubeLaunchAllowlist runs `propio-sandbox run --engine kubernetes`
// with an allowlist (allowlistLaunch): the launcher makes the gateway's
// Pod (its own image, loaded into the node) and the sandbox's behind it.
// From inside: the allowed name answers through the proxy and by name,
// the API server's name is denied by a deny rule, the server's address
// and the API server's Service are out of reach; exit 7, nothing left.
func TestKubeLaunchAllowlist(t *testing.T) {
	a := newAllowlistLaunch(t)
	ws := kubeWorkspace(t, "kubeallow")
	attack := `curl -s -m 10 http://` + a.allowed + `:8080/ | grep -q 'Directory listing' && echo proxy-reached || echo proxy-failed
curl -s -m 10 --noproxy '*' http://` + a.allowed + `:8080/ | grep -q 'Directory listing' && echo byname-reached || echo byname-failed
curl -s -m 10 -o /dev/null -w 'denied:%{http_code}\n' http://` + deniedName + `:443/
timeout 5 bash -c 'exec 3<>/dev/tcp/` + a.serverIP + `/8080' 2>/dev/null && echo server-open || echo server-denied
timeout 5 bash -c 'exec 3<>/dev/tcp/10.96.0.1/443' 2>/dev/null && echo api-open || echo api-denied
exit 7`
	cmd := a.run(t, ws, t.TempDir(), attack)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := runBounded(t, cmd, 3*time.Minute)
	t.Logf("the sandbox said:\n%s", stdout.String())
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 7 {
		t.Fatalf("run: %v, want exit status 7\nstderr:\n%s", err, stderr.String())
	}
	for _, want := range []string{"proxy-reached", "byname-reached", "denied:403", "server-denied", "api-denied"} {
		if !strings.Contains(stdout.String(), want+"\n") {
			t.Errorf("the sandbox did not say %q\nstderr:\n%s", want, stderr.String())
		}
	}
	waitSelectedGone(t, a.c, a.ns, managed, 30*time.Second)
}
