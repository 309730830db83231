package e2e

// resources.disk against the real engine: what the sandbox writes past the
// cap fails inside where the kernel or the engine's storage can say so
// (/tmp and HOME, tmpfs; a writable layer on btrfs, on an engine of the
// test's own), and elsewhere the launcher stops the sandbox (exit 122) with
// a message naming the place, leaving the workspace as the sandbox left it
// and a changeset reviewable. The cap is lowered for tests with
// PROPIO_SANDBOX_TEST_DISK, so that a few tens of MB reach it.

import (
	"archive/tar"
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// diskCap is the tests' cap, and over is a write past it.
const (
	diskCap  = "64m"
	diskOver = "100m"
)

// diskProbe is the probe image, or, given Dockerfile lines, an image of
// the test's own made from it with them (removed when the test ends). Its
// build context has scratch.tar, a directory scratch/ that anyone may
// write (ADD keeps its mode): a place in the writable layer where the
// sandbox's user can write on any engine (Podman makes / itself 0555).
func diskProbe(t *testing.T, lines ...string) string {
	t.Helper()
	if len(lines) == 0 {
		return ProbeImage
	}
	dir := t.TempDir()
	var tarball bytes.Buffer
	tw := tar.NewWriter(&tarball)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "scratch/", Mode: 0o1777}); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	if err := os.WriteFile(filepath.Join(dir, "scratch.tar"), tarball.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	df := "FROM " + ProbeImage + "\n" + strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(df), 0o644); err != nil {
		t.Fatal(err)
	}
	image := "propio-sandbox-e2e/probe-disk:" + randomID()
	if out, err := docker("build", "-q", "-t", image, dir); err != nil {
		t.Fatalf("building %s: %v\n%s", image, err, out)
	}
	t.Cleanup(func() { docker("rmi", "-f", image) })
	return image
}

// diskSandbox is a sandbox whose disk cap is diskCap, running diskProbe.
func diskSandbox(t *testing.T) (*sandbox, string) {
	t.Helper()
	s := newSandbox(t)
	s.Env = append(s.Env, "PROPIO_SANDBOX_TEST_DISK="+diskCap)
	return s, diskProbe(t)
}

// stoppedByCap fails the test unless the launcher stopped the sandbox for
// writing more than the cap to where, soon, with exit 122 and its hint.
func stoppedByCap(t *testing.T, r Result, where string, took time.Duration) {
	t.Helper()
	want := "propio-sandbox: error: the sandbox wrote more than PROPIO_SANDBOX_TEST_DISK (" + diskCap + ") to " + where + "; stopped"
	if r.Code != 122 || !strings.Contains(r.Stderr, want) || !strings.Contains(r.Stderr, "propio-sandbox: hint: ") {
		t.Fatalf("want exit 122 and %q with a hint:\n%s", want, r)
	}
	if took > 30*time.Second {
		t.Errorf("the sandbox was stopped after %s: the watch should see it within seconds", took)
	}
}

// /tmp and HOME are tmpfs of the cap (the smaller of resources.tmp and
// resources.disk): a write past it fails inside with ENOSPC, a write under
// it succeeds.
func TestDiskTmpAndHome(t *testing.T) {
	s, image := diskSandbox(t)
	p := s.Profile("image: " + image + "\n" + probeOffline)
	for _, dir := range []string{"/tmp", "/home/sandbox"} {
		r := probeRun(s, p, "fs", "fill "+dir+"/under 32m", "fill "+dir+"/over "+diskOver)
		if !strings.Contains(r.Stdout, "filled "+dir+"/under 33554432") {
			t.Errorf("a write under the cap in %s did not succeed:\n%s", dir, r)
		}
		probeFails(t, r, "no space left on device")
	}
}

