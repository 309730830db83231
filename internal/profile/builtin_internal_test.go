package profile

import (
	"slices"
	"strings"
	"testing"
)

// A built-in profile has no directory, so the relative paths a user file may
// hold are errors in it. No built-in has such a path; these checks guard the
// next one. Built-ins are embedded, so the cases go through Parse and
// resolve rather than Load.
func TestBuiltinRelativePaths(t *testing.T) {
	tests := map[string]struct {
		yaml string
		want []string
	}{
		"relative mount source": {
			yaml: "image: a\nmounts: [{source: ./data, target: /data}]\n",
			want: []string{`builtin:x:2:19: mounts[0].source: source "./data" is relative, and a built-in profile has no directory to resolve it against`},
		},
		"relative build context": {
			yaml: "image: a\nbuild: {context: .}\n",
			want: []string{"builtin:x:2:18: build.context: a built-in profile's build context must be absolute"},
		},
		"extends a path": {
			yaml: "extends: ./base.yaml\n",
			want: []string{`builtin:x:1:10: extends: a built-in profile cannot extend a path ("./base.yaml")`},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			doc, err := Parse("builtin:x", "", strings.NewReader(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			_, err = Locations{}.load("x", doc, nil)
			var got []string
			if list, ok := err.(List); ok {
				for _, e := range list {
					got = append(got, e.Error())
				}
			} else if err != nil {
				t.Fatalf("got %T %v, want a List", err, err)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
		})
	}
}
