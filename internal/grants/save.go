package grants

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
)

// ErrBuiltin is returned by PlanSave for a built-in profile, which nobody
// can edit.
var ErrBuiltin = errors.New("a built-in profile cannot be edited")

// ErrNotEditable is returned (wrapped) by PlanSave for a profile file this
// user may not edit: not theirs, a link, or a repository profile that is
// not trusted as it is now.
var ErrNotEditable = errors.New("cannot edit the profile")

// Save is a grant to be written into a profile file: the patch to show,
// then Apply.
type Save struct {
	Grant Grant
	List  string // "allow" or "deny": the network list it goes to
	File  string // the profile file, as the profile names it
	Path  string // its absolute path
	// Old and New are the file's content before and after.
	Old, New []byte
	// Trust: the file is a repository profile's (in the workspace), which
	// Apply trusts again as it writes it.
	Trust bool
	mode  os.FileMode
	chain []profile.Source
}

// Diff is the patch Save makes, as a unified diff.
func (s *Save) Diff() string { return Diff(s.File, s.Old, s.New) }

// PlanSave prepares writing g into the leaf file of p, the profile run
// would use in workspace: never a built-in; only a file of this user's
// that is no link; a repository profile only when it is trusted as it is
// now (trust records what Apply writes, and nothing the agent wrote before
// it). It writes nothing.
func PlanSave(p *profile.Profile, workspace string, store profile.TrustStore, g Grant) (*Save, error) {
	if p.Meta.Builtin() || len(p.Meta.Chain) == 0 {
		return nil, fmt.Errorf("%s: %w", p.Meta.File, ErrBuiltin)
	}
	leaf := p.Meta.Chain[0]
	s := &Save{Grant: g, List: "network." + g.Action, File: leaf.File, Path: leaf.Path, chain: p.Meta.Chain}
	st, err := os.Lstat(leaf.Path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", leaf.File, err)
	}
	if st.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("%s is a symbolic link: %w (edit the file it points to, and name that one with -p)", leaf.File, ErrNotEditable)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Getuid() {
		return nil, fmt.Errorf("%s belongs to uid %d, not to you: %w", leaf.File, sys.Uid, ErrNotEditable)
	}
	if syscall.Access(filepath.Dir(leaf.Path), 2 /* W_OK */) != nil {
		return nil, fmt.Errorf("%s: you cannot write its directory: %w", leaf.File, ErrNotEditable)
	}
	s.mode = st.Mode().Perm()
	if s.Trust = profile.NeedsTrust(p, workspace); s.Trust {
		if err := store.Verify(p); err != nil {
			return nil, fmt.Errorf("%w: %w (review it with `propio-sandbox trust` first)", ErrNotEditable, err)
		}
	}
	if s.Old, err = fsutil.ReadRegular(leaf.Path, 1<<20); err != nil {
		return nil, fmt.Errorf("reading %s: it %s", leaf.File, fsutil.Problem(err))
	}
	if sum(s.Old) != leaf.SHA256 {
		return nil, fmt.Errorf("%s changed since it was loaded: try again", leaf.File)
	}
	if s.New, err = PatchProfile(leaf.File, s.Old, g.Action, g.Rule()); err != nil {
		return nil, err
	}
	return s, nil
}

// Apply writes the patched file, if it is still what PlanSave read, and
// checks that the profile loads with it (reload loads it again, as it was
// loaded); a repository profile is trusted as it is then, in the same step.
// On any failure the file is left as it was.
func (s *Save) Apply(reload func() (*profile.Profile, error), store profile.TrustStore) error {
	now, err := fsutil.ReadRegular(s.Path, 1<<20)
	if err != nil || !bytes.Equal(now, s.Old) {
		return fmt.Errorf("%s changed since the patch was made: nothing written; try again", s.File)
	}
	if err := fsutil.WriteFileAtomic(s.Path, s.New, s.mode); err != nil {
		return err
	}
	restore := func(err error) error {
		if werr := fsutil.WriteFileAtomic(s.Path, s.Old, s.mode); werr != nil {
			return errors.Join(err, fmt.Errorf("putting %s back: %w", s.File, werr))
		}
		return fmt.Errorf("%w; %s is as it was", err, s.File)
	}
	p, err := reload()
	if err != nil {
		return restore(fmt.Errorf("the profile does not load with the patch: %w", err))
	}
	if !s.Trust {
		return nil
	}
	if len(p.Meta.Chain) != len(s.chain) || p.Meta.Chain[0].SHA256 != sum(s.New) {
		return restore(fmt.Errorf("%s changed as it was written: not trusted", s.File))
	}
	for i := 1; i < len(s.chain); i++ {
		if p.Meta.Chain[i] != s.chain[i] {
			return restore(fmt.Errorf("%s, which %s extends, changed meanwhile: not trusted", p.Meta.Chain[i].File, s.File))
		}
	}
	if err := store.Trust(p); err != nil {
		return restore(err)
	}
	return nil
}

// Line is where the rule went in the new file: its 1-based line.
func (s *Save) Line() int {
	a, b := splitLines(s.Old), splitLines(s.New)
	first := 0
	for first < len(a) && first < len(b) && a[first] == b[first] {
		first++
	}
	for i := first; i < len(b); i++ {
		if strings.Contains(b[i], s.Grant.Rule()) {
			return i + 1
		}
	}
	return first + 1
}

func sum(b []byte) string {
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:])
}

// Select returns the one grant of gs that sel names, as Remove reads sel.
func Select(gs []Grant, sel string) (Grant, error) {
	match, err := selector(sel)
	if err != nil {
		return Grant{}, err
	}
	var found []Grant
	for _, g := range gs {
		if match(g) {
			found = append(found, g)
		}
	}
	switch len(found) {
	case 0:
		return Grant{}, fmt.Errorf("%s: %w", sel, ErrNoMatch)
	case 1:
		return found[0], nil
	}
	names := make([]string, len(found))
	for i, g := range found {
		names[i] = fmt.Sprintf("%d (%s)", g.N, g.Rule())
	}
	return Grant{}, fmt.Errorf("%s names %d grants: name one by its number: %s", sel, len(found), strings.Join(names, ", "))
}
