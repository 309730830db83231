package e2e

// The disk cap of a writable layer on engines whose storage differs from
// the tests' engine: a Docker daemon of the test's own, on a loop file
// system it makes (btrfs, where the engine caps a writable layer and
// writes past it fail inside; xfs without project quotas, where it cannot
// and the launcher watches), with its own socket, data and exec roots, no
// bridge and no iptables, in a network namespace of its own: a dockerd
// with --bridge=none deletes the host's docker0 when it starts (the host's
// engine then cannot attach containers to its default bridge). Everything
// it made is removed when the test ends, however it ends, and the host's
// docker0 is checked to be still there.

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ownEngine starts a Docker daemon of the test's own whose data root is on
// a fresh file system of type fstype (btrfs, xfs) with the storage driver
// driver, loads image into it, and returns its DOCKER_HOST. It needs root
// and dockerd; without them it skips, saying why (fails with
// PROPIO_E2E=require).
func ownEngine(t *testing.T, fstype, driver, image string) string {
	t.Helper()
	return startOwnEngine(t, fstype, driver, image).Host
}

// ownDockerd is a Docker daemon of the test's own.
type ownDockerd struct {
	Host   string // its DOCKER_HOST
	Config string // its configuration file, which a SIGHUP has it read again
	Proc   *os.Process
}

