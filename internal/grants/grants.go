// Package grants is the user's store of "always" decisions: for each
// workspace, the destinations the user allowed or denied for good, which a
// launch merges into the allowlist gateway's rules. A workspace's grants are
// one YAML file of the user's, outside the workspace (the agent cannot write
// it), in $XDG_CONFIG_HOME/propio-sandbox/grants/, named after the
// workspace's path and recording it inside. Writes are atomic, under a lock,
// and the file is the user's alone (0600).
//
// A grant is a rule as network.allow writes it (a name, *.name or an
// address, with a port or without one: port 0 means 80 and 443, as a rule
// without a port does), and an action: allow or deny. Which rule wins is the
// gateway's (deny over allow); this package only keeps them. It never
// prints, and never edits a profile: PatchAllow makes the patch that the CLI
// shows and writes.
package grants

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/egress"
	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
	"go.yaml.in/yaml/v3"
)

// Actions of a grant.
const (
	Allow = "allow"
	Deny  = "deny"
)

// maxFile bounds what is read of a grants file.
const maxFile = 1 << 20

// Grant is one "always" decision.
type Grant struct {
	// N is the grant's number in its file, from 1, as `grants` lists it and
	// as the gateway names it (grant:FILE:N).
	N      int
	Action string // Allow or Deny
	// Host is a name, *.name or an address, lower case.
	Host string
	// Port is the port, or 0 for 80 and 443 (as a rule without a port).
	Port int
	// Decided is when the decision was made; By says how ("allow --for
	// always", "approve", "ui"); empty when unknown.
	Decided time.Time
	By      string
	// Line is where the grant starts in its file; 0 for one not read from
	// a file.
	Line int
}

// Rule is the grant as a network.allow or network.deny rule: host, or
// host:port ([address]:port for an IPv6 address).
func (g Grant) Rule() string { return ruleText(g.Host, g.Port) }

// Origin is how the gateway names the grant in its decisions: grant:FILE:N.
func (g Grant) Origin(file string) string { return "grant:" + file + ":" + strconv.Itoa(g.N) }

// Set is the grants of one workspace, as its file holds them.
type Set struct {
	File      string // the grants file (which need not exist)
	Workspace string
	Grants    []Grant
}

// Dir is where the grants files are.
func Dir(dirs hostinfo.Dirs) string { return filepath.Join(dirs.Config, "grants") }

// File is the grants file of workspace (an absolute path): NAME-HASH.yaml,
// NAME the workspace's base name and HASH the start of the SHA-256 of its
// path, so that two workspaces of the same name do not share one.
func File(dirs hostinfo.Dirs, workspace string) string {
	sum := sha256.Sum256([]byte(workspace))
	base := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			return r
		}
		return '_'
	}, filepath.Base(workspace))
	if base == "" || base == "." || base == ".." || base == "_" {
		base = "workspace"
	}
	return filepath.Join(Dir(dirs), base+"-"+hex.EncodeToString(sum[:6])+".yaml")
}

// For returns the grants of workspace, in the order of its file; none when
// it has no file. A grants file that does not parse, or holds a grant
// network.allow would not accept, is an error naming its line and column.
func For(dirs hostinfo.Dirs, workspace string) ([]Grant, error) {
	s, err := Load(dirs, workspace)
	return s.Grants, err
}

// Load reads the grants of workspace.
func Load(dirs hostinfo.Dirs, workspace string) (Set, error) {
	if !filepath.IsAbs(workspace) {
		return Set{}, fmt.Errorf("grants: workspace %q is not an absolute path", workspace)
	}
	file := File(dirs, workspace)
	s, err := read(file)
	if errors.Is(err, fs.ErrNotExist) {
		return Set{File: file, Workspace: workspace}, nil
	}
	if err != nil {
		return Set{File: file, Workspace: workspace}, err
	}
	if s.Workspace != workspace {
		return Set{File: file, Workspace: workspace}, fmt.Errorf("%s: the grants of %s, not of %s: move it aside", file, s.Workspace, workspace)
	}
	return s, nil
}

// All returns the grants of every workspace that has a grants file, by
// workspace.
func All(dirs hostinfo.Dirs) ([]Set, error) {
	entries, err := os.ReadDir(Dir(dirs))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing grants: %w", err)
	}
	var sets []Set
	var errs []error
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".yaml") || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		s, err := read(filepath.Join(Dir(dirs), e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		sets = append(sets, s)
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].Workspace < sets[j].Workspace })
	return sets, errors.Join(errs...)
}

// Add records an "always" decision for workspace: action (Allow or Deny)
// for host on port (0 for 80 and 443). It replaces a grant of the same host
// and port, whatever its action: the latest decision is the one that holds.
func Add(dirs hostinfo.Dirs, workspace, host string, port int, action string) error {
	_, err := Put(dirs, workspace, Grant{Action: action, Host: host, Port: port})
	return err
}

