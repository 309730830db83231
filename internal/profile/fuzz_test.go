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
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		doc, err := Parse("fuzz.yaml", "/fuzz", bytes.NewReader(data))
		if err != nil {
			if _, ok := err.(List); !ok {
				t.Fatalf("Parse returned %T, want List: %v", err, err)
			}
			for _, e := range err.(List) {
				if e.Pos.Line < 1 || e.Pos.Col < 1 {
					t.Fatalf("error without a position: %v", e)
				}
			}
			return
		}
		if ref, _ := doc.Extends(); ref != "" {
			return // following extends reads other files; resolve covers it
		}
		p, err := (Locations{}).resolve("fuzz.yaml", doc)
		if err != nil {
			return
		}
		_ = p.Check(Limits{CPUs: 2, Memory: 4 << 30})
		_, _ = p.YAML()
	})
}
