package generator_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
	"go.yaml.in/yaml/v3"
)

// renderKube renders a case for Kubernetes: the YAML, or the error's text
// as a comment (a case a cluster cannot run is a golden of its own).
func renderKube(t *testing.T, c goldenCase) []byte {
	t.Helper()
	return renderKubeAs(t, c, "")
}

// renderKubeAs renders a case with the Pod carried as as says.
func renderKubeAs(t *testing.T, c goldenCase, as string) []byte {
	t.Helper()
	p, err := c.load()
	if err != nil {
		t.Fatalf("loading: %v", err)
	}
	o := caseOptions(p)
	if o.Keep != nil {
		return nil // a persistent sandbox is not a target of the renderer yet
	}
	objs, err := generator.Kubernetes(p, fixtureHost(t, p), o, generator.KubeOptions{Namespace: "sandboxes", As: as})
	if err != nil {
		return []byte("# error: " + strings.ReplaceAll(err.Error(), "\n", "\n# error: ") + "\n")
	}
	out, err := generator.RenderKubernetes(objs)
	if err != nil {
		t.Fatalf("rendering: %v", err)
	}
	return out
}

// TestKubernetesGolden renders every case for --target kubernetes and
// compares it with testdata/<case>/kubernetes.golden.yaml (go test
// ./generator -update rewrites them).
func TestKubernetesGolden(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			checkKubeGolden(t, c, "", "kubernetes.golden.yaml")
		})
	}
}

// agentSandboxCases are the cases rendered as agent-sandbox objects too,
// into testdata/<case>/kubernetes-<as>.golden.yaml: a policy, a Secret,
// a ConfigMap, a keeper; and one without a policy.
var agentSandboxCases = []string{"builtin-offline", "builtin-open", "kube-changeset"}

// TestKubernetesAgentSandboxGolden renders some cases with --as sandbox
// and --as template and compares them with their goldens.
func TestKubernetesAgentSandboxGolden(t *testing.T) {
	for _, c := range cases(t) {
		if !slices.Contains(agentSandboxCases, c.name) {
			continue
		}
		for _, as := range []string{generator.KubeAsSandbox, generator.KubeAsTemplate} {
			t.Run(c.name+"/"+as, func(t *testing.T) {
				checkKubeGolden(t, c, as, "kubernetes-"+as+".golden.yaml")
			})
		}
	}
}

// checkKubeGolden compares the render of c as as with the golden file
// name in its directory (or writes it, with -update).
func checkKubeGolden(t *testing.T, c goldenCase, as, name string) {
	t.Helper()
	out := renderKubeAs(t, c, as)
	if out == nil {
		t.Skip("a persistent sandbox's case")
	}
	out = bytes.ReplaceAll(out, []byte(repoRoot), []byte("/REPO"))
	golden := filepath.Join(c.dir, name)
	if *update {
		if err := os.WriteFile(golden, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run go test ./generator -update to create it)", err)
	}
	if !bytes.Equal(out, want) {
		t.Errorf("render differs from %s (go test ./generator -update rewrites it):\n%s", golden, diff(string(want), string(out)))
	}
}

// TestKubernetesDeterministic renders each case twice, from two
// generations: the bytes are the same.
func TestKubernetesDeterministic(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, as := range []string{"", generator.KubeAsSandbox, generator.KubeAsTemplate} {
				a, b := renderKubeAs(t, c, as), renderKubeAs(t, c, as)
				if !bytes.Equal(a, b) {
					t.Errorf("as %q: two renders differ:\n%s", as, diff(string(a), string(b)))
				}
			}
		})
	}
}

func loadKube(t *testing.T, name string) (*profile.Profile, generator.Host) {
	t.Helper()
	p, err := profile.Locations{}.Load(name)
	if err != nil {
		t.Fatal(err)
	}
	return p, fixtureHost(t, p)
}