// startOwnEngine is ownEngine, with the daemon's configuration file and
// process.
func startOwnEngine(t *testing.T, fstype, driver, image string) *ownDockerd {
	t.Helper()
	missing := func(why string) {
		t.Helper()
		if os.Getenv("PROPIO_E2E") == "require" {
			t.Fatalf("PROPIO_E2E=require, but %s", why)
		}
		t.Skipf("skipping: %s; set PROPIO_E2E=require to fail instead", why)
	}
	if os.Geteuid() != 0 {
		missing("a Docker daemon of the test's own on a loop file system needs root")
	}
	for _, tool := range []string{"dockerd", "containerd", "unshare", "losetup", "mount", "umount", "mkfs." + fstype} {
		if _, err := exec.LookPath(tool); err != nil {
			missing(tool + " is not installed")
		}
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}

	if _, err := net.InterfaceByName("docker0"); err == nil {
		t.Cleanup(func() {
			if _, err := net.InterfaceByName("docker0"); err != nil {
				t.Errorf("the host's docker0 is gone after the test's dockerd: %v", err)
			}
		})
	}
	// A short base: the daemon's sockets must fit in a socket address.
	base, err := os.MkdirTemp("", "psd-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	img, root, execRoot := filepath.Join(base, "fs.img"), filepath.Join(base, "root"), filepath.Join(base, "exec")
	for _, d := range []string{root, execRoot} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Truncate(img, 2<<30); err != nil { // sparse: only what is written takes space
		t.Fatal(err)
	}
	run("mkfs."+fstype, "-q", img)
	loop := run("losetup", "--find", "--show", img)
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", loop).CombinedOutput(); err != nil {
			t.Errorf("detaching %s: %v %s", loop, err, out)
		}
	})
	run("mount", loop, root)
	t.Cleanup(func() {
		for i := 0; ; i++ {
			out, err := exec.Command("umount", root).CombinedOutput()
			if err == nil {
				return
			}
			if i == 20 {
				t.Errorf("unmounting %s: %v %s; detaching it lazily", root, err, out)
				exec.Command("umount", "-l", root).Run()
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	})

	config := filepath.Join(base, "daemon.json") // not the host's /etc/docker/daemon.json
	if err := os.WriteFile(config, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(base, "docker.sock")
	logf, err := os.Create(filepath.Join(base, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	d := exec.Command("unshare", "--net", "--", "dockerd",
		"--config-file", config,
		"--data-root", filepath.Join(root, "docker"),
		"--exec-root", execRoot,
		"--pidfile", filepath.Join(base, "docker.pid"),
		"--host", "unix://"+sock,
		"--storage-driver", driver,
		"--bridge=none", "--iptables=false", "--ip6tables=false")
	d.Stdout, d.Stderr = logf, logf
	d.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := d.Start(); err != nil {
		t.Fatalf("starting dockerd: %v", err)
	}
	exited := make(chan struct{})
	go func() { d.Wait(); close(exited) }()
	t.Cleanup(func() {
		d.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(30 * time.Second):
			t.Errorf("dockerd did not stop in 30s; killing it")
			syscall.Kill(-d.Process.Pid, syscall.SIGKILL)
			<-exited
		}
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logf.Name()); err == nil {
				t.Logf("dockerd's log:\n%s", b)
			}
		}
	})
	host := "unix://" + sock
	for deadline := time.Now().Add(time.Minute); ; {
		if out, err := exec.Command("docker", "-H", host, "info", "--format", "{{.Driver}}").Output(); err == nil {
			if got := strings.TrimSpace(string(out)); got != driver {
				t.Fatalf("the test's dockerd runs storage driver %q, want %q", got, driver)
			}
			break
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			t.Fatalf("dockerd exited:\n%s", b)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("dockerd did not answer within a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	load := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("docker save %s | docker -H %s load", image, host))
	if out, err := load.CombinedOutput(); err != nil {
		t.Fatalf("loading %s into the test's dockerd: %v\n%s", image, err, out)
	}
	return &ownDockerd{Host: host, Config: config, Proc: d.Process}
}

// ownSandbox is a sandbox on the engine at host, with the tests' disk cap,
// checked in cleanup for leftovers on that engine.
func ownSandbox(t *testing.T, host string) *sandbox {
	t.Helper()
	requireEngine(t)
	s := makeSandbox(t)
	s.Env = append(s.Env, "DOCKER_HOST="+host, "PROPIO_SANDBOX_TEST_DISK="+diskCap)
	t.Cleanup(func() {
		s.WaitBackground()
		label := "label=dev.propio-sandbox.workspace=" + s.Workspace
		for _, kind := range [][]string{{"ps", "-a", "-q"}, {"network", "ls", "-q"}, {"volume", "ls", "-q"}} {
			out, err := exec.Command("docker", append([]string{"-H", host}, append(kind, "--filter", label)...)...).CombinedOutput()
			if err != nil || strings.TrimSpace(string(out)) != "" {
				t.Errorf("left behind on the test's engine (%v): %v %s", kind, err, out)
			}
		}
	})
	return s
}

// On btrfs the engine caps the writable layer (a qgroup): a write past the
// cap fails inside, and the sandbox's own code is the launcher's. doctor
// says the engine holds it.
func TestDiskWritableLayerQuota(t *testing.T) {
	requireEngine(t)
	image := diskProbe(t)
	host := ownEngine(t, "btrfs", "btrfs", image)
	s := ownSandbox(t, host)
	p := s.Profile("image: " + image + "\n" + probeOffline)

	r := s.Run("", "doctor", "-p", p)
	if !strings.Contains(r.Stdout, "writable layer: capped by the engine") {
		t.Errorf("doctor does not say that the engine caps the writable layer:\n%s", r)
	}
	r = probeRun(s, p, "fs", "fill /under 32m", "fill /over "+diskOver)
	if !strings.Contains(r.Stdout, "filled /under 33554432") {
		t.Errorf("a write under the cap did not succeed:\n%s", r)
	}
	if r.Code != 1 || !(strings.Contains(r.Stdout, "disk quota exceeded") || strings.Contains(r.Stdout, "no space left on device")) {
		t.Fatalf("want the write past the cap to fail inside (EDQUOT or ENOSPC), and the probe's exit 1:\n%s", r)
	}
}

// On xfs without project quotas the engine cannot cap the writable layer:
// doctor says why, and the launcher's watch stops the sandbox instead.
func TestDiskWritableLayerNoQuota(t *testing.T) {
	requireEngine(t)
	image := diskProbe(t)
	host := ownEngine(t, "xfs", "overlay2", image)
	s := ownSandbox(t, host)
	p := s.Profile("image: " + image + "\n" + probeOffline)

	r := s.Run("", "doctor", "-p", p)
	if !strings.Contains(r.Stdout, "overlay2 on xfs without project quotas") {
		t.Errorf("doctor does not say why the engine cannot cap the writable layer:\n%s", r)
	}
	start := time.Now()
	r = probeRun(s, p, "fs", "fill /big "+diskOver, "sleep 60s")
	stoppedByCap(t, r, "its writable layer", time.Since(start))
}

// TestEngineInfoFollowsReload: a launch takes the engine's facts from what
// the same engine process said before (its info costs each launch a round
// trip of about 9 ms), until the engine reads its configuration file
// again: a runtime added to it and loaded with a SIGHUP is seen by the
// next launch, which a stale copy of the facts would refuse.
func TestEngineInfoFollowsReload(t *testing.T) {
	requireEngine(t)
	e := startOwnEngine(t, "xfs", "overlay2", ProbeImage)
	s := ownSandbox(t, e.Host)
	p := s.Profile(probeOffline + "security: {runtime: propio-test-runtime}\n")

	preflightRefused(t, s, probeRun(s, p, "echo", "ran"), "runtime", `no runtime "propio-test-runtime"`)
	// Kept, and given back to the next launch while nothing changed.
	preflightRefused(t, s, probeRun(s, p, "echo", "ran"), "runtime", `no runtime "propio-test-runtime"`)

	runc, err := exec.LookPath("runc")
	if err != nil {
		t.Fatalf("the engine's runc: %v", err)
	}
	conf := fmt.Sprintf(`{"runtimes": {"propio-test-runtime": {"path": %q}}}`+"\n", runc)
	if err := os.WriteFile(e.Config, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := e.Proc.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		out, _ := exec.Command("docker", "-H", e.Host, "info", "--format", "{{json .Runtimes}}").Output()
		if strings.Contains(string(out), "propio-test-runtime") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the test's dockerd did not load the runtime in 30 s: %s", out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	probeOK(t, probeRun(s, p, "clock"), "clock ")
}
