package grants

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/hostinfo"
)

func dirs(t *testing.T) hostinfo.Dirs {
	d := t.TempDir()
	return hostinfo.Dirs{Config: filepath.Join(d, "config"), State: filepath.Join(d, "state")}
}

func TestAddForRemove(t *testing.T) {
	t.Parallel()
	d := dirs(t)
	ws := "/home/me/proj"
	if gs, err := For(d, ws); err != nil || len(gs) != 0 {
		t.Fatalf("For without a file = %v, %v; want none", gs, err)
	}
	for _, g := range []struct {
		host   string
		port   int
		action string
	}{{"PyPI.org", 443, Allow}, {"evil.test", 0, Deny}, {"*.example.test", 8080, Allow}, {"2001:db8::1", 443, Allow}} {
		if err := Add(d, ws, g.host, g.port, g.action); err != nil {
			t.Fatalf("Add(%s): %v", g.host, err)
		}
	}
	gs, err := For(d, ws)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, g := range gs {
		got = append(got, g.Action+" "+g.Rule())
		if g.Decided.IsZero() || g.Line == 0 {
			t.Errorf("grant %d: decided %v, line %d; want both set", g.N, g.Decided, g.Line)
		}
	}
	want := "allow pypi.org:443|deny evil.test|allow *.example.test:8080|allow [2001:db8::1]:443"
	if strings.Join(got, "|") != want {
		t.Fatalf("grants = %q, want %q", strings.Join(got, "|"), want)
	}
	st, err := os.Stat(File(d, ws))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("grants file: %v, %v; want mode 0600", st, err)
	}
	// The latest decision on a host and port replaces the earlier one, in place.
	if err := Add(d, ws, "pypi.org", 443, Deny); err != nil {
		t.Fatal(err)
	}
	if gs, _ := For(d, ws); len(gs) != 4 || gs[0].Action != Deny {
		t.Fatalf("after deny of pypi.org:443: %+v", gs)
	}
	// Remove by number renumbers the rest.
	if rm, err := Remove(d, ws, "1"); err != nil || len(rm) != 1 || rm[0].Host != "pypi.org" {
		t.Fatalf("Remove 1 = %v, %v", rm, err)
	}
	if rm, err := Remove(d, ws, "*.example.test"); err != nil || len(rm) != 1 {
		t.Fatalf("Remove wildcard = %v, %v", rm, err)
	}
	if _, err := Remove(d, ws, "evil.test:443"); !errors.Is(err, ErrNoMatch) {
		t.Fatalf("Remove evil.test:443 (granted without a port) = %v; want ErrNoMatch", err)
	}
	if rm, err := Remove(d, ws, "evil.test:0"); err != nil || len(rm) != 1 {
		t.Fatalf("Remove evil.test:0 = %v, %v", rm, err)
	}
	gs, _ = For(d, ws)
	if len(gs) != 1 || gs[0].N != 1 || gs[0].Host != "2001:db8::1" {
		t.Fatalf("left = %+v", gs)
	}
	if _, err := Remove(d, ws, "[2001:db8::1]"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(File(d, ws)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the file of no grants is still there: %v", err)
	}
}

func TestAddRefuses(t *testing.T) {
	t.Parallel()
	d := dirs(t)
	for name, g := range map[string]Grant{
		"action":   {Action: "maybe", Host: "a.test"},
		"metadata": {Action: Allow, Host: "169.254.169.254", Port: 80},
		"engine":   {Action: Allow, Host: "docker.test", Port: 2375},
		"broad":    {Action: Allow, Host: "*.test"},
		"star":     {Action: Allow, Host: "*"},
		"url":      {Action: Allow, Host: "https://a.test/"},
		"port":     {Action: Allow, Host: "a.test", Port: 70000},
	} {
		if _, err := Put(d, "/w", g); err == nil {
			t.Errorf("%s: Put(%+v) succeeded", name, g)
		}
	}
	if _, err := os.Stat(File(d, "/w")); err == nil {
		t.Error("a refused grant wrote the file")
	}
	if err := Add(d, "relative", "a.test", 0, Allow); err == nil {
		t.Error("a relative workspace was taken")
	}
}