// TestKubernetesOffline checks what the offline profile becomes, object by
// object: the policy that denies both ways, the Pod's security context from
// the profile, tmpfs as memory-backed emptyDirs with their sizes, the
// hidden files as the ConfigMap's empty file, and the passed variables as
// keys of the Secret without a value.
func TestKubernetesOffline(t *testing.T) {
	p, h := loadKube(t, "offline")
	p.Resources.Timeout = profile.Duration(90e9 + 1) // 90 s and a nanosecond: rounded up
	p.Security.Runtime = "runsc"
	objs, err := generator.Kubernetes(p, h, generator.Options{Project: project}, generator.KubeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Policies) != 1 {
		t.Fatalf("network none: %d policies, want 1", len(objs.Policies))
	}
	if cmd := objs.GatewayLogFollow("/bin"); cmd != nil {
		t.Errorf("no gateway, and GatewayLogFollow is %q", cmd)
	}
	pol := objs.Policies[0].Spec
	if !slices.Equal(pol.PolicyTypes, []string{"Ingress", "Egress"}) || len(pol.Ingress) != 0 || len(pol.Egress) != 0 {
		t.Errorf("network none: policy %+v, want Ingress and Egress with no rule", pol)
	}
	if pol.PodSelector.MatchLabels[generator.KubeLabelSandbox] != objs.Pod.Metadata.Labels[generator.KubeLabelSandbox] ||
		objs.Pod.Metadata.Labels[generator.KubeLabelRole] != "sandbox" {
		t.Errorf("the policy selects %v, the pod is labelled %v", pol.PodSelector.MatchLabels, objs.Pod.Metadata.Labels)
	}
	spec := objs.Pod.Spec
	if spec.RuntimeClassName != "runsc" || spec.ActiveDeadlineSeconds == nil || *spec.ActiveDeadlineSeconds != 91 ||
		spec.AutomountServiceAccountToken || spec.EnableServiceLinks || !spec.ShareProcessNamespace || spec.RestartPolicy != "Never" {
		t.Errorf("pod spec %+v", spec)
	}
	if spec.SecurityContext.RunAsUser != 1000 || spec.SecurityContext.RunAsGroup != 1000 || !spec.SecurityContext.RunAsNonRoot {
		t.Errorf("pod security context %+v, want the user 1000:1000 and non-root", spec.SecurityContext)
	}
	c := spec.Containers[0]
	sec := c.SecurityContext
	if !sec.ReadOnlyRootFilesystem || sec.AllowPrivilegeEscalation || sec.Privileged || !slices.Equal(sec.Capabilities.Drop, []string{"ALL"}) {
		t.Errorf("container security context %+v", sec)
	}
	if c.ImagePullPolicy != "Never" || c.Resources.Limits["memory"] != c.Resources.Requests["memory"] {
		t.Errorf("container %s: pull policy %s, resources %+v", c.Name, c.ImagePullPolicy, c.Resources)
	}
	mem := map[string]string{}
	for _, v := range spec.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.Medium == "Memory" {
			mem[v.Name] = v.EmptyDir.SizeLimit
		}
	}
	mounted := map[string]generator.KubeVolumeMount{}
	for _, m := range c.VolumeMounts {
		mounted[m.MountPath] = m
	}
	for _, dir := range []string{"/tmp", profile.HomeDir} {
		m, ok := mounted[dir]
		if !ok || mem[m.Name] != "1073741824" {
			t.Errorf("%s: mount %+v, memory-backed sizes %v", dir, m, mem)
		}
	}
	if m := mounted["/workspace/.env"]; m.Name != generator.KubeFilesVolume || m.SubPath != "empty" || !m.ReadOnly {
		t.Errorf("hidden .env is mounted as %+v, want the ConfigMap's empty file, read-only", m)
	}
	if objs.ConfigMap == nil || objs.ConfigMap.Data["empty"] != "" || !strings.Contains(objs.ConfigMap.Data["passwd"], ":1000:1000:") {
		t.Errorf("configmap %+v", objs.ConfigMap)
	}
	if objs.Secret == nil || !slices.Equal(objs.EnvPassed, []string{"TERM"}) {
		t.Fatalf("secret %+v carries %v, want TERM", objs.Secret, objs.EnvPassed)
	}
	for k, v := range objs.Secret.StringData {
		if v != "" {
			t.Errorf("the rendered Secret holds a value for %s", k)
		}
	}
}

