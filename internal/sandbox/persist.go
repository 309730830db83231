package sandbox

// Persistent sandboxes (up, exec, down, stop, start): a sandbox that
// outlives the command that made it, for commands to run in one after
// another. A supervisor process per sandbox (this program again, in the
// background) owns it as a run's launcher owns a run: the same launch
// makes it, and its gateway, decision log, disk watch, agent requests,
// timeout, changeset and guard check go on while it lives. A record per
// sandbox in the state directory says where it is and how it is, so that
// exec finds its container without asking the engine, and ls, gc and the
// next launch can tell a persistent sandbox from a leftover.

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/hostinfo"
)

// The states of a persistent sandbox, as its record and ls say them.
const (
	// StateStarting: up (or start) is making it run.
	StateStarting = "starting"
	// StateRunning: it runs, its supervisor with it.
	StateRunning = "running"
	// StateRestarting: the engine went away; its supervisor waits for it
	// to come back (at most EngineWait), then starts the sandbox again.
	StateRestarting = "restarting"
	// StateStopping: stop or down is ending it.
	StateStopping = "stopping"
	// StateStopped: stopped on purpose (stop), or by gc after its
	// supervisor was killed: its containers, writable layer and changeset
	// are kept; nothing of it runs; start resumes it.
	StateStopped = "stopped"
	// StateGone: it is no more (idle, its timeout, its main process ended,
	// the engine lost it): Why says why; down forgets it.
	StateGone = "gone"
)

// EngineWait bounds how long a persistent sandbox's supervisor waits for
// an engine that went away to come back, before it says the sandbox is
// gone.
const EngineWait = 2 * time.Minute

// Record is what the state directory keeps of one persistent sandbox.
type Record struct {
	Name      string `json:"name"`
	ID        string `json:"id"` // which sandbox of this name (LabelKeepID)
	Project   string `json:"project"`
	Workspace string `json:"workspace"`
	// Target is where the workspace is in the sandbox (workspace.target):
	// exec from a directory below the workspace runs in the same one
	// below it.
	Target  string `json:"target"`
	Profile string `json:"profile"` // the profile's file, as ls shows it
	// Default: made without --name, the directory's own sandbox, which up
	// there finds again, and exec there takes among others.
	Default bool `json:"default,omitempty"`
	// Ref and Engine are how up named the profile (-p) and the engine
	// (--engine): start loads them again.
	Ref    string `json:"ref,omitempty"`
	Engine string `json:"engine,omitempty"`
	// Host, APIVersion and Container are where exec finds the agent's
	// container.
	Host       string `json:"host,omitempty"`
	APIVersion string `json:"api_version,omitempty"`
	Container  string `json:"container,omitempty"`
	// Supervisor is the pid of the process that owns the sandbox now; 0
	// when none does (stopped, gone).
	Supervisor int       `json:"supervisor,omitempty"`
	State      string    `json:"state"`
	Why        string    `json:"why,omitempty"`
	Changeset  string    `json:"changeset,omitempty"`
	Created    time.Time `json:"created"`
	// Log is the supervisors' log.
	Log string `json:"log"`

	// held: a supervisor held the record's lock when it was read.
	held bool
}

// Files of a record's directory.
const (
	recordFile  = "record.json"
	projectFile = "project.yaml" // the project as up made it, for start and down
	// lockFile is held (flock, exclusive) by the sandbox's supervisor for
	// its life: free, no supervisor runs.
	lockFile = "supervisor.lock"
	// busyFile is held (flock, shared) by each exec while it runs, and its
	// mtime is when the last exec started or ended: the idle timeout's.
	busyFile = "busy"
	// stopFile, present, tells a supervisor that a SIGTERM is stop's, not
	// down's.
	stopFile = "stop"
)

// keepRoot is where the records are: one directory per sandbox, by name.
func keepRoot(dirs hostinfo.Dirs) string { return filepath.Join(dirs.State, "sandboxes") }

// keepDir is the record directory of the sandbox name.
func keepDir(dirs hostinfo.Dirs, name string) string { return filepath.Join(keepRoot(dirs), name) }

// logDir is where the supervisors' logs are, named by sandbox id.
func logDir(dirs hostinfo.Dirs) string { return filepath.Join(keepRoot(dirs), ".logs") }

