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