// TestKubernetesReadonlyAndGuard: a readonly path of the workspace and the
// guard's git directory are the workspace volume's paths mounted again, the
// first read-only.
func TestKubernetesReadonlyAndGuard(t *testing.T) {
	p, h := loadKube(t, "offline")
	objs, err := generator.Kubernetes(p, h, generator.Options{Project: project}, generator.KubeOptions{})
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]generator.KubeVolumeMount{}
	for _, m := range objs.Pod.Spec.Containers[0].VolumeMounts {
		if m.Name == generator.KubeWorkspaceVolume {
			found[m.SubPath] = m
		}
	}
	if m, ok := found[".propio"]; !ok || !m.ReadOnly || m.MountPath != "/workspace/.propio" {
		t.Errorf("readonly .propio: %+v (workspace mounts %v)", m, found)
	}
	if _, ok := found[".git"]; !ok {
		t.Errorf("the guard's .git is not mounted again (workspace mounts %v)", found)
	}
}

// TestKubernetesOpen: no policy, and the profile's values inline with
// Kubernetes' $(VAR) expansion escaped.
func TestKubernetesOpen(t *testing.T) {
	p, h := loadKube(t, "open")
	p.Env.Set = map[string]string{"PRICE": "$(HOME) $5"}
	objs, err := generator.Kubernetes(p, h, generator.Options{Project: project, Command: []string{"echo", "$(HOME)"}}, generator.KubeOptions{Namespace: "ns1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Policies) != 0 {
		t.Errorf("network open: policies %+v, want none", objs.Policies)
	}
	c := objs.Pod.Spec.Containers[0]
	if !slices.Equal(c.Args, []string{"echo", "$$(HOME)"}) {
		t.Errorf("args %q, want $ escaped", c.Args)
	}
	for _, e := range c.Env {
		if e.Name == "PRICE" && (e.Value == nil || *e.Value != "$$(HOME) $$5") {
			t.Errorf("PRICE = %v, want $ escaped", e.Value)
		}
	}
	for _, obj := range objs.List() {
		out, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), "namespace: ns1") {
			t.Errorf("object without the namespace:\n%s", out)
		}
	}
}

// TestKubernetesRefuses: what a cluster cannot give is an error at its
// place in the profile.
func TestKubernetesRefuses(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"strict", "secrets.ANTHROPIC_API_KEY: a secret given to the sandbox is brokered by its gateway"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, h := loadKube(t, tc.name)
			_, err := generator.Kubernetes(p, h, generator.Options{Project: project}, generator.KubeOptions{})
			var list profile.List
			if !errors.As(err, &list) || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "builtin:"+tc.name+":") {
				t.Errorf("error %v, want a positioned %q", err, tc.want)
			}
		})
	}
	p, h := loadKube(t, "open")
	h.SSHAgent = generator.SSHAgent{Source: "/run/agent.sock"}
	h.ExtraMounts = []generator.ExtraMount{{Source: "/data", Target: "/data"}}
	p.Mounts = []profile.Mount{{Source: "/srv", Target: "/srv"}}
	_, err := generator.Kubernetes(p, h, generator.Options{Project: project}, generator.KubeOptions{})
	for _, want := range []string{"mounts[0]", "ssh_agent", "PROPIO_SANDBOX_MOUNTS"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to name %s", err, want)
		}
	}
}