// A writable layer on an engine whose storage cannot cap it (overlay2 on
// ext4 here) is watched: the sandbox is stopped past the cap, with the
// place named, and nothing of it is left behind; a file deleted but held
// open counts too.
func TestDiskWritableLayerWatched(t *testing.T) {
	s, _ := diskSandbox(t)
	if out, _ := docker("info", "--format", "{{.Driver}}"); strings.TrimSpace(out) == "btrfs" || strings.TrimSpace(out) == "zfs" {
		t.Skipf("the engine's storage (%s) caps writable layers itself: TestDiskWritableLayerQuota covers it", strings.TrimSpace(out))
	}
	image := diskProbe(t, "ADD scratch.tar /")
	p := s.Profile("image: " + image + "\n" + probeOffline)
	start := time.Now()
	r := probeRun(s, p, "fs", "fill /scratch/big "+diskOver, "sleep 60s")
	stoppedByCap(t, r, "its writable layer", time.Since(start))

	t.Run("held open", func(t *testing.T) {
		start := time.Now()
		r := probeRun(s, p, "fs", "hold /scratch/hidden "+diskOver, "sleep 60s")
		stoppedByCap(t, r, "its writable layer", time.Since(start))
	})
}

// An image that declares a VOLUME gets a volume of the engine's there,
// which no storage option caps: it is watched, and the sandbox stopped past
// the cap.
func TestDiskImageVolume(t *testing.T) {
	s, _ := diskSandbox(t)
	image := diskProbe(t, "VOLUME /data")
	p := s.Profile("image: " + image + "\n" + probeOffline + "user: root\nunsafe: [root-user]\n")
	start := time.Now()
	r := probeRun(s, p, "fs", "fill /data/big "+diskOver, "sleep 60s")
	stoppedByCap(t, r, "its image's volumes", time.Since(start))
}

// An rw workspace is watched: past the cap the sandbox is stopped, and the
// workspace keeps what it wrote before, intact; hiding what it wrote (a
// file deleted but held open) does not get past the watch; the launcher's
// own state is fine (the next run works, nothing is listed).
func TestDiskWorkspaceWatched(t *testing.T) {
	s, image := diskSandbox(t)
	p := s.Profile("image: " + image + "\n" + probeOffline)
	start := time.Now()
	r := probeRun(s, p, "fs", "write before.txt written before the cap\n", "fill first 40m", "fill second 40m", "sleep 60s")
	stoppedByCap(t, r, "the workspace", time.Since(start))
	if b, err := os.ReadFile(filepath.Join(s.Workspace, "before.txt")); err != nil || string(b) != "written before the cap\n" {
		t.Errorf("before.txt after the stop: %q, %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(s.Workspace, "first")); err != nil || fi.Size() != 40<<20 {
		t.Errorf("the first fill, complete before the cap: %v, %v", fi, err)
	}

	t.Run("held open", func(t *testing.T) {
		start := time.Now()
		r := probeRun(s, p, "fs", "hold hidden "+diskOver, "sleep 60s")
		stoppedByCap(t, r, "the workspace", time.Since(start))
	})

	if r := probeRun(s, p, "fs", "write after.txt fine\n"); r.Code != 0 || !strings.Contains(r.Stdout, "done 1") {
		t.Errorf("a run after the stop (under the cap: the next run starts from a new baseline):\n%s", r)
	}
	s.WaitBackground()
	if r := s.Run("", "ls"); r.Code != 0 || strings.Contains(r.Stdout, " "+s.Workspace+" ") {
		t.Errorf("ls after the stops lists the workspace's sandboxes:\n%s", r)
	}
}

// A changeset stopped by the cap is sealed and reviewable, as after a
// timeout: diff shows what the sandbox wrote before the stop; the
// workspace is untouched.
func TestDiskChangeset(t *testing.T) {
	for _, mode := range changesetModes {
		t.Run(mode, func(t *testing.T) {
			s, image := diskSandbox(t)
			s.Env = append(s.Env, "PROPIO_SANDBOX_CHANGESET_MODE="+mode)
			writeTree(t, s.Workspace, seed)
			before := exactState(t, s.Workspace)
			p := s.Profile("image: " + image + "\n" + probeOffline)
			start := time.Now()
			r := s.Run("", "run", "-p", p, "--changeset", "--", "fs", "write before-cap.txt kept\n", "fill big "+diskOver, "sleep 60s")
			if r.Code != 0 && strings.Contains(r.Stderr, "cannot mount an overlay here") {
				t.Skip(r.Stderr)
			}
			stoppedByCap(t, r, "its changeset", time.Since(start))
			m := changesetID.FindStringSubmatch(r.Stderr)
			if m == nil {
				t.Fatalf("no changeset after the stop:\n%s", r)
			}
			stat := cli(t, s, "diff", "--stat", m[1]).Stdout
			if !strings.Contains(stat, "before-cap.txt") || !strings.Contains(stat, "big") {
				t.Errorf("diff --stat after the stop lacks what was written:\n%s", stat)
			}
			if after := exactState(t, s.Workspace); treeHash(after) != treeHash(before) {
				t.Errorf("the workspace changed:\n%s", treeDiff(before, after))
			}
		})
	}
}

// A launcher that is not root cannot read the engine's directories: the
// engine measures the writable layer (its size of it) and a copy's volume
// (its disk usage) instead, at intervals, and the sandbox is stopped all
// the same. Run as root, the test becomes uid 4243 with the engine
// socket's group.
func TestDiskNotRootLauncher(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to become another user")
	}
	const id = 4243
	for _, tc := range []struct {
		name, profile, where string
		args                 []string
	}{
		// As root inside: the image's / is root's.
		{"writable layer", "user: root\nunsafe: [root-user]\n", "its writable layer", []string{"fs", "fill /big " + diskOver, "sleep 60s"}},
		{"copy", "", "its changeset", []string{"fs", "fill big " + diskOver, "sleep 60s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, image := diskSandbox(t)
			s.Env = append(s.Env, "PROPIO_SANDBOX_CHANGESET_MODE=copy")
			p := s.Profile("image: " + image + "\n" + probeOffline + tc.profile)
			sockGID := isolationSocketGID(t)
			bin := isolationUserLauncher(t, s, id)
			os.Chmod(filepath.Dir(p), 0o755)
			args := []string{"run", "-p", p}
			if tc.name == "copy" {
				args = append(args, "--changeset")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := s.Command(ctx, append(append(args, "--"), tc.args...)...)
			cmd.Path, cmd.Args[0] = bin, bin
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: id, Gid: id, Groups: []uint32{sockGID}}}
			start := time.Now()
			r := runCmd(t, ctx, cmd)
			stoppedByCap(t, r, tc.where, time.Since(start))
		})
	}
}

