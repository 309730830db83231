package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// RemoteDocker is a private dockerd (see PrivateDocker) reached as an
// engine on another machine is: through ssh:// (Debian's sshd on this
// host's loopback, whose key runs `docker system dial-stdio` against the
// engine's socket) and through tcp:// with mutual TLS (the engine listens
// in its own network namespace; a relay on this host's loopback carries
// the bytes, the TLS is the engine's own, end to end).
type RemoteDocker struct {
	*Engine
	// SSHHost is ssh://root@127.0.0.1:PORT; SSHBin a directory holding an
	// `ssh` that uses the test's key and trusts only the server's host
	// key: put it first in the launcher's PATH.
	SSHHost, SSHBin string
	// TLSHost is tcp://127.0.0.1:PORT; CertDir holds the client's ca.pem,
	// cert.pem and key.pem (DOCKER_CERT_PATH's layout).
	TLSHost, CertDir string
}

// remoteTLSAddr is where the engine listens with TLS, in its namespace.
const remoteTLSAddr = "127.0.0.1:2376"

// PrivateRemoteDocker starts a private dockerd with the images named, an
// sshd and a TLS listener for it, all stopped and removed when the test
// ends. Without root, dockerd, sshd, ssh, ssh-keygen or unshare (which
// the tests run the launcher with, apart from the engine), the test is
// skipped with the reason, or failed under PROPIO_E2E=require.
func PrivateRemoteDocker(tb testing.TB, images ...string) *RemoteDocker {
	tb.Helper()
	if reason := privateDockerMissing(); reason != "" {
		skipOrFail(tb, "a private Docker engine: "+reason)
	}
	for _, tool := range []string{"/usr/sbin/sshd", "ssh", "ssh-keygen", "docker"} {
		if _, err := exec.LookPath(tool); err != nil {
			skipOrFail(tb, "an engine reached through ssh: "+filepath.Base(tool)+" is not installed (Debian's openssh-server and openssh-client)")
		}
	}
	// A launcher on "another machine" runs in a mount namespace of its own.
	if _, err := exec.LookPath("unshare"); err != nil {
		skipOrFail(tb, "a launcher apart from the engine: unshare is not installed (util-linux)")
	}
	dir, err := os.MkdirTemp("", "propio-remote-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	server, client := filepath.Join(dir, "tls-server"), filepath.Join(dir, "tls-client")
	if err := writeTLS(server, client); err != nil {
		tb.Fatal(err)
	}
	e := privateDocker(tb, []string{"--tlsverify",
		"--tlscacert", filepath.Join(server, "ca.pem"),
		"--tlscert", filepath.Join(server, "cert.pem"),
		"--tlskey", filepath.Join(server, "key.pem"),
		"--host", "tcp://" + remoteTLSAddr}, images)
	r := &RemoteDocker{Engine: e, CertDir: client}
	r.TLSHost = "tcp://" + relayInto(tb, "/run/netns/"+e.netns, remoteTLSAddr)
	r.SSHHost, r.SSHBin = startSSHD(tb, filepath.Join(dir, "ssh"), e.sock)
	return r
}

// writeTLS writes a throwaway CA, a server certificate for 127.0.0.1 and
// a client certificate, both signed by it and valid for an hour: the
// server's in server (ca.pem, cert.pem, key.pem), the client's in client.
func writeTLS(server, client string) error {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "propio-sandbox remote engine test CA"},
		NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true, IsCA: true, MaxPathLenZero: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return err
	}
	for i, side := range []struct {
		dir   string
		usage x509.ExtKeyUsage
	}{{server, x509.ExtKeyUsageServerAuth}, {client, x509.ExtKeyUsageClientAuth}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: "propio-sandbox remote engine test " + filepath.Base(side.dir)},
			NotBefore: now.Add(-time.Minute), NotAfter: now.Add(time.Hour),
			KeyUsage:    x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{side.usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(side.dir, 0o700); err != nil {
			return err
		}
		for name, block := range map[string]*pem.Block{
			"ca.pem":   {Type: "CERTIFICATE", Bytes: caDER},
			"cert.pem": {Type: "CERTIFICATE", Bytes: der},
			"key.pem":  {Type: "PRIVATE KEY", Bytes: keyDER},
		} {
			if err := os.WriteFile(filepath.Join(side.dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
				return err
			}
		}
	}
	return nil
}

