package generator_test

import (
	"context"
	"errors"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/generator"
	"github.com/propio/propio-sandbox/internal/decisionlog"
)

// The extension says what the launcher applies itself; the launch reads it
// back from the project, which may be the one Generate made or its render
// loaded again with compose-go: both give the same values, and they are the
// profile's and the host's.
func TestExtensionRoundTrip(t *testing.T) {
	for _, c := range cases(t) {
		t.Run(c.name, func(t *testing.T) {
			p, err := c.load()
			if err != nil {
				t.Fatal(err)
			}
			h := fixtureHost(t, p)
			proj, err := generator.Generate(p, h, generator.Options{Project: project})
			if err != nil {
				t.Fatal(err)
			}
			got, err := generator.ReadExtension(proj)
			if err != nil {
				t.Fatal(err)
			}
			if got.Profile != p.Meta.File || got.Disk != int64(p.Resources.Disk) || got.Timeout != time.Duration(p.Resources.Timeout) {
				t.Errorf("extension %+v: want profile %s, disk %d, timeout %v", got, p.Meta.File, p.Resources.Disk, time.Duration(p.Resources.Timeout))
			}
			if allowlist := p.Network.Mode == "allowlist"; (got.Gateway != nil) != allowlist {
				t.Errorf("gateway %+v, for network.mode %s", got.Gateway, p.Network.Mode)
			} else if allowlist {
				subnet, _ := generator.PickSubnet(project, nil)
				want := generator.ExtensionGateway{Image: generator.DefaultGatewayImage, Subnet: subnet, Log: decisionlog.FileName(project)}
				if b := got.Gateway.Broker; b != nil {
					// What the launcher reads for the secrets given, by
					// name, and where from; never a value.
					var names []string
					for name := range b.Secrets {
						names = append(names, name)
					}
					slices.Sort(names)
					if !b.Opens || !slices.Equal(names, generator.ActiveSecrets(p, h)) {
						t.Errorf("broker %+v, want it to open connections and read %v", b, generator.ActiveSecrets(p, h))
					}
					want.Broker = b
				}
				if !reflect.DeepEqual(*got.Gateway, want) {
					t.Errorf("gateway %+v, want %+v", *got.Gateway, want)
				}
			}
			if (got.Changeset != nil) != (h.Changeset != nil) {
				t.Errorf("changeset %+v, for the host's %+v", got.Changeset, h.Changeset)
			} else if cs := h.Changeset; cs != nil {
				if got.Changeset.ID != cs.ID || got.Changeset.Mode != cs.Mode {
					t.Errorf("changeset %+v, want id %s mode %s", got.Changeset, cs.ID, cs.Mode)
				}
				for i, v := range got.Changeset.Copies {
					m := cs.Mounts[i]
					if v.Volume != generator.ChangesetVolumeKey(m.Name) || v.In != m.CopyIn || v.Out != m.CopyOut || proj.Volumes[v.Volume].Name == "" {
						t.Errorf("copies[%d] %+v, for the mount %+v", i, v, m)
					}
				}
				if copies := len(got.Changeset.Copies); (cs.Mode == generator.ChangesetCopy) != (copies > 0) || copies > 0 && copies != len(cs.Mounts) {
					t.Errorf("%d copies for a changeset in mode %s of %d mounts", copies, cs.Mode, len(cs.Mounts))
				}
			}

			out, err := generator.Render(proj)
			if err != nil {
				t.Fatal(err)
			}
			loaded, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
				WorkingDir:  proj.WorkingDir,
				ConfigFiles: []types.ConfigFile{{Filename: "compose.yaml", Content: out}},
				Environment: types.Mapping{},
			}, func(o *loader.Options) { o.SetProjectName(project, true) })
			if err != nil {
				t.Fatal(err)
			}
			back, err := generator.ReadExtension(loaded)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back, got) {
				t.Errorf("read back from the render:\n%+v\nfrom the project:\n%+v", back, got)
			}
		})
	}
}

// A number may come back from YAML or JSON as an int, a float64 or a
// string; a value that is not what its field says is an error naming it.
func TestReadExtension(t *testing.T) {
	t.Parallel()
	proj := func(ext any) *types.Project {
		svc := types.ServiceConfig{Name: generator.Service}
		if ext != nil {
			svc.Extensions = types.Extensions{generator.ExtensionKey: ext}
		}
		return &types.Project{Name: "p", Services: types.Services{generator.Service: svc}}
	}
	want := generator.Extension{
		Profile: "builtin:strict", Disk: 2 << 30, Timeout: 90 * time.Minute,
		Gateway: &generator.ExtensionGateway{Image: "gw:1", Subnet: netip.MustParsePrefix("198.18.3.0/24"), Log: "p.jsonl"},
	}
	for name, disk := range map[string]any{"int": 2 << 30, "int64": int64(2 << 30), "uint64": uint64(2 << 30), "float64": float64(2 << 30), "string": "2147483648"} {
		got, err := generator.ReadExtension(proj(map[string]any{
			"profile": "builtin:strict", "disk": disk, "timeout": "1h30m0s",
			"gateway": map[string]any{"image": "gw:1", "subnet": "198.18.3.0/24", "log": "p.jsonl"},
		}))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("disk as %s: %+v, %v", name, got, err)
		}
	}
	for name, tc := range map[string]struct {
		ext  any
		want string
	}{
		"none":           {nil, "no x-propio-sandbox extension"},
		"not a mapping":  {"disk", "x-propio-sandbox is a string, not a mapping"},
		"disk fraction":  {map[string]any{"disk": 1.5}, "x-propio-sandbox.disk: 1.5 is not a whole number"},
		"disk word":      {map[string]any{"disk": "lots"}, "x-propio-sandbox.disk: lots is not a whole number"},
		"timeout":        {map[string]any{"timeout": "soon"}, `x-propio-sandbox.timeout: "soon" is not a duration`},
		"subnet":         {map[string]any{"gateway": map[string]any{"subnet": "nowhere"}}, "x-propio-sandbox.gateway.subnet: "},
		"copies":         {map[string]any{"changeset": map[string]any{"copies": "all"}}, "x-propio-sandbox.changeset.copies: a string, not a list"},
		"copy":           {map[string]any{"changeset": map[string]any{"copies": []any{map[string]any{"in": 3}}}}, "x-propio-sandbox.changeset.copies[0].in: a int, not a string"},
		"profile number": {map[string]any{"profile": 3}, "x-propio-sandbox.profile: a int, not a string"},
	} {
		_, err := generator.ReadExtension(proj(tc.ext))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want %q", name, err, tc.want)
		}
	}
	if _, err := generator.ReadExtension(proj(nil)); !errors.Is(err, generator.ErrNoExtension) {
		t.Errorf("no extension: %v, want ErrNoExtension", err)
	}
	if _, err := generator.ReadExtension(&types.Project{Name: "empty"}); err == nil {
		t.Error("a project without the agent service read")
	}
}
