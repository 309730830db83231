package profile

import (
	"slices"
	"testing"
)

// Every built-in hides the same secrets files: strict's list, which
// standard inherits, is written again in open and offline (a newcomer reads
// offline as the tightest profile). The lists must not drift apart.
func TestBuiltinsHideTheSameSecrets(t *testing.T) {
	t.Parallel()
	strict, err := Locations{}.Load("strict")
	if err != nil {
		t.Fatal(err)
	}
	want := strict.Workspace.Hide
	for _, name := range []string{".env", ".env.*", "*.pem", "*.key", "id_rsa*", ".netrc", ".git-credentials"} {
		if !slices.Contains(want, name) {
			t.Errorf("strict does not hide %s: %q", name, want)
		}
	}
	for _, name := range []string{"open", "offline", "standard"} {
		p, err := Locations{}.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Workspace.Hide, want) {
			t.Errorf("%s hides %q\nstrict hides %q", name, p.Workspace.Hide, want)
		}
	}
}