// What the agent prints goes to the user as it comes, and the engine keeps
// at most 10m of it (json-file with max-size, on every container of a
// sandbox): printing far past the cap grows no log on the host.
func TestDiskStdout(t *testing.T) {
	s, image := diskSandbox(t)
	p := s.Profile("image: " + image + "\n" + probeOffline)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out := &outputCount{mark: []byte("flooded\n"), seen: make(chan struct{})}
	var stderr testenv.Buffer
	cmd := s.Command(ctx, "run", "-p", p, "--", "flood", diskOver)
	cmd.Stdout, cmd.Stderr = out, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	select {
	case <-out.seen:
	case <-time.After(time.Minute):
		t.Fatalf("the sandbox did not print %s within a minute (%d bytes came):\n%s", diskOver, out.count(), stderr.String())
	}
	t.Logf("%d bytes printed, in %s", out.count(), time.Since(start).Round(time.Millisecond))
	id, _ := agentOf(t, s)
	f := strings.Split(strings.TrimSpace(mustDocker(t, "inspect", "-f", `{{.HostConfig.LogConfig.Type}}|{{json .HostConfig.LogConfig.Config}}|{{.LogPath}}`, id)), "|")
	if len(f) != 3 || f[2] == "" {
		t.Fatalf("the container's log configuration and path: %q", f)
	}
	t.Logf("the engine's log: driver %s, options %s, at %s", f[0], f[1], f[2])
	// Podman takes json-file as its k8s-file, and says so.
	if !testenv.EnginePodman(t) && (f[0] != "json-file" || !strings.Contains(f[1], `"max-size":"10m"`)) {
		t.Errorf("the container's log is %s with options %s, want json-file of max-size 10m", f[0], f[1])
	}
	fi, err := os.Stat(f[2])
	if err != nil {
		t.Fatalf("the container's log on the host: %v", err)
	}
	t.Logf("the log holds %d bytes", fi.Size())
	if fi.Size() > 11<<20 {
		t.Errorf("the engine's log of the container holds %d bytes after the sandbox printed %s: want 10m at most", fi.Size(), diskOver)
	}
	stop := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	t.Logf("stopped in %s", time.Since(stop).Round(time.Millisecond))
	if want := int64(100 << 20); out.count() < want {
		t.Errorf("the user got %d bytes of the sandbox's output, want the %d it printed", out.count(), want)
	}
}

