package grants

import (
	"errors"
	"strings"
	"testing"
)

func TestPatchProfile(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		list, rule, in, want string
	}{
		"after the last item, keeping comments": {
			"allow", "pypi.org:443",
			"# mine\nnetwork:\n  mode: allowlist   # the gateway\n  allow:\n    - openrouter.ai  # the model\n    # more below\n  deny:\n    - evil.test\n",
			"# mine\nnetwork:\n  mode: allowlist   # the gateway\n  allow:\n    - openrouter.ai  # the model\n    - pypi.org:443\n    # more below\n  deny:\n    - evil.test\n",
		},
		"quoted like the last item": {
			"allow", "pypi.org",
			"network:\n    allow:\n    - \"a.test\"\n",
			"network:\n    allow:\n    - \"a.test\"\n    - \"pypi.org\"\n",
		},
		"a wildcard is quoted": {
			"allow", "*.example.test",
			"network:\n  allow:\n    - a.test\n",
			"network:\n  allow:\n    - a.test\n    - \"*.example.test\"\n",
		},
		"in a list on one line": {
			"allow", "pypi.org",
			"network:\n  allow: [a.test, \"b.test:22\"]  # two\nenv: {}\n",
			"network:\n  allow: [a.test, \"b.test:22\", \"pypi.org\"]  # two\nenv: {}\n",
		},
		"in an empty list": {
			"allow", "pypi.org",
			"network:\n  allow: []\n",
			"network:\n  allow: [pypi.org]\n",
		},
		"no allow list: after network's last field": {
			"allow", "pypi.org",
			"extends: strict\nnetwork:\n   mode: allowlist\n   join:\n     - models\n\n# the end\ncommand: [bash]\n",
			"extends: strict\nnetwork:\n   mode: allowlist\n   join:\n     - models\n   allow:\n      - pypi.org\n\n# the end\ncommand: [bash]\n",
		},
		"an empty allow": {
			"allow", "pypi.org",
			"network:\n  allow:\n  mode: allowlist\n",
			"network:\n  allow:\n    - pypi.org\n  mode: allowlist\n",
		},
		"no network section: at the end": {
			"allow", "pypi.org",
			"extends: strict\ncommand: [bash]",
			"extends: strict\ncommand: [bash]\nnetwork:\n  allow:\n    - pypi.org\n",
		},
		"the file's own indentation": {
			"deny", "evil.test",
			"workspace:\n    readonly: [a]\nnetwork:\n    mode: allowlist\n",
			"workspace:\n    readonly: [a]\nnetwork:\n    mode: allowlist\n    deny:\n        - evil.test\n",
		},
		"an empty network": {
			"allow", "pypi.org",
			"network:\ncommand: [bash]\n",
			"network:\n  allow:\n    - pypi.org\ncommand: [bash]\n",
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, err := PatchProfile("p.yaml", []byte(tt.in), tt.list, tt.rule)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tt.want {
				t.Fatalf("patched:\n%s\nwant:\n%s", got, tt.want)
			}
		})
	}
}

func TestPatchProfileRefuses(t *testing.T) {
	t.Parallel()
	for name, tt := range map[string]struct{ in, want string }{
		"there already":  {"network:\n  allow:\n    - pypi.org\n", "p.yaml:3:7: network.allow: \"pypi.org\": the rule is there already"},
		"flow network":   {"network: {mode: allowlist}\n", "p.yaml:1:1: network is not written as a block"},
		"not a list":     {"network:\n  allow: pypi.org\n", "p.yaml:2:10: network.allow is not a list"},
		"several lines":  {"network:\n  allow: [a.test,\n    b.test]\n", "p.yaml:2:3: network.allow is written over several lines"},
		"two on a line":  {"network:\n  allow:\n    - {a: b}\n", "would not"},
		"not a mapping":  {"- a\n", "p.yaml: not a profile"},
		"null written ~": {"network: ~\n", "would not parse"},
		"broken":         {"network: [\n", "p.yaml: yaml:"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := PatchProfile("p.yaml", []byte(tt.in), "allow", "pypi.org")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("PatchProfile = %v, want %q", err, tt.want)
			}
		})
	}
	_, err := PatchProfile("p.yaml", []byte("network:\n  allow: [pypi.org]\n"), "allow", "pypi.org")
	if !errors.Is(err, ErrAlreadyThere) {
		t.Fatalf("PatchProfile of a rule there = %v, want ErrAlreadyThere", err)
	}
}

func TestDiff(t *testing.T) {
	t.Parallel()
	old := "a\nb\nc\nd\ne\nf\ng\n"
	new := "a\nb\nc\nd\nX\ne\nf\ng\n"
	want := "--- p.yaml\n+++ p.yaml\n@@ -2,6 +2,7 @@\n b\n c\n d\n+X\n e\n f\n g\n"
	if got := Diff("p.yaml", []byte(old), []byte(new)); got != want {
		t.Fatalf("Diff:\n%s\nwant:\n%s", got, want)
	}
	if got := Diff("p.yaml", []byte("a"), []byte("a\nb\n")); got != "--- p.yaml\n+++ p.yaml\n@@ -1 +1,2 @@\n-a\n\\ No newline at end of file\n+a\n+b\n" {
		t.Fatalf("Diff at the end:\n%s", got)
	}
}
