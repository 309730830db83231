package generator_test

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/profile"
)

// TestGatewayProfileLocation: the gateway is told where the allow list is,
// for its denial hints: the built-in's line for a built-in; for a user's
// profile, its own allow list's line, or its file alone when the whole allow
// list is inherited from a built-in (which nobody can edit).
func TestGatewayProfileLocation(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	inherits := write("inherits.yaml", "extends: strict\n")
	own := write("own.yaml", "extends: strict\nnetwork:\n  allow: [pypi.test]\n")
	for _, tt := range []struct {
		ref, want string
	}{
		{"strict", "builtin:strict:"},
		{inherits, inherits},
		{own, own + ":3"},
	} {
		p, err := profile.Locations{}.Load(tt.ref)
		if err != nil {
			t.Fatal(err)
		}
		project, err := generator.Generate(p, fixtureHost(t, p), generator.Options{Project: project, GatewayImage: "propio-sandbox/gateway:0123", Subnet: netip.MustParsePrefix("198.19.3.0/24")})
		if err != nil {
			t.Fatal(err)
		}
		cmd := project.Services[generator.GatewayService].Command
		i := slices.Index(cmd, "--profile")
		if i < 0 || i+1 == len(cmd) {
			t.Fatalf("%s: no --profile in the gateway's command %q", tt.ref, cmd)
		}
		got := cmd[i+1]
		if tt.ref == "strict" {
			got = got[:len(tt.want)]
		}
		if got != tt.want {
			t.Errorf("%s: the gateway's --profile is %q, want %q", tt.ref, cmd[i+1], tt.want)
		}
	}
}