// outputCount counts the bytes written to it, and closes seen once they end
// with mark.
type outputCount struct {
	mu   sync.Mutex
	n    int64
	tail []byte
	mark []byte
	seen chan struct{}
}

func (o *outputCount) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n += int64(len(b))
	o.tail = append(o.tail, b...)
	if len(o.tail) > 4096 {
		o.tail = o.tail[len(o.tail)-4096:]
	}
	if bytes.HasSuffix(o.tail, o.mark) && o.seen != nil {
		close(o.seen)
		o.seen = nil
	}
	return len(b), nil
}

func (o *outputCount) count() int64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n
}

// A launcher killed (SIGKILL) while its sandbox writes under disk: 1g: its
// watchdog removes the sandbox (an allowlist's gateway and networks too) at
// once, and so does the keeper of a gateway prepared ahead for a run that
// adopted it, so the write stops far short of the cap, where nothing would
// stop it otherwise until its command ended.
func TestDiskKilledLauncher(t *testing.T) {
	const allowlist = "network:\n  mode: allowlist\n  allow: [allowed.test]\n"
	for _, tc := range []struct {
		name, network string
		prepared      bool
	}{
		{"offline", probeOffline, false},
		{"allowlist", allowlist, false},
		{"allowlist on a prepared gateway", allowlist, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSandbox(t)
			p := s.Profile(tc.network + "resources: {disk: 1g}\n")
			if tc.prepared {
				if testenv.EnginePodman(t) {
					t.Skip("no gateway is prepared ahead on Podman")
				}
				s.uniqueWorkspace()
				s.Prepared()
				if r := s.Run("", "run", "-p", p, "--", "exit", "0"); r.Code != 0 {
					t.Fatalf("the run that has a gateway prepared:\n%s", r)
				}
				s.WaitBackground()
			}
			// 2g at 50 MiB/s at most: 40 s unless stopped.
			l := cleanupStart(t, s, "run", "-p", p, "--", "fs", "trickle big 2g")
			l.waitStdout(t, "trickling", time.Minute)
			_, project := agentOf(t, s)
			if gws := preparedGateways(t, s); tc.prepared && (len(gws) == 0 || gws[0].project != project) {
				t.Fatalf("the run is sandbox %s, not on the prepared gateway: %v", project, gws)
			}
			big := filepath.Join(s.Workspace, "big")
			size := func() int64 {
				fi, err := os.Stat(big)
				if err != nil {
					t.Fatal(err)
				}
				return fi.Size()
			}
			for deadline := time.Now().Add(time.Minute); size() < 16<<20; time.Sleep(20 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("the sandbox wrote %d bytes in a minute", size())
				}
			}
			l.signal(t, syscall.SIGKILL)
			l.wait(t, time.Minute)
			killed := time.Now()
			for left := projectLeft(t, project); len(left) > 0; left = projectLeft(t, project) {
				if time.Since(killed) > 10*time.Second {
					t.Fatalf("10 s after its launcher was killed, the sandbox is still there: %v", left)
				}
				time.Sleep(100 * time.Millisecond) // the engine says nothing to the test
			}
			took, written := time.Since(killed), size()
			t.Logf("removed %s after its launcher was killed, having written %d MiB", took.Round(time.Millisecond), written>>20)
			if written >= 1<<30 {
				t.Errorf("the sandbox wrote %d bytes under disk: 1g after its launcher was killed", written)
			}
		})
	}
}

// projectLeft are the containers, networks and volumes of a sandbox.
func projectLeft(t *testing.T, project string) []string {
	t.Helper()
	label := "label=dev.propio-sandbox.project=" + project
	var left []string
	for _, kind := range [][]string{{"ps", "-aq"}, {"network", "ls", "-q"}, {"volume", "ls", "-q"}} {
		left = append(left, strings.Fields(mustDocker(t, append(kind, "--filter", label)...))...)
	}
	return left
}
