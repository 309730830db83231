package profile

import (
	"bytes"
	"io/fs"
	"testing"

	"github.com/propio/propio-sandbox/profiles"
)

// FuzzParse feeds arbitrary bytes to the parser and the checks after it: no
// input may panic them, and every rejection must carry a position.
func FuzzParse(f *testing.F) {
	entries, _ := fs.ReadDir(profiles.FS, ".")
	for _, e := range entries {
		data, _ := fs.ReadFile(profiles.FS, e.Name())
		f.Add(data)
	}
	for _, seed := range []string{
		"", "{}", "[]", "image: x\nextends: open\n", "a: &x 1\nb: *x\n", "<<: {image: x}\n",
		"image: !!binary aGk=\n", "resources: {cpus: 1e400, memory: 99999999999g}\n",
		"network: {mode: open}\nports: ['65536', '1-2:3-4']\n", "env: {pass: ['*'], required: [A]}\n",
		"mounts: [{source: '${X}', target: /a}, {source: ./a, target: /a}]\n", "---\n---\n",
		"workspace: {hide: ['[', '../x'], readonly: ['a/**']}\n", "command: ['$$', '${HOME}', '$']\n",
		"network: {mode: allowlist, allow: [~, '*.com', 'a.test:22', 1], deny: [[x]], bandwidth: 10mb}\n",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := Parse("fuzz.yaml", "/fuzz", bytes.NewReader(data))
		positioned(t, "Parse", err)
		if doc == nil {
			return
		}
		if ref, _ := doc.Extends(); ref != "" {
			return // following extends reads other files; the extends tests cover it
		}
		// The whole load: schema problems, merge, defaults and Check together.
		p, err := (Locations{}).load("fuzz.yaml", doc, err)
		if err != nil {
			positioned(t, "load", err)
			return
		}
		if _, err := p.YAML(); err != nil {
			t.Fatalf("a valid profile does not encode: %v", err)
		}
	})
}

// positioned fails unless err is nil or a List whose every error has a position.
func positioned(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		return
	}
	list, ok := err.(List)
	if !ok {
		t.Fatalf("%s returned %T, want List: %v", what, err, err)
	}
	for _, e := range list {
		if e.Pos.Line < 1 || e.Pos.Col < 1 {
			t.Fatalf("%s: error without a position: %v", what, e)
		}
	}
}
