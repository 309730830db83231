package ask

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/propio/propio-sandbox/internal/fsutil"
)

// Approvers are served from a sandbox's first instant. An approver
// (requests --watch, approve, ui) registers while it runs: it listens on a
// socket of its own in the directory of its workspace under ApproversDir
// (the directory "all" with --all). Before a sandbox that can ask starts,
// its launcher announces it there (Announce): each approver holds the
// sandbox (a lock on a file of its own in the sandbox's ask directory,
// Hold), says so, and starts watching it; the launcher waits for that
// answer, and keeps the connection open while the sandbox runs. A server of
// the sandbox (its gateway, its launcher) that finds no watch attached
// holds a request instead of denying it at once while an approver holds
// the sandbox (Held): the watch on its way finds it pending.

// holdSuffix ends the name of an approver's hold in an ask directory.
const holdSuffix = ".hold"

// ApproversDir is the directory of the registered approvers, beside
// BaseDir: $XDG_RUNTIME_DIR/propio-sandbox/approvers, else under
// $XDG_STATE_HOME.
func ApproversDir() (string, error) {
	base, err := BaseDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(base), "approvers"), nil
}

// approversOf is the directory of the approvers of workspace under dir
// ("all": those of every workspace).
func approversOf(dir, workspace string, all bool) string {
	if all {
		return filepath.Join(dir, "all")
	}
	sum := sha256.Sum256([]byte(workspace))
	return filepath.Join(dir, hex.EncodeToString(sum[:8]))
}

// Registration is an approver's registration: sandboxes that start while
// it is open are announced to it.
type Registration struct {
	workspace string
	all       bool
	dir, name string
	ln        net.Listener
}

// Register registers an approver of workspace's sandboxes (of every one of
// the user's, with all) until Close.
func Register(workspace string, all bool) (*Registration, error) {
	base, err := ApproversDir()
	if err != nil {
		return nil, err
	}
	dir := approversOf(base, workspace, all)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("registering as an approver: %w", err)
	}
	name := randomName() + ".sock"
	ln, err := fsutil.ListenUnix(dir, name, 0o600)
	if err != nil {
		return nil, fmt.Errorf("registering as an approver: %w", err)
	}
	return &Registration{workspace: workspace, all: all, dir: dir, name: name, ln: ln}, nil
}

// Close ends the registration.
func (r *Registration) Close() {
	r.ln.Close()
	os.Remove(filepath.Join(r.dir, r.name))
}

// announcement is what a launcher sends an approver, one JSON line; the
// approver answers "ok\n" once it holds the sandbox.
type announcement struct {
	Dir string `json:"dir"`
}

// announceWait bounds an announcement: a launcher does not wait longer for
// an approver's answer, nor an approver for the announcement.
const announceWait = 3 * time.Second

// Serve takes up each sandbox announced to r until ctx ends or r is
// closed: it holds the sandbox, answers, and calls take(ctx, s) in a
// goroutine of its own, with a ctx that ends when the sandbox's launcher
// hangs up (the sandbox ended) or Serve's does. The hold lasts as long.
func (r *Registration) Serve(ctx context.Context, take func(ctx context.Context, s Sandbox)) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, func() { r.ln.Close() })
	defer stop()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("serving as an approver: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			r.takeUp(ctx, c, take)
		}()
	}
}

// takeUp serves one announcement on c.
func (r *Registration) takeUp(ctx context.Context, c net.Conn, take func(context.Context, Sandbox)) {
	c.SetDeadline(time.Now().Add(announceWait))
	br := bufio.NewReader(c)
	line, err := br.ReadBytes('\n')
	if err != nil {
		return
	}
	var a announcement
	if json.Unmarshal(line, &a) != nil {
		return
	}
	s, err := r.announced(a.Dir)
	if err != nil {
		return
	}
	release, err := s.Hold()
	if err != nil {
		return
	}
	defer release()
	if _, err := c.Write([]byte("ok\n")); err != nil {
		return
	}
	c.SetDeadline(time.Time{})
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		br.WriteTo(discard{}) // until the launcher hangs up
		cancel()
	}()
	go take(ctx, s)
	<-ctx.Done()
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// announced is the sandbox of the ask directory dir, when it is one of the
// user's ask directories and of a workspace r serves.
func (r *Registration) announced(dir string) (Sandbox, error) {
	base, err := BaseDir()
	if err != nil {
		return Sandbox{}, err
	}
	if filepath.Dir(dir) != base {
		return Sandbox{}, fmt.Errorf("%s is not an ask directory", dir)
	}
	s, err := Open(dir)
	if err != nil {
		return Sandbox{}, err
	}
	if !r.all && s.Workspace != r.workspace {
		return Sandbox{}, fmt.Errorf("%s is a sandbox of %s", s.Project, s.Workspace)
	}
	return s, nil
}