// Put is Add for a whole grant, with its Decided (empty: now) and By. It
// returns the grant as recorded, with its number.
func Put(dirs hostinfo.Dirs, workspace string, g Grant) (Grant, error) {
	g, err := Check(g)
	if err != nil {
		return g, err
	}
	if g.Decided.IsZero() {
		g.Decided = time.Now().UTC().Truncate(time.Second)
	}
	err = update(dirs, workspace, func(s *Set) error {
		for i, old := range s.Grants {
			if old.Host == g.Host && old.Port == g.Port {
				g.N = old.N
				s.Grants[i] = g
				return nil
			}
		}
		g.N = len(s.Grants) + 1
		s.Grants = append(s.Grants, g)
		return nil
	})
	return g, err
}

// Check validates a grant and returns it as stored: action allow or deny,
// host lower case, and a rule network.allow accepts (never one of the
// destinations no rule can allow).
func Check(g Grant) (Grant, error) {
	if g.Action != Allow && g.Action != Deny {
		return g, fmt.Errorf("grant action %q: want %s or %s", g.Action, Allow, Deny)
	}
	g.Host = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(g.Host)), ".")
	if a, err := netip.ParseAddr(strings.Trim(g.Host, "[]")); err == nil {
		g.Host = a.Unmap().String()
	}
	if g.Port < 0 || g.Port > 65535 {
		return g, fmt.Errorf("grant port %d: want 1 to 65535, or 0 for 80 and 443", g.Port)
	}
	if _, err := egress.ParseRule(g.Rule()); err != nil {
		return g, fmt.Errorf("grant %s: %w", g.Rule(), err)
	}
	return g, nil
}

// ruleText writes host and port as a rule.
func ruleText(host string, port int) string {
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		host = "[" + host + "]"
		if port == 0 {
			return host
		}
	}
	if port == 0 {
		return host
	}
	return host + ":" + strconv.Itoa(port)
}

// ErrNoMatch is returned by Remove when no grant matches.
var ErrNoMatch = errors.New("no grant matches")

// Remove removes the grants of workspace that sel names: N (a grant's
// number), HOST (every grant of that host, on any port) or HOST:PORT (the
// grant of that host and port; HOST:0 the one without a port). It returns
// what it removed, or ErrNoMatch (wrapped).
func Remove(dirs hostinfo.Dirs, workspace, sel string) ([]Grant, error) {
	match, err := selector(sel)
	if err != nil {
		return nil, err
	}
	var removed []Grant
	err = update(dirs, workspace, func(s *Set) error {
		kept := s.Grants[:0:0]
		for _, g := range s.Grants {
			if match(g) {
				removed = append(removed, g)
			} else {
				kept = append(kept, g)
			}
		}
		if len(removed) == 0 {
			return fmt.Errorf("%s: %w in %s", sel, ErrNoMatch, s.File)
		}
		s.Grants = kept
		return nil
	})
	return removed, err
}

// selector parses what Remove takes.
func selector(sel string) (func(Grant) bool, error) {
	if n, err := strconv.Atoi(sel); err == nil {
		if n < 1 {
			return nil, fmt.Errorf("grant number %d: grants are numbered from 1", n)
		}
		return func(g Grant) bool { return g.N == n }, nil
	}
	noPort, hasPort := strings.CutSuffix(sel, ":0")
	if !hasPort {
		noPort = sel
	}
	host, port, err := SplitRule(noPort)
	if err != nil {
		return nil, fmt.Errorf("%q is neither a grant's number nor HOST[:PORT]: %w", sel, err)
	}
	hasPort = hasPort || port != 0
	return func(g Grant) bool { return g.Host == host && (!hasPort || g.Port == port) }, nil
}

// update changes the grants of workspace under the grants directory's lock,
// and writes them back (removes the file when none are left).
func update(dirs hostinfo.Dirs, workspace string, change func(*Set) error) error {
	if err := os.MkdirAll(Dir(dirs), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", Dir(dirs), err)
	}
	unlock, err := lock(Dir(dirs))
	if err != nil {
		return err
	}
	defer unlock()
	s, err := Load(dirs, workspace)
	if err != nil {
		return err
	}
	if err := change(&s); err != nil {
		return err
	}
	for i := range s.Grants {
		s.Grants[i].N = i + 1
	}
	if len(s.Grants) == 0 {
		if err := os.Remove(s.File); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", s.File, err)
		}
		return nil
	}
	return fsutil.WriteFileAtomic(s.File, Marshal(s), 0o600)
}

// lock takes the grants directory's lock, so that two frontends deciding
// at once both have their grant kept.
func lock(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("locking the grants: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking the grants: %w", err)
	}
	return func() { f.Close() }, nil
}

// fileGrant is a grant as its file holds it.
type fileGrant struct {
	Action  string `yaml:"action"`
	Host    string `yaml:"host"`
	Port    int    `yaml:"port,omitempty"`
	Decided string `yaml:"decided,omitempty"`
	By      string `yaml:"by,omitempty"`
}

