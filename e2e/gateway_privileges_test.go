package e2e

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/propio/propio-sandbox/internal/testenv"
)

// TestGatewayPrivileges runs the gateway image as the generator has the
// engine run it with kernel forwarding (root, with NET_ADMIN, SETUID and
// SETGID, no-new-privileges) and observes, from the host, the process that
// serves: for a user other than root it runs as that user, and for root it
// stays root; either way CAP_NET_ADMIN is its only capability, and it
// forwards in the kernel. (CI runs as root, so a sandbox there only ever
// shows the second case.)
func TestGatewayPrivileges(t *testing.T) {
	requireEngine(t)
	if os.Geteuid() != 0 {
		t.Skip("reads the gateway's process status in /proc of the engine's host: needs root")
	}
	tag := testenv.GatewayImage(t, launcher)
	subnet, network := "", "propio-e2e-gwpriv-"+strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	for i := range 20 { // a /24 no other network of the engine has
		subnet = fmt.Sprintf("198.19.%d.0/24", 200+(int(time.Now().UnixNano())+i)%50)
		if _, err := docker("network", "create", "--internal", "--label", "dev.propio-sandbox.e2e=1", "--subnet", subnet, network); err == nil {
			break
		}
		subnet = ""
	}
	if subnet == "" {
		t.Fatal("no free /24 for the test network")
	}
	t.Cleanup(func() { testenv.RemoveNetwork(t, network) })
	base := strings.TrimSuffix(subnet, "0/24")

	const netAdmin = 1 << 12 // CAP_NET_ADMIN
	for _, uid := range []int{4321, 0} {
		t.Run(fmt.Sprintf("uid %d", uid), func(t *testing.T) {
			id := strconv.Itoa(uid)
			out, err := docker("run", "-d", "--label", "dev.propio-sandbox.e2e=1", "--network", network, "--ip", base+"2",
				"--user", "0:0", "--cap-drop", "ALL", "--cap-add", "NET_ADMIN", "--cap-add", "SETUID", "--cap-add", "SETGID",
				"--security-opt", "no-new-privileges:true", "--read-only",
				"--sysctl", "net.ipv4.ip_unprivileged_port_start=0", "--sysctl", "net.ipv4.ip_forward=1",
				"--sysctl", "net.netfilter.nf_conntrack_acct=1",
				tag, "gateway", "--address", base+"2", "--allow", "allowed.test", "--virtual", base+"128/25", "--uid", id, "--gid", id)
			if err != nil {
				t.Fatalf("starting the gateway: %v\n%s", err, out)
			}
			c := strings.TrimSpace(out)
			t.Cleanup(func() { docker("rm", "-f", c) })
			deadline := time.Now().Add(20 * time.Second)
			for {
				logs, _ := docker("logs", c)
				if strings.Contains(logs, "serving on") {
					if !strings.Contains(logs, "forwarded by the kernel") || strings.Contains(logs, "note:") {
						t.Errorf("the gateway does not forward in the kernel:\n%s", logs)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the gateway did not start:\n%s", logs)
				}
				time.Sleep(100 * time.Millisecond)
			}
			top, err := docker("top", c, "-eo", "pid,uid,args")
			if err != nil {
				t.Fatal(err)
			}
			var serving []string
			for _, line := range strings.Split(top, "\n")[1:] {
				f := strings.Fields(line)
				if len(f) < 3 {
					continue
				}
				status, err := os.ReadFile("/proc/" + f[0] + "/status")
				if err != nil {
					t.Fatal(err)
				}
				capEff := ""
				for _, l := range strings.Split(string(status), "\n") {
					if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
						capEff = strings.TrimSpace(v)
					}
				}
				eff, _ := strconv.ParseUint(capEff, 16, 64)
				if f[1] == id {
					serving = append(serving, line)
					if eff != netAdmin {
						t.Errorf("the gateway serving as %s has capabilities %s, want CAP_NET_ADMIN (%x) alone", id, capEff, netAdmin)
					}
				} else if f[1] == "0" && eff&^(netAdmin|1<<6|1<<7) != 0 { // the root parent waiting for it
					t.Errorf("the gateway's root process has capabilities %s beyond NET_ADMIN, SETUID and SETGID", capEff)
				}
			}
			if len(serving) != 1 {
				t.Errorf("want one gateway process as uid %s:\n%s", id, top)
			}
		})
	}
}