// Announce announces s, about to start, to the approvers registered for
// its workspace and for all, and waits until each holds it (at most
// announceWait). It returns how many hold it, and hangup, which ends the
// announcements: call it when the sandbox has ended. A registration whose
// approver is gone is removed.
func Announce(s Sandbox) (held int, hangup func()) {
	base, err := ApproversDir()
	if err != nil {
		return 0, func() {}
	}
	line, _ := json.Marshal(announcement{Dir: s.Dir})
	line = append(line, '\n')
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	for _, dir := range []string{approversOf(base, s.Workspace, false), approversOf(base, "", true)} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if !strings.HasSuffix(e.Name(), ".sock") {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := announce(dir, e.Name(), line)
				if errors.Is(err, syscall.ECONNREFUSED) {
					os.Remove(filepath.Join(dir, e.Name())) // its approver is gone
				}
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return len(conns), func() {
		for _, c := range conns {
			c.Close()
		}
	}
}

// announce sends line to the approver listening on dir/name, and returns
// the connection once it has answered that it holds the sandbox.
func announce(dir, name string, line []byte) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), announceWait)
	defer cancel()
	c, err := fsutil.DialUnix(ctx, dir, name)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(announceWait))
	if _, err := c.Write(line); err != nil {
		c.Close()
		return nil, err
	}
	answer, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || answer != "ok\n" {
		c.Close()
		return nil, fmt.Errorf("the approver at %s did not take the sandbox up: %q %v", name, answer, err)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}

// Hold holds s as its approver, until release: its servers hold a request
// that finds no watch attached, for the watch on its way (Held).
func (s Sandbox) Hold() (release func(), err error) {
	path := filepath.Join(s.Dir, "approver-"+randomName()+holdSuffix)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("holding %s: %w", s.Project, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("holding %s: %w", s.Project, err)
	}
	return func() { os.Remove(path); f.Close() }, nil
}

// Held reports whether an approver holds the sandbox of the ask directory
// dir: whether a process holds the lock of one of its holds. A hold whose
// approver is gone (killed) holds nothing.
func Held(dir string) bool {
	holds, _ := filepath.Glob(filepath.Join(dir, "*"+holdSuffix))
	for _, path := range holds {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		f.Close() // and its lock with it
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return true
		}
	}
	return false
}

func randomName() string {
	b := make([]byte, 8)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Follow watches, as their approver, the sandboxes of workspace (every one
// of the user's, with all): those running now, and, from their first
// instant, those announced to reg (when not nil) as they start; it looks
// for others every rescan. fn gets their events, never two at once; ready
// is called once the sandboxes running at first are attached. It ends when
// ctx does (nil), or when the sandboxes cannot be listed.
func Follow(ctx context.Context, workspace string, all bool, reg *Registration, rescan time.Duration, ready func(), fn func(Event)) error {
	var mu sync.Mutex
	serial := func(ev Event) { mu.Lock(); defer mu.Unlock(); fn(ev) }
	watching := map[string]bool{} // by ask directory, under wmu
	var wmu sync.Mutex
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // before the wait
	// watch watches s, unless it is watched already, until ctx or the
	// watch ends; attached is called once it is attached.
	watch := func(ctx context.Context, s Sandbox, attached func()) {
		wmu.Lock()
		if watching[s.Dir] {
			wmu.Unlock()
			attached()
			return
		}
		watching[s.Dir] = true
		wmu.Unlock()
		_ = s.WatchAttached(ctx, attached, serial)
		wmu.Lock()
		delete(watching, s.Dir)
		wmu.Unlock()
	}
	if reg != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reg.Serve(ctx, func(ctx context.Context, s Sandbox) { watch(ctx, s, func() {}) })
		}()
	}
	tick := time.NewTicker(rescan)
	defer tick.Stop()
	for first := true; ; first = false {
		sbs, err := Find(workspace, all)
		if err != nil {
			return err
		}
		var attached sync.WaitGroup
		for _, s := range sbs {
			wmu.Lock()
			known := watching[s.Dir]
			wmu.Unlock()
			if known {
				continue
			}
			attached.Add(1)
			wg.Add(1)
			go func() {
				defer wg.Done()
				watch(ctx, s, sync.OnceFunc(attached.Done))
			}()
		}
		if first {
			attached.Wait()
			ready()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}