func TestKubeName(t *testing.T) {
	for in, want := range map[string]string{
		"propio-my_app":                     "propio-my-app",
		"propio-x-2":                        "propio-x-2",
		"propio-" + strings.Repeat("a", 80): "propio-" + strings.Repeat("a", 50),
		"___":                               "propio",
	} {
		if got := generator.KubeName(in); got != want {
			t.Errorf("KubeName(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestKubernetesAgentSandbox: for every case a cluster can run, the
// Sandbox's (and the SandboxTemplate's) pod template is the bare Pod's
// labels, annotations and spec, every isolation field included; the
// claim names the template; no bare Pod is listed beside them.
func TestKubernetesAgentSandbox(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p, err := c.load()
			if err != nil {
				t.Fatal(err)
			}
			o := caseOptions(p)
			if o.Keep != nil {
				t.Skip("a persistent sandbox's case")
			}
			bare, err := generator.Kubernetes(p, fixtureHost(t, p), o, generator.KubeOptions{})
			if err != nil {
				t.Skipf("not a cluster's case: %v", err)
			}
			for _, tc := range []struct{ as, kind, apiVersion string }{
				{generator.KubeAsSandbox, "Sandbox", "agents.x-k8s.io/v1alpha1"},
				{generator.KubeAsTemplate, "SandboxTemplate", "extensions.agents.x-k8s.io/v1alpha1"},
			} {
				objs, err := generator.Kubernetes(p, fixtureHost(t, p), o, generator.KubeOptions{As: tc.as})
				if err != nil {
					t.Fatalf("as %s: %v", tc.as, err)
				}
				sb := objs.Sandbox
				if sb == nil || sb.Kind != tc.kind || sb.APIVersion != tc.apiVersion || sb.Metadata.Name != bare.Pod.Metadata.Name {
					t.Fatalf("as %s: %+v, want a %s %s named %s", tc.as, sb, tc.apiVersion, tc.kind, bare.Pod.Metadata.Name)
				}
				tmpl := sb.Spec.PodTemplate
				if !reflect.DeepEqual(tmpl.Spec, bare.Pod.Spec) {
					t.Errorf("as %s: the pod template's spec differs from the Pod's:\n%+v\n%+v", tc.as, tmpl.Spec, bare.Pod.Spec)
				}
				if !reflect.DeepEqual(tmpl.Metadata.Labels, bare.Pod.Metadata.Labels) || !reflect.DeepEqual(tmpl.Metadata.Annotations, bare.Pod.Metadata.Annotations) {
					t.Errorf("as %s: the pod template's metadata %+v, want the Pod's %+v", tc.as, tmpl.Metadata, bare.Pod.Metadata)
				}
				for _, pol := range objs.Policies {
					labels := tmpl.Metadata.Labels
					if pol.Spec.PodSelector.MatchLabels[generator.KubeLabelRole] == "gateway" {
						labels = objs.Gateway.Metadata.Labels // the gateway is a bare Pod still
					}
					for k, v := range pol.Spec.PodSelector.MatchLabels {
						if labels[k] != v {
							t.Errorf("as %s: policy %s selects %s=%s, which the pod template lacks", tc.as, pol.Metadata.Name, k, v)
						}
					}
				}
				list := objs.List()
				for _, obj := range list {
					if pod, ok := obj.(*generator.KubePod); ok && pod != objs.Gateway {
						t.Errorf("as %s: a bare Pod is listed", tc.as)
					}
				}
				if tc.as == generator.KubeAsTemplate {
					if objs.Claim == nil || objs.Claim.Spec.TemplateRef.Name != sb.Metadata.Name || list[len(list)-1] != any(objs.Claim) {
						t.Errorf("as template: claim %+v, want the last object, naming template %s", objs.Claim, sb.Metadata.Name)
					}
				} else if objs.Claim != nil || list[len(list)-1] != any(sb) {
					t.Errorf("as sandbox: a claim %+v, or the Sandbox is not last", objs.Claim)
				}
			}
		})
	}
}

// TestKubernetesAsUnknown: an unknown carrier is an error naming the
// choices.
func TestKubernetesAsUnknown(t *testing.T) {
	p, h := loadKube(t, "offline")
	_, err := generator.Kubernetes(p, h, generator.Options{Project: project}, generator.KubeOptions{As: "deployment"})
	if err == nil || !strings.Contains(err.Error(), `"deployment"`) || !strings.Contains(err.Error(), "sandbox") {
		t.Errorf("as deployment: %v, want an error naming the choices", err)
	}
}

// TestKubernetesAllowlist: the allowlist's gateway is a Pod of its own
// listening on its Pod's address; the sandbox's resolver and proxy
// variables name the address run gives (the placeholder without one),
// never the compose project's; the sandbox may reach its gateway alone,
// and the gateway is reached by the sandbox alone.
func TestKubernetesAllowlist(t *testing.T) {
	p, err := profile.Locations{}.LoadFile("testdata/allowlist/profile.yaml")
	if err != nil {
		t.Fatal(err)
	}
	h := fixtureHost(t, p)
	addr := netip.MustParseAddr("10.244.0.99")
	for _, tc := range []struct {
		given netip.Addr
		want  string
		set   bool // SetGatewayAddress(addr) on the render's objects
	}{{addr, "10.244.0.99", false}, {netip.Addr{}, generator.KubeGatewayPlaceholder.String(), false}, {netip.Addr{}, "10.244.0.99", true}} {
		objs, err := generator.Kubernetes(p, h, generator.Options{Project: project}, generator.KubeOptions{GatewayAddress: tc.given})
		if err != nil {
			t.Fatal(err)
		}
		if tc.set {
			before, err := json.Marshal(objs.Pod)
			if err != nil {
				t.Fatal(err)
			}
			copied := *objs
			copied.SetGatewayAddress(addr)
			if after, _ := json.Marshal(objs.Pod); !bytes.Equal(before, after) {
				t.Errorf("SetGatewayAddress changed the objects it was copied from")
			}
			objs = &copied
		}
		if objs.Gateway == nil || objs.GatewayPlaceholder != (!tc.given.IsValid() && !tc.set) || objs.GatewayAddress.String() != tc.want {
			t.Fatalf("gateway %+v, placeholder %v", objs.Gateway, objs.GatewayPlaceholder)
		}
		raw, err := json.Marshal(objs.List())
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(raw, []byte("198.1")) {
			t.Errorf("the objects name the compose project's gateway address: %s", raw)
		}
		spec := objs.Pod.Spec
		if spec.DNSPolicy != "None" || spec.DNSConfig == nil || !slices.Equal(spec.DNSConfig.Nameservers, []string{tc.want}) {
			t.Errorf("sandbox resolver %q %+v, want None and %s", spec.DNSPolicy, spec.DNSConfig, tc.want)
		}
		proxies := 0
		for _, e := range spec.Containers[0].Env {
			if strings.HasSuffix(strings.ToUpper(e.Name), "_PROXY") && e.Name != "NO_PROXY" && e.Name != "no_proxy" {
				proxies++
				if e.Value == nil || !strings.Contains(*e.Value, "://"+tc.want+":") {
					t.Errorf("%s=%v, want the gateway at %s", e.Name, e.Value, tc.want)
				}
			}
		}
		if proxies != 6 {
			t.Errorf("%d proxy variables, want 6", proxies)
		}
		gw := objs.Gateway.Spec
		args := strings.Join(gw.Containers[0].Args, " ")
		if !strings.Contains(args, "--address $(PROPIO_GATEWAY_ADDRESS) ") || gw.Containers[0].Env[0].ValueFrom.FieldRef.FieldPath != "status.podIP" {
			t.Errorf("gateway args %q, env %+v: want it on its Pod's address", args, gw.Containers[0].Env)
		}
		sec := gw.Containers[0].SecurityContext
		if !sec.ReadOnlyRootFilesystem || sec.AllowPrivilegeEscalation || !slices.Equal(sec.Capabilities.Drop, []string{"ALL"}) || len(sec.Capabilities.Add) != 0 || gw.AutomountServiceAccountToken {
			t.Errorf("gateway security %+v, token %v", sec, gw.AutomountServiceAccountToken)
		}
		if got, want := objs.GatewayLogFollow("/bin"), []string{"/bin", "gateway-log", "/log/" + project + ".jsonl"}; !slices.Equal(got, want) {
			t.Errorf("GatewayLogFollow is %q, want %q", got, want)
		}
		roles := map[string]generator.KubeNetworkPolicySpec{}
		for _, pol := range objs.Policies {
			roles[pol.Spec.PodSelector.MatchLabels[generator.KubeLabelRole]] = pol.Spec
		}
		sb, g := roles["sandbox"], roles["gateway"]
		if len(sb.Ingress) != 0 || len(sb.Egress) != 1 || len(sb.Egress[0].To) != 1 || sb.Egress[0].To[0].PodSelector.MatchLabels[generator.KubeLabelRole] != "gateway" {
			t.Errorf("sandbox policy %+v, want no ingress and egress to the gateway alone", sb)
		}
		if len(g.Ingress) != 1 || len(g.Ingress[0].From) != 1 || g.Ingress[0].From[0].PodSelector.MatchLabels[generator.KubeLabelRole] != "sandbox" {
			t.Errorf("gateway policy %+v, want ingress from the sandbox alone", g)
		}
	}
}
