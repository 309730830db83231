package generator

import (
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
)

// ExtensionKey is the agent service's extension that carries what the
// launcher applies itself and the rest of the project does not say: the
// profile, the disk cap, the timeout, the changeset and the gateway. The
// launch reads it back from the project (ReadExtension), so that a render
// is the whole truth of what runs.
const ExtensionKey = "x-propio-sandbox"

// Extension is the content of the x-propio-sandbox extension.
type Extension struct {
	// Profile is the profile's file: builtin:NAME, or the leaf file's path.
	Profile string
	// Disk is the cap on what the sandbox writes, in bytes
	// (resources.disk, or the lower cap of a test).
	Disk int64
	// Timeout stops the sandbox after this long (resources.timeout); 0:
	// never.
	Timeout time.Duration
	// Changeset is the changeset the sandbox writes to; nil when there is
	// none (render, declared checks).
	Changeset *ExtensionChangeset
	// Gateway is the allowlist gateway; nil unless network.mode is allowlist.
	Gateway *ExtensionGateway
	// Keep is a persistent sandbox's (up); nil for a run.
	Keep *ExtensionKeep
	// Copies are the snapshots of a remote engine: volumes filled with a
	// copy of a host directory before the run, never copied back (Out
	// is "").
	Copies []VolumeCopy
}

// ExtensionChangeset is a launch's changeset as the extension says it.
type ExtensionChangeset struct {
	ID   string
	Mode string // ChangesetOverlay or ChangesetCopy
	// Copies are the copies a copy changeset makes, in and out of its
	// volumes; none for an overlay.
	Copies []VolumeCopy
}

// VolumeCopy is one volume of a copy changeset: filled from In before the
// run, its content put in Out after it.
type VolumeCopy struct {
	Volume string // the volume's key in the project
	In     string // the host directory copied into the volume
	Out    string // the host directory the volume's content replaces
}

// ExtensionGateway is the allowlist gateway as the extension says it.
type ExtensionGateway struct {
	Image  string
	Subnet netip.Prefix
	// Log is the name of the gateway's decision log in Host.LogDir.
	Log string
	// Broker is what the launcher does for credential brokering; nil when
	// the gateway opens no connection.
	Broker *ExtensionBroker
}

// Set puts the extension on svc, in place of the one it has.
func (e Extension) Set(svc *types.ServiceConfig) {
	if svc.Extensions == nil {
		svc.Extensions = types.Extensions{}
	}
	svc.Extensions[ExtensionKey] = e.value()
}

// value is the extension as the project holds it: maps, lists, strings and
// numbers, which render as sorted YAML and load back the same.
func (e Extension) value() map[string]any {
	m := map[string]any{"profile": e.Profile, "disk": e.Disk}
	if e.Timeout > 0 {
		m["timeout"] = e.Timeout.String()
	}
	if cs := e.Changeset; cs != nil {
		c := map[string]any{"id": cs.ID, "mode": cs.Mode}
		if len(cs.Copies) > 0 {
			c["copies"] = copiesValue(cs.Copies)
		}
		m["changeset"] = c
	}
	if len(e.Copies) > 0 {
		m["copies"] = copiesValue(e.Copies)
	}
	if g := e.Gateway; g != nil {
		gm := map[string]any{"image": g.Image, "subnet": g.Subnet.String(), "log": g.Log}
		if b := g.Broker; b != nil {
			secrets := map[string]any{}
			for name, from := range b.Secrets {
				secrets[name] = from
			}
			gm["broker"] = map[string]any{"opens": b.Opens, "secrets": secrets}
		}
		m["gateway"] = gm
	}
	if e.Keep != nil {
		m["keep"] = e.Keep.value()
	}
	return m
}

// ErrNoExtension is returned by ReadExtension for a project whose agent
// service has no x-propio-sandbox extension.
var ErrNoExtension = errors.New("no " + ExtensionKey + " extension")

// ReadExtension reads the x-propio-sandbox extension of project's agent
// service, from a project Generate made or from one loaded back from its
// rendered YAML (where numbers may come back as int, float64 or string).
func ReadExtension(project *types.Project) (Extension, error) {
	svc, ok := project.Services[Service]
	if !ok {
		return Extension{}, fmt.Errorf("project %s has no %s service", project.Name, Service)
	}
	return readExtension(svc)
}