type fileSet struct {
	Version   int         `yaml:"version"`
	Workspace string      `yaml:"workspace"`
	Grants    []fileGrant `yaml:"grants"`
}

const header = `# propio-sandbox grants: the "always" decisions for one workspace, merged into
# the rules of its allowlist sandboxes' gateway at launch (a deny grant wins
# over every allow; the profile's network.deny wins over an allow grant).
# port 0 (or none) means 80 and 443. List them with ` + "`propio-sandbox grants`" + `,
# remove one with ` + "`propio-sandbox grants rm N`" + `.
`

// Marshal writes s as its file holds it.
func Marshal(s Set) []byte {
	fs := fileSet{Version: 1, Workspace: s.Workspace}
	for _, g := range s.Grants {
		fg := fileGrant{Action: g.Action, Host: g.Host, Port: g.Port, By: g.By}
		if !g.Decided.IsZero() {
			fg.Decided = g.Decided.UTC().Format(time.RFC3339)
		}
		fs.Grants = append(fs.Grants, fg)
	}
	var b bytes.Buffer
	b.WriteString(header)
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(fs); err != nil {
		panic(err) // strings and numbers always encode
	}
	enc.Close()
	return b.Bytes()
}

// read reads a grants file.
func read(file string) (Set, error) {
	data, err := fsutil.ReadRegular(file, maxFile)
	if errors.Is(err, fs.ErrNotExist) {
		return Set{}, err
	}
	if err != nil {
		return Set{}, fmt.Errorf("reading grants file %s: it %s", file, fsutil.Problem(err))
	}
	return Parse(file, data)
}

// Parse reads a grants file's content; its errors name file, line and
// column.
func Parse(file string, data []byte) (Set, error) {
	s := Set{File: file}
	var fset fileSet
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fset); errors.Is(err, io.EOF) {
		return s, fmt.Errorf("%s: empty: want version, workspace and grants", file)
	} else if err != nil {
		return s, decodeError(file, err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return s, fmt.Errorf("%s: %w", file, err)
	}
	at := func(n *yaml.Node, key string) string {
		if v := child(n, key); v != nil {
			n = v
		}
		return file + ":" + strconv.Itoa(n.Line) + ":" + strconv.Itoa(n.Column)
	}
	doc := root.Content[0]
	if fset.Version != 1 {
		return s, fmt.Errorf("%s: version: want 1, the only version of grants files there is", at(doc, "version"))
	}
	if !filepath.IsAbs(fset.Workspace) {
		return s, fmt.Errorf("%s: workspace: want the workspace's absolute path", at(doc, "workspace"))
	}
	s.Workspace = fset.Workspace
	items := child(doc, "grants")
	var errs []error
	for i, fg := range fset.Grants {
		n := items.Content[i]
		g := Grant{N: i + 1, Action: fg.Action, Host: fg.Host, Port: fg.Port, By: fg.By, Line: n.Line}
		if fg.Decided != "" {
			t, err := time.Parse(time.RFC3339, fg.Decided)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: grants[%d].decided: %q is not a time as RFC 3339 writes it (2006-01-02T15:04:05Z)", at(n, "decided"), i, fg.Decided))
			}
			g.Decided = t
		}
		checked, err := Check(g)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: grants[%d]: %w", at(n, ""), i, err))
		}
		s.Grants = append(s.Grants, checked)
	}
	return s, errors.Join(errs...)
}

var (
	unknownField = regexp.MustCompile(`^line (\d+): field (\S+) not found in type \S+$`)
	atLine       = regexp.MustCompile(`^line (\d+): (.*)$`)
)

// decodeError is a decoding error of file, each problem as FILE:LINE: and
// what it is.
func decodeError(file string, err error) error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		if m := atLine.FindStringSubmatch(msg); m != nil {
			return fmt.Errorf("%s:%s: %s", file, m[1], m[2])
		}
		return fmt.Errorf("%s: %s", file, msg)
	}
	var errs []error
	for _, e := range te.Errors {
		if m := unknownField.FindStringSubmatch(e); m != nil {
			errs = append(errs, fmt.Errorf("%s:%s: unknown field %s: a grants file has version, workspace and grants, a grant action, host, port, decided and by", file, m[1], m[2]))
		} else if m := atLine.FindStringSubmatch(e); m != nil {
			errs = append(errs, fmt.Errorf("%s:%s: %s", file, m[1], m[2]))
		} else {
			errs = append(errs, fmt.Errorf("%s: %s", file, e))
		}
	}
	return errors.Join(errs...)
}

// child is the value of key in mapping n, or nil.
func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// SplitRule reads HOST[:PORT] as network.allow writes a rule, into the host
// and port of a grant (0 without a port).
func SplitRule(s string) (string, int, error) {
	r, err := egress.ParseRule(s)
	if err != nil {
		return "", 0, err
	}
	return r.HostPattern(), int(r.Port), nil
}
