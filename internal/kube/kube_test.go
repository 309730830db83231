package kube

import "testing"

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
