package generator

import (
	"fmt"
	"hash/fnv"
	"net/netip"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/decisionlog"
	"github.com/propio/propio-sandbox/internal/profile"
)

// The allowlist topology: the agent sits only on the sandbox network, which
// is internal (the engine gives it no route out); the gateway sits on it and
// on the outside network, and is the only way out.
const (
	// GatewayService is the name of the gateway's service.
	GatewayService = "gateway"
	// NetnsService holds the agent's network namespace, fenced in to
	// loopback and the gateway, on an engine whose internal networks do not
	// keep the host out (EngineFacts.FencedNetns).
	NetnsService = "netns"
	// SandboxNetwork is the internal network the agent and gateway share.
	SandboxNetwork = "sandbox"
	// OutsideNetwork is the network through which the gateway reaches out.
	OutsideNetwork = "outside"
	// GatewayLogDir is where the gateway's decision log directory is mounted.
	GatewayLogDir = "/log"
	// GatewayAskDir is where the sandbox's ask directory (network.unlisted:
	// ask) is mounted in the gateway, which serves ask.sock there. The
	// agent's container never has it.
	GatewayAskDir = "/ask"
	// DefaultGatewayImage names the gateway's image when Options has none.
	DefaultGatewayImage = "propio-sandbox/gateway:latest"
)

// Gateway ports, as the gateway subcommand listens on them.
const (
	ProxyPort = 3128 // HTTP proxy and CONNECT
	SOCKSPort = 1080 // SOCKS5
)

// subnetPool is where sandbox networks are numbered: 198.18.0.0/15 is set
// aside for benchmarking (RFC 2544), so it is unlikely to shadow a route of
// the host's LAN or VPN, and it is never a public address.
var subnetPool = netip.MustParsePrefix("198.18.0.0/15")

// subnetBits is the size of one sandbox network. Its engine's bridge has
// the first address and the gateway a fixed one, the second; the engine
// numbers the other containers (the agent, and on Podman the holder of its
// network namespace) from the second quarter (ContainerRange), so none of
// them can be given the gateway's address before the gateway is made (a
// namespace holder started first would otherwise get the second address,
// and the gateway's create fail with "already allocated"). The upper half
// (VirtualRange) are the gateway's virtual addresses, one per allowed name
// the sandbox resolved, which the gateway's kernel forwards.
const subnetBits = 24

// ContainerRange is the part of a sandbox network the engine gives
// containers addresses from: its second quarter, above the gateway's
// address and below the virtual ones.
func ContainerRange(subnet netip.Prefix) netip.Prefix { return part(subnet, 2, 1) }

// VirtualRange is the part of a sandbox network no container gets: the
// gateway's virtual addresses.
func VirtualRange(subnet netip.Prefix) netip.Prefix { return part(subnet, 1, 1) }

// part is the i-th of the 2^bits equal parts of subnet (from 0).
func part(subnet netip.Prefix, bits, i int) netip.Prefix {
	s := subnet.Masked()
	a := s.Addr().As4()
	v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + uint32(i)<<(32-s.Bits()-bits)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), s.Bits()+bits)
}

// PickSubnet chooses the sandbox network of project: the slot of the pool its
// name hashes to, or the next one that overlaps none of used (the engine's
// networks). Render passes no used networks, so it shows the first choice.
func PickSubnet(project string, used []netip.Prefix) (netip.Prefix, error) {
	slots := 1 << (subnetBits - subnetPool.Bits())
	h := fnv.New32a()
	h.Write([]byte(project))
	start := int(h.Sum32() % uint32(slots))
	base := subnetPool.Addr().As4()
	for i := 0; i < slots; i++ {
		n := (start + i) % slots
		a := base
		v := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
		v += uint32(n) << (32 - subnetBits)
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), subnetBits)
		free := true
		for _, u := range used {
			if u.Overlaps(p) {
				free = false
				break
			}
		}
		if free {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("no free /%d network left in %s", subnetBits, subnetPool)
}

// GatewayAddr is the gateway's address on a sandbox network: the second of
// the subnet (the engine's bridge has the first).
func GatewayAddr(subnet netip.Prefix) netip.Addr {
	return subnet.Masked().Addr().Next().Next()
}