func readExtension(svc types.ServiceConfig) (Extension, error) {
	raw, ok := svc.Extensions[ExtensionKey]
	if !ok {
		return Extension{}, fmt.Errorf("service %s: %w", svc.Name, ErrNoExtension)
	}
	m, ok := raw.(map[string]any)
	if !ok {
		return Extension{}, fmt.Errorf("service %s: %s is a %T, not a mapping", svc.Name, ExtensionKey, raw)
	}
	var r reader
	const at = ExtensionKey
	e := Extension{Profile: r.str(m, at, "profile"), Disk: r.int(m, at, "disk")}
	if t := r.str(m, at, "timeout"); t != "" {
		d, err := time.ParseDuration(t)
		if err != nil || d < 0 {
			r.fail(at, "timeout", fmt.Errorf("%q is not a duration", t))
		}
		e.Timeout = d
	}
	if c, ok := r.mapping(m, at, "changeset"); ok {
		at := at + ".changeset"
		cs := &ExtensionChangeset{ID: r.str(c, at, "id"), Mode: r.str(c, at, "mode"), Copies: r.copies(c, at)}
		e.Changeset = cs
	}
	e.Copies = r.copies(m, at)
	if g, ok := r.mapping(m, at, "gateway"); ok {
		at := at + ".gateway"
		gw := &ExtensionGateway{Image: r.str(g, at, "image"), Log: r.str(g, at, "log")}
		if s := r.str(g, at, "subnet"); s != "" {
			var err error
			if gw.Subnet, err = netip.ParsePrefix(s); err != nil {
				r.fail(at, "subnet", err)
			}
		}
		if b, ok := r.mapping(g, at, "broker"); ok {
			at := at + ".broker"
			gw.Broker = &ExtensionBroker{Secrets: map[string]string{}}
			switch v := b["opens"].(type) {
			case bool:
				gw.Broker.Opens = v
			case string:
				gw.Broker.Opens = v == "true"
			}
			if s, ok := r.mapping(b, at, "secrets"); ok {
				for name := range s {
					gw.Broker.Secrets[name] = r.str(s, at+".secrets", name)
				}
			}
		}
		e.Gateway = gw
	}
	if k, ok := r.mapping(m, at, "keep"); ok {
		e.Keep = &ExtensionKeep{}
		if idle := r.str(k, at+".keep", "idle"); idle != "off" {
			d, err := time.ParseDuration(idle)
			if err != nil || d <= 0 {
				r.fail(at+".keep", "idle", fmt.Errorf("%q is neither a duration nor off", idle))
			}
			e.Keep.Idle = d
		}
	}
	if len(r.errs) > 0 {
		return Extension{}, fmt.Errorf("service %s: %w", svc.Name, errors.Join(r.errs...))
	}
	return e, nil
}

// copiesValue says copies as the extension holds them.
func copiesValue(list []VolumeCopy) []any {
	copies := make([]any, 0, len(list))
	for _, v := range list {
		copies = append(copies, map[string]any{"volume": v.Volume, "in": v.In, "out": v.Out})
	}
	return copies
}

// copies reads the list of copies under "copies" of m.
func (r *reader) copies(m map[string]any, at string) []VolumeCopy {
	var out []VolumeCopy
	for i, v := range r.list(m, at, "copies") {
		at := at + ".copies[" + strconv.Itoa(i) + "]"
		vm, ok := v.(map[string]any)
		if !ok {
			r.fail(at, "", fmt.Errorf("a %T, not a mapping", v))
			continue
		}
		out = append(out, VolumeCopy{Volume: r.str(vm, at, "volume"), In: r.str(vm, at, "in"), Out: r.str(vm, at, "out")})
	}
	return out
}

// reader reads the values of the extension's mappings, gathering what is
// wrong with them, each at its path.
type reader struct{ errs []error }

func (r *reader) fail(at, key string, err error) {
	if key != "" {
		at += "." + key
	}
	r.errs = append(r.errs, fmt.Errorf("%s: %w", at, err))
}

func (r *reader) str(m map[string]any, at, key string) string {
	switch v := m[key].(type) {
	case nil:
		return ""
	case string:
		return v
	default:
		r.fail(at, key, fmt.Errorf("a %T, not a string", v))
		return ""
	}
}

// int reads a whole number, as Generate wrote it or as a YAML or JSON
// loader gives it back: int, int64, uint64, float64 or a string of digits.
func (r *reader) int(m map[string]any, at, key string) int64 {
	switch v := m[key].(type) {
	case nil:
		return 0
	case int:
		return int64(v)
	case int64:
		return v
	case uint64:
		if v <= math.MaxInt64 {
			return int64(v)
		}
	case float64:
		if v == math.Trunc(v) && math.Abs(v) < 1<<63 {
			return int64(v)
		}
	case string:
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			return n
		}
	}
	r.fail(at, key, fmt.Errorf("%v is not a whole number", m[key]))
	return 0
}

func (r *reader) mapping(m map[string]any, at, key string) (map[string]any, bool) {
	switch v := m[key].(type) {
	case nil:
		return nil, false
	case map[string]any:
		return v, true
	default:
		r.fail(at, key, fmt.Errorf("a %T, not a mapping", v))
		return nil, false
	}
}

func (r *reader) list(m map[string]any, at, key string) []any {
	switch v := m[key].(type) {
	case nil:
		return nil
	case []any:
		return v
	default:
		r.fail(at, key, fmt.Errorf("a %T, not a list", v))
		return nil
	}
}
