package profile_test

import (
	"path/filepath"
	"testing"

	"github.com/propio/propio-sandbox/internal/profile"
)

func TestExpand(t *testing.T) {
	vars := profile.Vars{Workspace: "/src/repo", Home: "/home/me", PropioHome: "/opt/propio"}
	tests := map[string]struct {
		in   string
		vars *profile.Vars // vars when nil
		want string
		// rejected: Check refuses the string in a profile, because Expand
		// would leave a reference in it.
		rejected bool
	}{
		"workspace":               {in: "${WORKSPACE}/out", want: "/src/repo/out"},
		"home":                    {in: "${HOME}/.cache", want: "/home/me/.cache"},
		"propio home":             {in: "${PROPIO_HOME}/.propio", want: "/opt/propio/.propio"},
		"several":                 {in: "${HOME}:${WORKSPACE}", want: "/home/me:/src/repo"},
		"tilde slash":             {in: "~/.gitconfig", want: "/home/me/.gitconfig"},
		"tilde alone":             {in: "~", want: "/home/me"},
		"tilde not leading":       {in: "a/~/b", want: "a/~/b"},
		"tilde user":              {in: "~root/x", want: "~root/x"},
		"double dollar":           {in: "$$", want: "$"},
		"double dollar in text":   {in: "cost: $$5", want: "cost: $5"},
		"escaped reference":       {in: "$${HOME}", want: "${HOME}"},
		"tilde then variable":     {in: "~/${PROPIO_HOME}", want: "/home/me//opt/propio"},
		"home is not re-expanded": {in: "~/x", vars: &profile.Vars{Home: "/home/a$$b"}, want: "/home/a$$b/x"},
		"plain text":              {in: "/usr/bin/env", want: "/usr/bin/env"},
		"unknown braced":          {in: "${X}/y", want: "${X}/y", rejected: true},
		"unknown bare":            {in: "$USER", want: "$USER", rejected: true},
		"bare home":               {in: "$HOME", want: "$HOME", rejected: true},
		"unterminated":            {in: "${HOME", want: "${HOME", rejected: true},
		"lone dollar":             {in: "a $ b", want: "a $ b", rejected: true},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			v := vars
			if tt.vars != nil {
				v = *tt.vars
			}
			if got := profile.Expand(tt.in, v); got != tt.want {
				t.Errorf("Expand(%q) = %q, want %q", tt.in, got, tt.want)
			}

			dir := t.TempDir()
			writeFiles(t, dir, map[string]string{"p.yaml": "image: a\ncommand: ['" + tt.in + "']\n"})
			got := validate(t, profile.Locations{}, filepath.Join(dir, "p.yaml"), dir)
			if rejected := len(got) > 0; rejected != tt.rejected {
				t.Errorf("Check rejected %q: %v, want %v (%q)", tt.in, rejected, tt.rejected, got)
			}
		})
	}
}
