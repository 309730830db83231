package sshagent

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	identity = "/Users/u/.local/share/containers/podman/machine/machine"
	sshOpts  = "ssh -F /dev/null -i " + identity + " -o IdentitiesOnly=yes -p 60123" +
		" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=10 -o LogLevel=ERROR"
	listCmd = "podman system connection list --format json"
)

var (
	vmSock      = VMSocket("t1")
	rmStale     = sshOpts + " core@127.0.0.1 rm -f " + vmSock
	startTunnel = "start " + sshOpts + " -N -o ExitOnForwardFailure=yes -o StreamLocalBindUnlink=yes -R " + vmSock + ":" + agent + " core@127.0.0.1"
	probe       = sshOpts + " core@127.0.0.1 test -S " + vmSock
	rmClean     = rmStale
)

func TestVMSocket(t *testing.T) {
	t.Parallel()
	if got := VMSocket("t1"); got != "/tmp/propio-sandbox-ssh-agent-t1.sock" {
		t.Errorf("VMSocket = %q", got)
	}
}

// TestPodmanConnection: which connection is used, and every way of not
// finding a usable one.
func TestPodmanConnection(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		list    string
		listErr error
		dest    string // the tunnel's [user@]host -p port, when it starts
		fatal   []string
	}{
		{name: "default of two", list: machineConns, dest: "-p 60123 -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o ConnectTimeout=10 -o LogLevel=ERROR -N -o ExitOnForwardFailure=yes -o StreamLocalBindUnlink=yes -R " + vmSock + ":" + agent + " core@127.0.0.1"},
		{name: "default is the later one", list: `[{"Name":"a","URI":"ssh://a@h1:1/x"},{"Name":"b","URI":"ssh://b@h2:2/x","Default":true},{"Name":"c","URI":"ssh://c@h3:3/x"}]`, dest: "-p 2 .* b@h2$"},
		{name: "only one, not default", list: `[{"Name":"solo","URI":"ssh://core@localhost:2222/run/podman.sock","Identity":"/k","Default":false}]`, dest: "-i /k -o IdentitiesOnly=yes -p 2222 .* core@localhost$"},
		{name: "older podman, no IsMachine, unknown fields", list: `[{"Name":"old","URI":"ssh://core@127.0.0.1:5555/run/podman.sock","Identity":"/k","Default":true,"Extra":{"x":[1]}}]`, dest: "-p 5555 .* core@127.0.0.1$"},
		{name: "no port means 22", list: `[{"Name":"p","URI":"ssh://core@vm.local/run/podman.sock","Default":true}]`, dest: "-F /dev/null -p 22 .* core@vm.local$"},
		{name: "no user", list: `[{"Name":"p","URI":"ssh://vm.local:23/run/podman.sock","Default":true}]`, dest: "-p 23 .* vm.local$"},
		{name: "ipv6 host", list: `[{"Name":"p","URI":"ssh://core@[::1]:24/run/podman.sock","Default":true}]`, dest: "-p 24 .* core@::1$"},
		{name: "command fails", listErr: errors.New("podman: exit status 125: cannot connect"), fatal: []string{"listing podman's connections", "cannot connect", "`podman machine start`"}},
		{name: "malformed json", list: `[{"Name":`, fatal: []string{"reading `podman system connection list --format json`", "unexpected end of JSON", "`podman system connection list`"}},
		{name: "not an array", list: `{"Name":"x"}`, fatal: []string{"reading `podman system connection list --format json`"}},
		{name: "table output", list: "Name URI Identity Default\n", fatal: []string{"reading `podman system connection list --format json`", "invalid character"}},
		{name: "no connections", list: `[]`, fatal: []string{"no connection", "`podman machine init`", "`podman machine start`"}},
		{name: "null", list: `null`, fatal: []string{"no connection"}},
		{name: "empty output", list: " \n", fatal: []string{"no connection"}},
		{name: "several, none default", list: `[{"Name":"one","URI":"ssh://a@h:1/x"},{"Name":"two","URI":"ssh://a@h:2/x"}]`,
			fatal: []string{`2 connections and none is the default: "one", "two"`, "`podman system connection default NAME`, NAME one of \"one\", \"two\""}},
		{name: "bad uri", list: `[{"Name":"bad","URI":"ssh://core@127.0.0.1:port/x","Default":true}]`, fatal: []string{`podman connection "bad" has URI "ssh://core@127.0.0.1:port/x": not a URI`, "invalid port"}},
		{name: "port out of range", list: `[{"Name":"big","URI":"ssh://core@127.0.0.1:70000/x","Default":true}]`, fatal: []string{"bad port 70000"}},
		{name: "not ssh", list: `[{"Name":"local","URI":"unix:///run/podman/podman.sock","Default":true}]`, fatal: []string{"want an ssh:// URI"}},
		{name: "no host", list: `[{"Name":"nohost","URI":"ssh:///run/podman.sock","Default":true}]`, fatal: []string{"no host"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := &fakeRunner{list: tt.list, listErr: tt.listErr, probeHook: func(context.Context, int) error { return nil }}
			c := config("darwin", Podman, Auto, r, newClock(true))
			res, err := Setup(context.Background(), c)
			if tt.fatal != nil {
				wantFatal(t, err, tt.fatal...)
				if tt.listErr != nil && !errors.Is(err, tt.listErr) {
					t.Errorf("Setup: %v does not wrap %v", err, tt.listErr)
				}
				if got := r.lines(); !slices.Equal(got, []string{listCmd}) {
					t.Errorf("ran %q; want only the listing", got)
				}
				if res.Forward {
					t.Error("forwarding after a fatal error")
				}
				return
			}
			if err != nil || !res.Forward || res.Source != vmSock {
				t.Fatalf("Setup = %+v, %v", res, err)
			}
			var start string
			for _, l := range r.lines() {
				if strings.HasPrefix(l, "start ") {
					start = l
				}
			}
			if !matches(t, tt.dest, start) {
				t.Errorf("tunnel %q does not match %q", start, tt.dest)
			}
		})
	}
}

