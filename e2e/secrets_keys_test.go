package e2e

// Where the run's CA lives, and the secrets of sandboxes that are not cold
// runs: a gateway prepared ahead, a persistent sandbox started again.

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// keyWatch watches directories of the host, and those made in them, for
// files written there that hold a private key: the run's CA's key must
// never leave its gateway's memory. It reads each file as it is closed
// after writing or moved into place, and notes the names of all, so that a
// test can tell it watched something.
type keyWatch struct {
	f    *os.File
	mu   sync.Mutex
	seen map[string]bool
	dirs map[string]bool // watched
	keys []string
	done chan struct{}
}

func watchForKeys(t *testing.T, dirs ...string) *keyWatch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatalf("inotify: %v", err)
	}
	w := &keyWatch{f: os.NewFile(uintptr(fd), "inotify"), seen: map[string]bool{}, dirs: map[string]bool{}, done: make(chan struct{})}
	paths := map[int32]string{}
	add := func(dir string) {
		wd, err := unix.InotifyAddWatch(fd, dir, unix.IN_CREATE|unix.IN_CLOSE_WRITE|unix.IN_MOVED_TO)
		if err == nil {
			w.mu.Lock()
			paths[int32(wd)] = dir
			w.dirs[dir] = true
			w.mu.Unlock()
		}
	}
	var look func(path string)
	look = func(path string) {
		fi, err := os.Lstat(path)
		if err != nil {
			return
		}
		if fi.IsDir() {
			add(path)
			ents, _ := os.ReadDir(path) // what was made before the watch
			for _, e := range ents {
				look(filepath.Join(path, e.Name()))
			}
			return
		}
		b, _ := os.ReadFile(path)
		w.mu.Lock()
		defer w.mu.Unlock()
		if strings.Contains(string(b), "PRIVATE KEY") {
			w.keys = append(w.keys, path)
		}
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		look(d)
	}
	go func() {
		defer close(w.done)
		buf := make([]byte, 64<<10)
		for {
			n, err := w.f.Read(buf)
			if err != nil {
				return
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(ptrAt(buf, off))
				name := strings.TrimRight(string(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)]), "\x00")
				off += unix.SizeofInotifyEvent + int(ev.Len)
				w.mu.Lock()
				dir := paths[ev.Wd]
				w.seen[name] = true // it may be gone before it is read (a run's file, taken)
				w.mu.Unlock()
				if dir != "" && name != "" {
					look(filepath.Join(dir, name))
				}
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// await waits, a bounded time, until cond holds of what the watch saw.
func (w *keyWatch) await(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		ok := cond()
		w.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch did not see it within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// stop ends the watch, and returns the files that held a key, and the
// names of the files it saw.
func (w *keyWatch) stop() (keys []string, seen map[string]bool) {
	w.f.Close()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.keys, w.seen
}

// TestKeyWatch: the watch finds a key written into a directory made under
// a watched one, and one moved into place.
func TestKeyWatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	w := watchForKeys(t, dir)
	sub := filepath.Join(dir, "proj")
	os.Mkdir(sub, 0o700)
	w.await(t, func() bool { return w.dirs[sub] })
	os.WriteFile(filepath.Join(sub, "key.pem"), []byte("-----BEGIN PRIVATE KEY-----\n"), 0o600)
	os.WriteFile(filepath.Join(dir, ".tmp"), []byte("-----BEGIN PRIVATE KEY-----\n"), 0o600)
	os.Rename(filepath.Join(dir, ".tmp"), filepath.Join(dir, "moved.pem"))
	os.WriteFile(filepath.Join(sub, "cert.pem"), []byte("-----BEGIN CERTIFICATE-----\n"), 0o644)
	w.await(t, func() bool { return w.seen["cert.pem"] && w.seen["moved.pem"] })
	keys, seen := w.stop()
	if !slices.Contains(keys, filepath.Join(sub, "key.pem")) || !seen["moved.pem"] || !seen["cert.pem"] {
		t.Errorf("the watch found keys in %v and saw %v", keys, seen)
	}
	for _, k := range keys {
		if strings.HasSuffix(k, "cert.pem") {
			t.Errorf("a certificate taken for a key: %s", k)
		}
	}
}

// brokerAndCADirs are the broker and trust files' directories of a
// sandbox's user (no XDG_RUNTIME_DIR in the tests).
func brokerAndCADirs(s *sandbox) []string {
	base := filepath.Join(s.Home, ".local", "state", "propio-sandbox")
	return []string{filepath.Join(base, "broker"), filepath.Join(base, "ca")}
}

// TestPreparedSecrets: a gateway prepared ahead for a profile that brokers
// a secret (as strict and standard do) is adopted by the next run, which
// gets its secrets through it over TLS the prepared gateway terminates
// with the CA it made; no private key is ever written on the host.
func TestPreparedSecrets(t *testing.T) {
	s := newSandbox(t)
	if testenv.EnginePodman(t) {
		t.Skip("no gateway is prepared ahead on Podman: its internal networks do not keep the host out, and a fenced sandbox's namespace is made with its run")
	}
	requireAgentImage(t)
	s.uniqueWorkspace()
	// The internet first: its cleanup runs after gc --prepared has removed
	// the gateway prepared on it.
	in := startBrokerInternet(t)
	s.Prepared()
	value := "sk-e2e-" + randomID() + randomID()
	s.Env = append(s.Env, "HOST_LLM_TOKEN="+value, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	p := s.Profile(fmt.Sprintf(brokerProfile, in.CADir))
	keys := watchForKeys(t, brokerAndCADirs(s)...)

	curl := `curl -sS --fail https://llm.test/h/%s -H "Authorization: Bearer $LLM_TOKEN"`
	r := s.Run("", "run", "-p", p, "--", "bash", "-c", fmt.Sprintf(curl, "cold"))
	if r.Code != 0 {
		t.Fatalf("the first run:\n%s", r)
	}
	s.WaitBackground()
	gws := preparedGateways(t, s)
	if len(gws) != 1 {
		t.Fatalf("prepared gateways after the first run: %v, want one", gws)
	}
	gw := gws[0]

	l := cleanupStart(t, s, "run", "-p", p, "--", "bash", "-c", "echo ready; sleep 60")
	l.waitStdout(t, "ready", time.Minute)
	agent, project := agentOf(t, s)
	if project != gw.project {
		t.Fatalf("the run is sandbox %s, want the prepared %s", project, gw.project)
	}
	out, err := docker("exec", agent, "bash", "-c", fmt.Sprintf(curl, "warm"))
	if err != nil {
		t.Fatalf("a brokered request through the adopted gateway: %v\n%s", err, out)
	}
	for _, path := range []string{"cold", "warm"} {
		want := fmt.Sprintf(`GET /h/%s authorization="Bearer %s"`, path, value)
		if !strings.Contains(in.Logs("upstream"), want) {
			t.Errorf("the server never got %q:\n%s", want, in.Logs("upstream"))
		}
	}
	if env, _ := docker("exec", agent, "printenv", "LLM_TOKEN"); !strings.HasPrefix(env, "propio-sentinel-LLM_TOKEN-") {
		t.Errorf("LLM_TOKEN in the adopted run is %q, want a sentinel", env)
	}
	l.signal(t, syscall.SIGTERM)
	l.wait(t, time.Minute)
	s.WaitBackground()
	bad, seen := keys.stop()
	if len(bad) > 0 {
		t.Errorf("a private key was written on the host: %v", bad)
	}
	if !seen["ca.pem"] || !seen["run.json"] || !seen["bundle.pem"] {
		t.Errorf("the watch saw %v: not the gateway's certificate, the run's file and the trust files", seen)
	}
}

// TestPersistentSecrets: a persistent sandbox's secrets are brokered after
// up, and again once it is stopped and started (its gateway starts again
// with a new CA, which the sandbox trusts, and gets the values again); its
// sentinel stays what up made; no private key is ever written on the host.
func TestPersistentSecrets(t *testing.T) {
	t.Parallel()
	requireAgentImage(t)
	s := newSandbox(t)
	in := startBrokerInternet(t)
	value := "sk-e2e-" + randomID() + randomID()
	s.Env = append(s.Env, "HOST_LLM_TOKEN="+value, "PROPIO_SANDBOX_GATEWAY_NETWORK="+in.Network)
	keys := watchForKeys(t, brokerAndCADirs(s)...)
	p := up(t, s, s.Profile(fmt.Sprintf(brokerProfile, in.CADir)))
	brokered := func(path string) (sentinel, ca string) {
		t.Helper()
		r := p.exec("", "bash", "-c", `curl -sS --fail https://llm.test/h/`+path+` -H "Authorization: Bearer $LLM_TOKEN" && printenv LLM_TOKEN && cat /run/propio-sandbox-ca/ca.pem`)
		if r.Code != 0 {
			t.Fatalf("%s: a brokered request:\n%s", path, r)
		}
		want := fmt.Sprintf(`GET /h/%s authorization="Bearer %s"`, path, value)
		if !strings.Contains(in.Logs("upstream"), want) {
			t.Errorf("the server never got %q", want)
		}
		sentinel, ca, _ = strings.Cut(r.Stdout[strings.Index(r.Stdout, "propio-sentinel-"):], "\n")
		return sentinel, ca
	}
	s1, ca1 := brokered("up")
	if r := s.Run("", "stop", p.name); r.Code != 0 {
		t.Fatalf("stop:\n%s", r)
	}
	if r := s.Run("", "start", p.name); r.Code != 0 {
		t.Fatalf("start:\n%s", r)
	}
	s2, ca2 := brokered("start")
	if s1 != s2 || !strings.HasPrefix(s1, "propio-sentinel-LLM_TOKEN-") {
		t.Errorf("the sentinel after up %q, after start %q: want one sentinel", s1, s2)
	}
	if ca1 == ca2 {
		t.Error("the gateway started again has the CA it had: its key was kept somewhere")
	}
	if r := s.Run("", "down", p.name); r.Code != 0 {
		t.Fatalf("down:\n%s", r)
	}
	bad, seen := keys.stop()
	if len(bad) > 0 {
		t.Errorf("a private key was written on the host: %v", bad)
	}
	if !seen["ca.pem"] || !seen["run.json"] {
		t.Errorf("the watch saw %v: not the gateway's certificate and the run's file", seen)
	}
	if strings.Contains(s.Run("", "ls").Stdout, value) {
		t.Error("ls shows the value")
	}
}

// ptrAt is the address of buf[off], for reading an inotify event there.
func ptrAt(buf []byte, off int) unsafe.Pointer { return unsafe.Pointer(&buf[off]) }
