package kube

import (
	"testing"

	"github.com/propio/propio-sandbox/generator"
)

func TestNormalizeImage(t *testing.T) {
	for in, want := range map[string]string{
		"propio-sandbox/agent:latest":   "docker.io/propio-sandbox/agent:latest",
		"propio-sandbox/agent":          "docker.io/propio-sandbox/agent:latest",
		"debian:bookworm-slim":          "docker.io/library/debian:bookworm-slim",
		"propio.test/pause:1":           "propio.test/pause:1",
		"localhost:5000/x/y":            "localhost:5000/x/y:latest",
		"localhost/x:2":                 "localhost/x:2",
		"docker.io/library/debian:12":   "docker.io/library/debian:12",
		"ghcr.io/a/b@sha256:0123abcdef": "ghcr.io/a/b@sha256:0123abcdef",
	} {
		if got := normalizeImage(in); got != want {
			t.Errorf("normalizeImage(%q) = %q, want %q", in, got, want)
		}
	}
}

// Stamp names the launcher on every object, and leaves the objects it was
// given (the generator's, which render shows) as they were.
func TestStamp(t *testing.T) {
	ann := map[string]string{generator.KubeAnnProfile: "builtin:offline"}
	objs := &generator.KubeObjects{
		Secret:    &generator.KubeSecret{Metadata: generator.KubeMeta{Name: "s"}},
		ConfigMap: &generator.KubeConfigMap{Metadata: generator.KubeMeta{Name: "c"}},
		Policies:  []generator.KubeNetworkPolicy{{Metadata: generator.KubeMeta{Name: "p"}}},
		Pod:       generator.KubePod{Metadata: generator.KubeMeta{Name: "pod", Annotations: ann}},
	}
	orig := *objs
	Stamp(objs, 4242, "host.test")
	for _, m := range []generator.KubeMeta{objs.Secret.Metadata, objs.ConfigMap.Metadata, objs.Policies[0].Metadata, objs.Pod.Metadata} {
		if m.Annotations[AnnLauncherPID] != "4242" || m.Annotations[AnnLauncherHost] != "host.test" {
			t.Errorf("%s: annotations %v, want the launcher's", m.Name, m.Annotations)
		}
	}
	if objs.Pod.Metadata.Annotations[generator.KubeAnnProfile] != "builtin:offline" {
		t.Errorf("the pod lost its annotations: %v", objs.Pod.Metadata.Annotations)
	}
	if len(ann) != 1 || orig.Secret.Metadata.Annotations != nil || orig.Policies[0].Metadata.Annotations != nil {
		t.Errorf("Stamp changed the objects it was given: %v, %v, %v", ann, orig.Secret.Metadata, orig.Policies[0].Metadata)
	}
}

// TestDenied: the policy's hold is probed for a sandbox kept from the API
// server's Service: all egress denied, or egress only to Pods (its
// gateway); not for a rule that allows any, nor for the gateway's own
// policy.
func TestDenied(t *testing.T) {
	sel := func(role string) generator.KubeSelector {
		return generator.KubeSelector{MatchLabels: map[string]string{generator.KubeLabelRole: role}}
	}
	pol := func(role string, egress ...generator.KubePolicyRule) generator.KubeNetworkPolicy {
		return generator.KubeNetworkPolicy{Spec: generator.KubeNetworkPolicySpec{PodSelector: sel(role), PolicyTypes: []string{"Ingress", "Egress"}, Egress: egress}}
	}
	toGateway := generator.KubePolicyRule{To: []generator.KubePolicyPeer{{PodSelector: sel("gateway")}}}
	for _, tc := range []struct {
		name     string
		policies []generator.KubeNetworkPolicy
		want     bool
	}{
		{"open", nil, false},
		{"none", []generator.KubeNetworkPolicy{pol("sandbox")}, true},
		{"allowlist", []generator.KubeNetworkPolicy{pol("sandbox", toGateway), pol("gateway", generator.KubePolicyRule{})}, true},
		{"any egress", []generator.KubeNetworkPolicy{pol("sandbox", generator.KubePolicyRule{})}, false},
		{"the gateway's alone", []generator.KubeNetworkPolicy{pol("gateway")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := denied(&generator.KubeObjects{Policies: tc.policies}); got != tc.want {
				t.Errorf("denied: %v, want %v", got, tc.want)
			}
		})
	}
}