// relayInto listens on this host's loopback and carries each connection
// to addr in the network namespace at netns; it returns the address it
// listens on. It stops, closing every connection, when the test ends.
func relayInto(tb testing.TB, netns, addr string) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				up, err := dialInNetns(netns, addr)
				if err != nil {
					return
				}
				track(up)
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { io.Copy(up, c); done <- struct{}{} }()
				go func() { io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	tb.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// dialInNetns connects to addr from inside the network namespace at path:
// the socket is made by a thread that has entered it (and stays there),
// then the thread goes back to this process's namespace. (A thread left in
// it would make the process one of the namespace's, which removing the
// engine kills.)
func dialInNetns(path, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer home.Close()
		f, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("entering %s: %w", path, err)}
			return
		}
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr == nil {
			runtime.UnlockOSThread()
		} // else: locked, the thread ends with the goroutine
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// startSSHD runs Debian's sshd on this host's loopback, in dir, letting in
// one key of the test's, as root, whose only command is `docker system
// dial-stdio` against the engine socket sock: what the docker CLI's ssh
// connection runs on the remote host. It returns the engine's ssh:// host
// and a directory holding an `ssh` for that key and server. sshd is stopped
// when the test ends.
func startSSHD(tb testing.TB, dir, sock string) (host, bin string) {
	tb.Helper()
	bin = filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o700); err != nil {
		tb.Fatal(err)
	}
	keygen := func(file string) string {
		if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "propio-test", "-f", file).CombinedOutput(); err != nil {
			tb.Fatalf("ssh-keygen: %v: %s", err, out)
		}
		pub, err := os.ReadFile(file + ".pub")
		if err != nil {
			tb.Fatal(err)
		}
		return strings.TrimSpace(string(pub))
	}
	hostPub, clientPub := keygen(filepath.Join(dir, "host_key")), keygen(filepath.Join(dir, "id"))
	dockerCLI, err := exec.LookPath("docker")
	if err != nil {
		tb.Fatal(err)
	}
	cmd := fmt.Sprintf(`exec env DOCKER_HOST=unix://%s DOCKER_CONFIG=%s %s system dial-stdio`, sock, filepath.Join(dir, "docker"), dockerCLI)
	port := freePort(tb)
	files := map[string]string{
		"authorized_keys": `command="` + cmd + `",restrict ` + clientPub + "\n",
		"sshd_config": strings.Join([]string{
			"ListenAddress 127.0.0.1:" + port,
			"HostKey " + filepath.Join(dir, "host_key"),
			"AuthorizedKeysFile " + filepath.Join(dir, "authorized_keys"),
			"PidFile " + filepath.Join(dir, "sshd.pid"),
			"AllowUsers root", "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no",
			"PasswordAuthentication no", "KbdInteractiveAuthentication no", "PrintMotd no", "",
		}, "\n"),
		"known_hosts": "[127.0.0.1]:" + port + " " + hostPub + "\n",
		"ssh_config": strings.Join([]string{
			"Host *",
			"  IdentityFile " + filepath.Join(dir, "id"), "  IdentitiesOnly yes",
			"  UserKnownHostsFile " + filepath.Join(dir, "known_hosts"), "  GlobalKnownHostsFile /dev/null",
			"  StrictHostKeyChecking yes", "  BatchMode yes", "  LogLevel ERROR", "",
		}, "\n"),
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	wrapper := "#!/bin/sh\nexec " + sshClient(tb) + " -F " + filepath.Join(dir, "ssh_config") + ` "$@"` + "\n"
	if err := os.WriteFile(filepath.Join(bin, "ssh"), []byte(wrapper), 0o700); err != nil {
		tb.Fatal(err)
	}
	// sshd's privilege separation directory, which its service makes.
	if _, err := os.Stat("/run/sshd"); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	logf, err := os.Create(filepath.Join(dir, "sshd.log"))
	if err != nil {
		tb.Fatal(err)
	}
	defer logf.Close()
	sshd := exec.Command("/usr/sbin/sshd", "-D", "-e", "-f", filepath.Join(dir, "sshd_config"))
	sshd.Stdout, sshd.Stderr = logf, logf
	sshd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := sshd.Start(); err != nil {
		tb.Fatalf("starting sshd: %v", err)
	}
	exited := make(chan struct{})
	go func() { sshd.Wait(); close(exited) }()
	tb.Cleanup(func() {
		syscall.Kill(-sshd.Process.Pid, syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			syscall.Kill(-sshd.Process.Pid, syscall.SIGKILL)
			<-exited
		}
	})
	deadline := time.Now().Add(15 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+port, time.Second)
		if err == nil {
			c.Close()
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(filepath.Join(dir, "sshd.log"))
			tb.Fatalf("sshd exited at once:\n%s", log)
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("sshd did not listen on 127.0.0.1:%s within 15s", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "ssh://root@127.0.0.1:" + port, bin
}

// sshClient is the path of the ssh client.
func sshClient(tb testing.TB) string {
	p, err := exec.LookPath("ssh")
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// freePort is a TCP port free on the loopback a moment ago.
func freePort(tb testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}