// allowlist adds the gateway and both networks to project, and puts the
// agent behind them. It returns the gateway as the extension says it.
func allowlist(project *types.Project, p *profile.Profile, h Host, o Options, agent *types.ServiceConfig) (*ExtensionGateway, error) {
	subnet := o.Subnet
	if !subnet.IsValid() {
		var err error
		if subnet, err = PickSubnet(o.Project, nil); err != nil {
			return nil, err
		}
	}
	gw := GatewayAddr(subnet)
	image := o.GatewayImage
	if image == "" {
		image = DefaultGatewayImage
	}
	if h.LogDir == "" {
		return nil, fmt.Errorf("network.mode allowlist: no directory for the gateway's log")
	}

	project.Networks = types.Networks{
		SandboxNetwork: types.NetworkConfig{
			Name:     o.Project + "_" + SandboxNetwork,
			Internal: true,
			// No address for the host on this network: an internal network
			// still gives its bridge one, through which the sandbox would
			// reach every service the host listens with on all addresses.
			DriverOpts: types.Options{"com.docker.network.bridge.inhibit_ipv4": "true"},
			Ipam:       types.IPAMConfig{Config: []*types.IPAMPool{{Subnet: subnet.String(), IPRange: ContainerRange(subnet).String()}}},
			Labels:     types.Labels{LabelWorkspace: h.Workspace},
		},
	}
	if o.OutsideNetwork != "" {
		project.Networks[OutsideNetwork] = types.NetworkConfig{Name: o.OutsideNetwork, External: true}
	} else {
		project.Networks[OutsideNetwork] = types.NetworkConfig{Name: o.Project + "_" + OutsideNetwork, Labels: types.Labels{LabelWorkspace: h.Workspace}}
	}

	joined := joinNetworks(project, p)

	command := []string{"gateway", "--address", gw.String(), "--log", path.Join(GatewayLogDir, decisionlog.FileName(o.Project)), "--profile", egressSource(p)}
	for _, r := range p.Network.Allow {
		command = append(command, "--allow", r.Flag())
	}
	if len(p.Network.Deny) > 0 {
		pos := p.Pos("network", "deny")
		command = append(command, "--deny-at", pos.File+":"+strconv.Itoa(pos.Line))
	}
	for _, r := range p.Network.Deny {
		command = append(command, "--deny", r.Text)
	}
	command = append(command, grantFlags(h)...)
	if p.Network.Bandwidth.IsSet() {
		command = append(command, "--bandwidth", p.Network.Bandwidth.Text)
	}
	if p.Network.Asks() {
		if h.AskDir == "" {
			return nil, fmt.Errorf("network.unlisted ask: no directory for the gateway's ask socket")
		}
		command = append(command, "--ask", GatewayAskDir, "--ask-timeout", p.Network.AskTimeoutOrDefault().String())
	}
	g := types.ServiceConfig{Name: GatewayService}
	g.Image = image
	g.PullPolicy = types.PullPolicyNever
	// The host's user, so the log it writes is the user's; it needs no
	// capability to listen on ports 53, 80 and 443, as its network namespace
	// lets anyone bind them.
	g.User = fmt.Sprintf("%d:%d", h.UID, h.GID)
	if h.Engine.KeepID {
		g.UserNSMode = "keep-id"
	}
	g.Sysctls = types.Mapping{"net.ipv4.ip_unprivileged_port_start": "0"}
	g.CapDrop = []string{"ALL"}
	if kernelForwarding(p, h) {
		// Forwarded by the kernel of the gateway's own network namespace,
		// which it programs with CAP_NET_ADMIN there. It starts as root
		// only to become the host's user at once with that one capability
		// (an engine gives a non-root user none); SETUID and SETGID are for
		// that change. Connection tracking counts bytes for the log, and
		// forgets a closed connection after a second, so it is logged then.
		command = append(command, "--virtual", VirtualRange(subnet).String(), "--uid", strconv.Itoa(h.UID), "--gid", strconv.Itoa(h.GID))
		g.User = "0:0"
		g.CapAdd = []string{"NET_ADMIN", "SETGID", "SETUID"}
		g.Sysctls["net.ipv4.ip_forward"] = "1"
		g.Sysctls["net.netfilter.nf_conntrack_acct"] = "1"
		g.Sysctls["net.netfilter.nf_conntrack_tcp_timeout_time_wait"] = "1"
	}
	g.Command = command
	g.SecurityOpt = []string{"no-new-privileges:true"}
	g.ReadOnly = true
	g.MemLimit = types.UnitBytes(256 << 20)
	g.PidsLimit = 100
	g.Volumes = []types.ServiceVolumeConfig{{
		Type: types.VolumeTypeBind, Source: h.LogDir, Target: GatewayLogDir,
		Bind: &types.ServiceVolumeBind{CreateHostPath: false},
	}}
	if p.Network.Asks() {
		g.Volumes = append(g.Volumes, types.ServiceVolumeConfig{
			Type: types.VolumeTypeBind, Source: AskDir(h.AskDir, o.Project), Target: GatewayAskDir,
			Bind: &types.ServiceVolumeBind{CreateHostPath: false},
		})
	}
	brokered := brokering(p, h, o, &g, agent)
	g.Networks = map[string]*types.ServiceNetworkConfig{
		SandboxNetwork: {Ipv4Address: gw.String()},
		OutsideNetwork: nil,
	}
	for _, key := range joined {
		g.Networks[key] = nil
	}
	g.Labels = types.Labels{LabelProfile: profileLabel(p), LabelWorkspace: h.Workspace}
	// As every container of a sandbox (the gateway runs no git; this keeps
	// the rule without exceptions).
	g.Environment = types.MappingWithEquals{"GIT_DISCOVERY_ACROSS_FILESYSTEM": ptr("1")}
	if *p.Network.HostGateway {
		g.ExtraHosts = h.Engine.hostGateway()
	}
	project.Services[GatewayService] = g

	// The agent: only on the sandbox network, its DNS the gateway's, and the
	// proxy variables set for the tools that honour them.
	agent.Networks = map[string]*types.ServiceNetworkConfig{SandboxNetwork: nil}
	// Its resolver is the gateway itself, not the engine's (which would
	// forward to the gateway anyway, one hop later): a resolv.conf of its own,
	// read-only. The engine's resolver forwards to the gateway too.
	agent.DNS = types.StringList{gw.String()}
	if h.ResolvDir != "" {
		agent.Volumes = append(agent.Volumes, bind(filepath.Join(h.ResolvDir, ResolvConfName(gw)), "/etc/resolv.conf", true))
	}
	agent.DependsOn = types.DependsOnConfig{GatewayService: {Condition: types.ServiceConditionStarted, Required: true}}
	if h.Engine.FencedNetns {
		var virtual netip.Prefix
		if kernelForwarding(p, h) {
			virtual = VirtualRange(subnet)
		}
		fenceIn(project, p, h, image, gw, virtual, agent)
	}
	proxy := "http://" + gw.String() + ":" + strconv.Itoa(ProxyPort)
	socks := "socks5h://" + gw.String() + ":" + strconv.Itoa(SOCKSPort)
	noProxy := "localhost,127.0.0.1,::1"
	for k, v := range map[string]string{
		"HTTP_PROXY": proxy, "HTTPS_PROXY": proxy, "ALL_PROXY": socks, "NO_PROXY": noProxy,
		"http_proxy": proxy, "https_proxy": proxy, "all_proxy": socks, "no_proxy": noProxy,
	} {
		agent.Environment[k] = ptr(v)
	}
	return &ExtensionGateway{Image: image, Subnet: subnet, Log: decisionlog.FileName(o.Project), Broker: brokered}, nil
}