// KeepLog is the log of the sandbox whose id is id.
func KeepLog(dirs hostinfo.Dirs, id string) (string, error) {
	dir := logDir(dirs)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("making the directory of the supervisors' logs: %w", err)
	}
	return filepath.Join(dir, id+".log"), nil
}

// NewKeepID is a new sandbox's id.
func NewKeepID() string {
	b := make([]byte, 6)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// namePattern is what a persistent sandbox's name may be: its project's
// name is propio- and it, which Compose takes.
var namePattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,47}$`)

// ErrBadName: up --name was given a name a sandbox cannot have.
var ErrBadName = errors.New("a sandbox's name is 1 to 48 lower-case letters, digits, - and _, starting with a letter or digit")

// CheckName checks the name up --name asks for.
func CheckName(name string) error {
	if !namePattern.MatchString(name) {
		return fmt.Errorf("--name %q: %w", name, ErrBadName)
	}
	return nil
}

// projectPrefix starts every sandbox's project name (generator.ProjectName).
const projectPrefix = "propio-"

// projectOf is the project name of the persistent sandbox name, and
// nameOf the name of a project (or of a name given as its project's).
func projectOf(name string) string { return projectPrefix + name }
func nameOf(project string) string { return strings.TrimPrefix(project, projectPrefix) }

// readRecord reads the record in dir, and whether a supervisor holds it
// now.
func readRecord(dir string) (Record, error) {
	b, err := fsutil.ReadRegular(filepath.Join(dir, recordFile), 1<<20)
	if err != nil {
		return Record{}, err
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("reading %s: %w", filepath.Join(dir, recordFile), err)
	}
	if r.Supervisor > 0 {
		r.held = supervisorRuns(dir)
	}
	return r, nil
}

// write replaces the record in dir, all or nothing.
func (r Record) write(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, recordFile), append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("writing the record of sandbox %s: %w", r.Name, err)
	}
	return nil
}

// Records are the persistent sandboxes of this user, by name.
func Records(dirs hostinfo.Dirs) ([]Record, error) {
	entries, err := os.ReadDir(keepRoot(dirs))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the persistent sandboxes' records: %w", err)
	}
	var out []Record
	for _, e := range entries {
		if !e.IsDir() || strings.HasPrefix(e.Name(), ".") {
			continue
		}
		r, err := readRecord(filepath.Join(keepRoot(dirs), e.Name()))
		if err != nil {
			continue // being made, or being forgotten
		}
		out = append(out, r.current())
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// current is the record as things are: a supervisor that is gone without
// saying so (killed) leaves a sandbox that is not what its record says.
func (r Record) current() Record {
	if r.Supervisor > 0 && !r.held {
		switch r.State {
		case StateStarting:
			r.State, r.Why = StateGone, "its supervisor was killed while it started"
		case StateRunning, StateRestarting, StateStopping:
			r.Why = fmt.Sprintf("its supervisor (pid %d) was killed: nothing watches it; gc stops it, start resumes it", r.Supervisor)
		}
	}
	return r
}

// Unsupervised: the record says a supervisor owns the sandbox, and that
// supervisor is gone.
func (r Record) Unsupervised() bool {
	return r.Supervisor > 0 && !r.held && r.State != StateStopped && r.State != StateGone
}

// Supervised: a supervisor held the sandbox when its record was read.
func (r Record) Supervised() bool { return r.held }

func hostname() string { h, _ := os.Hostname(); return h }

// NoSandboxError: no persistent sandbox has the name asked for, or none is
// this workspace's.
type NoSandboxError struct {
	Name      string
	Workspace string
}

func (e *NoSandboxError) Error() string {
	if e.Name != "" {
		return fmt.Sprintf("no persistent sandbox is named %s", e.Name)
	}
	return fmt.Sprintf("no persistent sandbox is of %s", e.Workspace)
}

// SeveralError: the workspace has several persistent sandboxes, and no
// name said which.
type SeveralError struct {
	Workspace string
	Names     []string
}

func (e *SeveralError) Error() string {
	return fmt.Sprintf("%s has %d persistent sandboxes (%s): say which", e.Workspace, len(e.Names), strings.Join(e.Names, ", "))
}

// Find is the record of the persistent sandbox name, or, when name is "",
// the one of workspace: of the directory, or of the closest directory
// above it that has one.
func Find(dirs hostinfo.Dirs, name, workspace string) (Record, error) {
	if name != "" {
		r, err := readRecord(keepDir(dirs, nameOf(name)))
		if errors.Is(err, os.ErrNotExist) {
			return Record{}, &NoSandboxError{Name: name}
		}
		return r.current(), err
	}
	all, err := Records(dirs)
	if err != nil {
		return Record{}, err
	}
	var mine []Record
	for _, r := range all {
		switch {
		case !fsutil.Within(r.Workspace, workspace):
		case len(mine) == 0 || len(r.Workspace) > len(mine[0].Workspace):
			mine = []Record{r}
		case r.Workspace == mine[0].Workspace:
			mine = append(mine, r)
		}
	}
	switch len(mine) {
	case 0:
		return Record{}, &NoSandboxError{Workspace: workspace}
	case 1:
		return mine[0], nil
	}
	// The directory's own (up without --name), among named ones.
	var own []Record
	for _, r := range mine {
		if r.Default && r.State != StateGone {
			own = append(own, r)
		}
	}
	if len(own) == 1 {
		return own[0], nil
	}
	var names []string
	for _, r := range mine {
		names = append(names, r.Name)
	}
	slices.Sort(names)
	return Record{}, &SeveralError{Workspace: mine[0].Workspace, Names: names}
}

// FindOwn is the directory's own persistent sandbox (up without --name
// made it there), unless it is gone; ok false when it has none.
func FindOwn(dirs hostinfo.Dirs, workspace string) (r Record, ok bool, err error) {
	all, err := Records(dirs)
	if err != nil {
		return Record{}, false, err
	}
	for _, r := range all {
		if r.Default && r.Workspace == workspace && r.State != StateGone {
			return r, true, nil
		}
	}
	return Record{}, false, nil
}

// FindID is the record of the sandbox whose id is id.
func FindID(dirs hostinfo.Dirs, id string) (Record, error) {
	all, err := Records(dirs)
	if err != nil {
		return Record{}, err
	}
	for _, r := range all {
		if r.ID == id {
			return r, nil
		}
	}
	return Record{}, fmt.Errorf("no record of sandbox %s", id)
}

// WorkDir is where in the sandbox a command exec'd from the host directory
// dir runs: the same directory below the workspace's target, when dir is
// in the workspace; else the sandbox's working directory ("").
func (r Record) WorkDir(dir string) string {
	rel, ok := fsutil.Rel(r.Workspace, dir)
	if !ok || rel == "." || r.Target == "" {
		return ""
	}
	return path.Join(r.Target, filepath.ToSlash(rel))
}

// lockExclusive takes the file's lock, exclusive, without waiting: false
// when another process holds it. The lock lasts as long as f.
func lockExclusive(path string) (f *os.File, ok bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, false, err
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		f.Close()
		return nil, false, nil
	}
	if err != nil {
		f.Close()
		return nil, false, err
	}
	return f, true, nil
}

// lockWait bounds how long a process that takes a record's lock waits for
// one that only looks at it (supervisorRuns holds it for a moment).
const lockWait = 2 * time.Second

// takeLock takes the file's lock, exclusive, waiting at most wait for
// another process to let go of it: false when one holds it still. The lock
// lasts as long as the file.
func takeLock(path string, wait time.Duration) (*os.File, bool, error) {
	f, ok, err := lockExclusive(path)
	if err != nil || ok {
		return f, ok, err
	}
	f, err = os.OpenFile(path, os.O_RDWR|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, false, err
	}
	got := make(chan error, 1)
	go func() { got <- syscall.Flock(int(f.Fd()), syscall.LOCK_EX) }()
	select {
	case err := <-got:
		if err != nil {
			f.Close()
			return nil, false, err
		}
		return f, true, nil
	case <-time.After(wait):
		go func() { <-got; f.Close() }() // let go of it whenever it comes
		return nil, false, nil
	}
}

// supervisorRuns reports whether a supervisor holds the sandbox in dir
// now: its lock is held. Looking takes the lock, shared, for a moment.
func supervisorRuns(dir string) bool {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	return errors.Is(syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB), syscall.EWOULDBLOCK)
}