func TestWorkspacesApart(t *testing.T) {
	t.Parallel()
	d := dirs(t)
	if File(d, "/a/proj") == File(d, "/b/proj") {
		t.Fatal("two workspaces of one name share a grants file")
	}
	if err := Add(d, "/a/proj", "a.test", 0, Allow); err != nil {
		t.Fatal(err)
	}
	if err := Add(d, "/b/proj", "b.test", 0, Deny); err != nil {
		t.Fatal(err)
	}
	sets, err := All(d)
	if err != nil || len(sets) != 2 || sets[0].Workspace != "/a/proj" || sets[1].Grants[0].Host != "b.test" {
		t.Fatalf("All = %+v, %v", sets, err)
	}
	// A file copied to another workspace's name is refused, not used.
	data, _ := os.ReadFile(File(d, "/a/proj"))
	os.WriteFile(File(d, "/c/proj"), data, 0o600)
	if _, err := For(d, "/c/proj"); err == nil || !strings.Contains(err.Error(), "not of /c/proj") {
		t.Fatalf("For of a copied file = %v", err)
	}
}

func TestConcurrentAdds(t *testing.T) {
	t.Parallel()
	d := dirs(t)
	var wg sync.WaitGroup
	for i := 0; i < 20; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := Add(d, "/w", "h"+string(rune('a'+i))+".test", 0, Allow); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if gs, err := For(d, "/w"); err != nil || len(gs) != 20 {
		t.Fatalf("after 20 concurrent adds: %d grants, %v", len(gs), err)
	}
}

func TestParseErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ text, want string }{
		"empty":    {"", "f.yaml: empty"},
		"unknown":  {"version: 1\nworkspace: /w\ngrantz: []\n", "f.yaml:3: unknown field grantz"},
		"version":  {"version: 2\nworkspace: /w\n", "f.yaml:1:10: version: want 1"},
		"relative": {"version: 1\nworkspace: w\n", "f.yaml:2:12: workspace: want the workspace's absolute path"},
		"rule": {"version: 1\nworkspace: /w\ngrants:\n  - action: allow\n    host: ok.test\n  - action: allow\n    host: \"*.com\"\n",
			`f.yaml:6:5: grants[1]: grant *.com: "*.com" is too broad`},
		"action": {"version: 1\nworkspace: /w\ngrants:\n  - action: permit\n    host: ok.test\n", `f.yaml:4:5: grants[0]: grant action "permit"`},
		"time":   {"version: 1\nworkspace: /w\ngrants:\n  - action: deny\n    host: ok.test\n    decided: yesterday\n", `f.yaml:6:14: grants[0].decided: "yesterday" is not a time`},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse("f.yaml", []byte(tc.text))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Parse = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestMarshalRoundTrip(t *testing.T) {
	t.Parallel()
	when := time.Date(2026, 11, 25, 3, 40, 0, 0, time.UTC)
	s := Set{File: "f.yaml", Workspace: "/w", Grants: []Grant{
		{N: 1, Action: Allow, Host: "pypi.org", Port: 443, Decided: when, By: "allow --for always"},
		{N: 2, Action: Deny, Host: "*.evil.test", Decided: when},
	}}
	back, err := Parse("f.yaml", Marshal(s))
	if err != nil {
		t.Fatal(err)
	}
	for i := range back.Grants {
		back.Grants[i].Line = 0
	}
	if len(back.Grants) != 2 || back.Grants[0] != s.Grants[0] || back.Grants[1] != s.Grants[1] || back.Workspace != "/w" {
		t.Fatalf("round trip: %+v", back)
	}
}