// fenceIn puts the agent in the network namespace of a container of its
// own on the sandbox network, which fences it in to loopback and the
// gateway (its address, and its virtual addresses when its kernel
// forwards) (the netns-fence subcommand of the gateway's image) before the
// launcher lets the agent join it: on an engine whose internal networks
// give the host an address and a resolver, these are the only ways out
// the sandbox has, as on Docker's internal network. The container holds
// the namespace, as root with CAP_NET_ADMIN there alone, read-only, without
// new privileges; the agent joins its namespace, not its capabilities or
// processes.
func fenceIn(project *types.Project, p *profile.Profile, h Host, image string, gw netip.Addr, virtual netip.Prefix, agent *types.ServiceConfig) {
	n := types.ServiceConfig{Name: NetnsService}
	n.Image = image
	n.PullPolicy = types.PullPolicyNever
	n.Command = []string{"netns-fence", "--gateway", gw.String()}
	if virtual.IsValid() {
		// The gateway's virtual addresses, which its kernel forwards.
		n.Command = append(n.Command, "--virtual", virtual.String())
	}
	n.User = "0:0"
	n.CapDrop = []string{"ALL"}
	n.CapAdd = []string{"NET_ADMIN"}
	n.SecurityOpt = []string{"no-new-privileges:true"}
	n.ReadOnly = true
	// Room for the check the launcher execs in it too.
	n.MemLimit = types.UnitBytes(128 << 20)
	n.PidsLimit = 50
	n.Networks = agent.Networks
	n.DNS = agent.DNS
	// The agent's name for itself, on its own network namespace.
	n.Hostname = agent.Hostname
	n.Labels = types.Labels{LabelProfile: profileLabel(p), LabelWorkspace: h.Workspace}
	// Ports of the namespace are published from its holder.
	n.Ports, agent.Ports = agent.Ports, nil
	n.Environment = types.MappingWithEquals{"GIT_DISCOVERY_ACROSS_FILESYSTEM": ptr("1")}
	if agent.UserNSMode == "keep-id" {
		// A rootless engine makes the namespace of a container with a user
		// namespace of its own in that user namespace, and a container in
		// another one cannot join it (its runtime may not mount /sys
		// there): the holder maps the user to itself, and the agent runs
		// in the holder's user namespace, which has the mapping the agent's
		// own keep-id would have. The agent, as the user there, has no
		// capability in it; the holder's root is not the user.
		n.UserNSMode = "keep-id"
		agent.UserNSMode = "container:" + ContainerName(project.Name, NetnsService)
	}
	project.Services[NetnsService] = n
	agent.Networks = nil
	agent.DNS = nil
	agent.Hostname = ""
	agent.ExtraHosts = nil
	agent.NetworkMode = "service:" + NetnsService
	agent.DependsOn[NetnsService] = types.ServiceDependency{Condition: types.ServiceConditionStarted, Required: true}
}