func matches(t *testing.T, pattern, s string) bool {
	t.Helper()
	ok, err := regexp.MatchString(pattern, s)
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

// TestPodmanTunnel: the tunnel's life from the stale socket to the poll.
func TestPodmanTunnel(t *testing.T) {
	t.Parallel()
	exit255 := errors.New("ssh: exit status 255: remote port forwarding failed")
	tests := []struct {
		name    string
		r       *fakeRunner
		manual  bool // a clock that only moves when told (it never is here)
		cancel  bool // the ctx is cancelled during the first probe
		want    []string
		fatal   []string
		plain   error // a non-fatal error, matched with errors.Is
		elapsed time.Duration
	}{
		{
			name:    "socket appears on the third probe",
			r:       &fakeRunner{probes: []bool{false, false, true}},
			want:    []string{listCmd, rmStale, startTunnel, probe, probe, probe},
			elapsed: 2 * DefaultPollInterval,
		},
		{
			name: "socket appears at once",
			r:    &fakeRunner{probes: []bool{true}},
			want: []string{listCmd, rmStale, startTunnel, probe},
		},
		{
			name:  "stale socket cannot be removed",
			r:     &fakeRunner{staleErr: errors.New("ssh: connect to host 127.0.0.1 port 60123: Connection refused")},
			want:  []string{listCmd, rmStale},
			fatal: []string{"removing a stale " + vmSock, "Connection refused", "`podman machine start`", "ssh -i " + identity + " -p 60123 core@127.0.0.1 true"},
		},
		{
			name:  "tunnel does not start",
			r:     &fakeRunner{startErr: errors.New(`exec: "ssh": executable file not found in $PATH`)},
			want:  []string{listCmd, rmStale, startTunnel},
			fatal: []string{"starting the ssh tunnel", "executable file not found", "`ssh -V`"},
		},
		{
			name:    "socket never appears",
			r:       &fakeRunner{probes: []bool{false}},
			want:    append(append([]string{listCmd, rmStale, startTunnel}, repeat(probe, 101)...), "kill"),
			fatal:   []string{"socket " + vmSock + " did not appear in the podman machine within 10s", "exit status 1", "`podman machine start`"},
			elapsed: DefaultPollTimeout,
		},
		{
			name:   "tunnel exits while waiting",
			r:      &fakeRunner{exitEarly: exit255, probes: []bool{false}},
			manual: true,
			want:   []string{listCmd, rmStale, startTunnel, probe},
			fatal:  []string{"the ssh tunnel into the podman machine exited", "remote port forwarding failed", "`podman machine start`"},
		},
		{
			name:   "tunnel exits during a probe that hangs",
			manual: true,
			want:   []string{listCmd, rmStale, startTunnel, probe},
			fatal:  []string{"the ssh tunnel into the podman machine exited", "remote port forwarding failed"},
		},
		{
			name:   "launch cancelled while waiting",
			r:      &fakeRunner{probes: []bool{false}},
			manual: true,
			cancel: true,
			want:   []string{listCmd, rmStale, startTunnel, probe, "kill"},
			plain:  context.Canceled,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := tt.r
			if r == nil { // the hanging probe: the tunnel dies under it
				r = &fakeRunner{}
				r.probeHook = func(ctx context.Context, _ int) error {
					r.mu.Lock()
					p := r.proc
					r.mu.Unlock()
					p.stop(exit255)
					<-ctx.Done()
					return ctx.Err()
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				r.probeHook = func(context.Context, int) error { cancel(); return errors.New("ssh: exit status 1") }
			}
			clk := newClock(!tt.manual)
			res, err := Setup(ctx, config("darwin", Podman, On, r, clk))
			switch {
			case tt.fatal != nil:
				wantFatal(t, err, tt.fatal...)
			case tt.plain != nil:
				if !errors.Is(err, tt.plain) || errors.Is(err, ErrFatal) {
					t.Errorf("Setup: %v; want %v", err, tt.plain)
				}
			case err != nil:
				t.Fatalf("Setup: %v", err)
			}
			if got := r.lines(); !slices.Equal(got, tt.want) {
				t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			if got := clk.Now().Sub(epoch); got != tt.elapsed {
				t.Errorf("waited %s, want %s", got, tt.elapsed)
			}
			if err != nil {
				// Nothing is left to clean: the tunnel is dead or killed.
				if res.Forward || res.Cleanup() != nil || len(r.lines()) != len(tt.want) {
					t.Errorf("after a failure: %+v, commands %q", res, r.lines())
				}
				return
			}
			if !res.Forward || res.Source != vmSock || !res.Relabel || len(res.Warnings) > 0 {
				t.Errorf("Setup = %+v", res)
			}
			if err := res.Cleanup(); err != nil {
				t.Errorf("Cleanup: %v", err)
			}
			if got := r.lines()[len(tt.want):]; !slices.Equal(got, []string{"kill", rmClean}) {
				t.Errorf("Cleanup ran %q; want the kill, then the rm", got)
			}
		})
	}
}

// TestCancelBetweenProbes: a launch cancelled while Setup waits for the
// next probe stops at once and kills the tunnel.
func TestCancelBetweenProbes(t *testing.T) {
	t.Parallel()
	r := &fakeRunner{probes: []bool{false}}
	clk := newClock(false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Setup(ctx, config("darwin", Podman, On, r, clk))
		done <- err
	}()
	clk.waitTimers(1) // waiting for the next probe
	cancel()
	err := <-done
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrFatal) {
		t.Errorf("Setup: %v; want context.Canceled", err)
	}
	if want := []string{listCmd, rmStale, startTunnel, probe, "kill"}; !slices.Equal(r.lines(), want) {
		t.Errorf("commands %q, want %q", r.lines(), want)
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// launched is a tunnel that Setup has set up, on a clock that moves only
// when the test says.
func launched(t *testing.T, r *fakeRunner) (Result, *fakeClock) {
	t.Helper()
	clk := newClock(false)
	res, err := Setup(context.Background(), config("darwin", Podman, Auto, r, clk))
	if err != nil || !res.Forward {
		t.Fatalf("Setup = %+v, %v", res, err)
	}
	return res, clk
}

// TestCleanupOnce: signals arriving together call Cleanup from several
// goroutines at once; the tunnel is killed and its socket removed once, and
// every caller gets the one outcome.
func TestCleanupOnce(t *testing.T) {
	t.Parallel()
	for _, rmErr := range []error{nil, errors.New("ssh: connect to host 127.0.0.1 port 60123: Connection refused")} {
		t.Run(fmt.Sprintf("rm error %v", rmErr), func(t *testing.T) {
			t.Parallel()
			r := &fakeRunner{rmErr: rmErr}
			res, _ := launched(t, r)
			const callers = 8
			var wg sync.WaitGroup
			errs := make([]error, callers)
			ready := make(chan struct{})
			for i := range callers {
				wg.Go(func() {
					<-ready
					errs[i] = res.Cleanup()
				})
			}
			close(ready)
			wg.Wait()
			errs = append(errs, res.Cleanup()) // and once more, later
			if r.count("kill") != 1 || r.count(rmClean) != 2 {
				t.Errorf("commands %q: want one kill and one rm besides the stale one", r.lines())
			}
			r.mu.Lock()
			kills := r.proc.kills
			r.mu.Unlock()
			if kills != 1 {
				t.Errorf("killed %d times", kills)
			}
			for _, err := range errs {
				if err != errs[0] {
					t.Errorf("callers got different errors: %v and %v", err, errs[0])
				}
			}
			if (errs[0] == nil) != (rmErr == nil) || rmErr != nil && !errors.Is(errs[0], rmErr) {
				t.Errorf("Cleanup: %v; want %v", errs[0], rmErr)
			}
		})
	}
}

func TestCleanupErrors(t *testing.T) {
	t.Parallel()
	t.Run("rm fails", func(t *testing.T) {
		t.Parallel()
		r := &fakeRunner{rmErr: errors.New("ssh: exit status 255: VM stopped")}
		res, _ := launched(t, r)
		err := res.Cleanup()
		if err == nil || !strings.Contains(err.Error(), "removing "+vmSock+" in the podman machine: ssh: exit status 255: VM stopped") {
			t.Errorf("Cleanup: %v", err)
		}
		if r.count("kill") != 1 {
			t.Errorf("the tunnel was not killed: %q", r.lines())
		}
	})
	t.Run("kill fails", func(t *testing.T) {
		t.Parallel()
		r := &fakeRunner{killErr: errors.New("operation not permitted")}
		res, _ := launched(t, r)
		err := res.Cleanup()
		if err == nil || !strings.Contains(err.Error(), "stopping the ssh tunnel into the podman machine: operation not permitted") {
			t.Errorf("Cleanup: %v", err)
		}
		if r.count(rmClean) != 2 {
			t.Errorf("the socket was not removed after the failed kill: %q", r.lines())
		}
	})
	t.Run("tunnel already gone", func(t *testing.T) {
		t.Parallel()
		r := &fakeRunner{}
		res, _ := launched(t, r)
		r.mu.Lock()
		p := r.proc
		r.mu.Unlock()
		p.stop(errors.New("exit status 255"))
		if err := res.Cleanup(); err != nil {
			t.Errorf("Cleanup: %v", err)
		}
		if r.count("kill") != 0 || r.count(rmClean) != 2 {
			t.Errorf("commands %q: want no kill and the rm", r.lines())
		}
	})
	t.Run("rm hangs", func(t *testing.T) {
		t.Parallel()
		r := &fakeRunner{rmHang: true}
		res, clk := launched(t, r)
		before := clk.pending()
		done := make(chan error, 1)
		go func() { done <- res.Cleanup() }()
		clk.waitTimers(before + 1) // Cleanup's bound is set; the rm hangs
		select {
		case err := <-done:
			t.Fatalf("Cleanup returned before its bound: %v", err)
		default:
		}
		clk.Advance(DefaultCleanupTimeout - time.Nanosecond)
		select {
		case err := <-done:
			t.Fatalf("Cleanup returned before its bound: %v", err)
		default:
		}
		clk.Advance(time.Nanosecond)
		err := <-done
		if err == nil || !strings.Contains(err.Error(), "removing "+vmSock+" in the podman machine: gave up after 5s") || !errors.Is(err, context.Canceled) {
			t.Errorf("Cleanup: %v", err)
		}
		if again := res.Cleanup(); again != err {
			t.Errorf("second Cleanup: %v, want the first's %v", again, err)
		}
	})
}