// ContainerName is the name the engine's Compose gives the container of a
// project's service it starts (not the one-off container of a run).
func ContainerName(project, service string) string { return project + "-" + service + "-1" }

// FenceWait bounds the wait for a netns service's fence, from its start.
const FenceWait = 15 * time.Second

// FenceCheck is the command that, run in the netns service n's container,
// exits 0 once its namespace is fenced in (waiting up to FenceWait), and
// non-zero, saying why, when it is not: binary is the entrypoint of the
// gateway's image, which the service runs.
func FenceCheck(n types.ServiceConfig, binary string) []string {
	return append(append([]string{binary}, n.Command...), "--check", "--wait", FenceWait.String())
}

// AskDir is the ask directory of project under base (Host.AskDir): the
// launcher makes it, the gateway serves ask.sock in it.
func AskDir(base, project string) string { return filepath.Join(base, project) }

// grantFlags are the gateway's flags for the user's grants: the file they
// come from, then each grant as N=RULE, deny grants first (deny wins over
// allow whatever the order; the gateway adds them after the profile's rules,
// so that a rule both name is named as the profile's).
func grantFlags(h Host) []string {
	if len(h.Grants) == 0 {
		return nil
	}
	flags := []string{"--grants", h.GrantsFile}
	for _, deny := range []bool{true, false} {
		for _, g := range h.Grants {
			if g.Deny != deny {
				continue
			}
			flag := "--grant-allow"
			if g.Deny {
				flag = "--grant-deny"
			}
			flags = append(flags, flag, strconv.Itoa(g.N)+"="+g.Rule)
		}
	}
	return flags
}

// JoinedNetwork is the project's key for the network.join network name.
func JoinedNetwork(name string) string { return "join-" + name }

// joinNetworks adds the networks of network.join to project, as external
// ones (they exist before the sandbox and outlive it), and returns their
// keys: the gateway joins them, the agent never does, so that only what the
// rules allow of them is reachable.
func joinNetworks(project *types.Project, p *profile.Profile) []string {
	keys := make([]string, 0, len(p.Network.Join))
	for _, name := range p.Network.Join {
		key := JoinedNetwork(name)
		project.Networks[key] = types.NetworkConfig{Name: name, External: true}
		keys = append(keys, key)
	}
	return keys
}

// kernelForwarding reports whether the gateway forwards allowed names in
// its kernel: not under a bandwidth cap, which only its user-space relay
// enforces, and not on an engine where it relays in user space only
// (EngineFacts.UserSpaceGateway).
func kernelForwarding(p *profile.Profile, h Host) bool {
	return !p.Network.Bandwidth.IsSet() && !h.Engine.UserSpaceGateway
}

// ResolvConfName is the file, in Host.ResolvDir, that points a sandbox's DNS
// at the gateway at addr; ResolvConf is its content.
func ResolvConfName(addr netip.Addr) string { return "gateway-" + addr.String() + ".conf" }

// ResolvConf is the resolv.conf of a sandbox behind the gateway at addr.
func ResolvConf(addr netip.Addr) string {
	return "# written by propio-sandbox: this sandbox's only resolver is its egress gateway\nnameserver " + addr.String() + "\noptions ndots:0\n"
}

// egressSource is where the profile's allow list is, for the gateway's
// denial hints: FILE:LINE of network.allow, or of network, or the file. A
// user's profile whose allow list is all inherited from a built-in (which
// nobody can edit) is named as its own file, without a line: the hint then
// says to add the lines there.
func egressSource(p *profile.Profile) string {
	pos := p.Pos("network", "allow")
	if strings.HasPrefix(pos.File, "builtin:") && !strings.HasPrefix(p.Meta.File, "builtin:") {
		return p.Meta.File
	}
	return pos.File + ":" + strconv.Itoa(pos.Line)
}
