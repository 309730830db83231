package generator

import (
	"bytes"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/compose-spec/compose-go/v2/types"
	"github.com/propio/propio-sandbox/internal/profile"
	"go.yaml.in/yaml/v3"
)

// Names of the Pod's volumes and containers, and of the ConfigMap's keys.
const (
	KubeWorkspaceVolume = "workspace"
	KubeFilesVolume     = "files"
	// KubeCopyContainer is the init container that receives the workspace:
	// the launcher streams a tar archive of it to its standard input, and
	// the sandbox starts once it is unpacked.
	KubeCopyContainer = "workspace-copy"
	// KubeKeeperContainer keeps the workspace's volume, read-only, once
	// the sandbox's command has ended (workspace.mode changeset): the
	// launcher execs a tar of it there, to bring it back as a changeset.
	KubeKeeperContainer = "workspace-keeper"
)

// Kubernetes generates the project of p on h, as Generate does, and says it
// as the objects that run it on a cluster. What has no equivalent there is
// an error saying where the profile asks for it: the host's directories
// (a cluster's node does not have them; the workspace goes in by copy),
// published ports, the SSH agent, agent requests, and, for now, the parts
// of an egress allowlist that need the launcher's host (asking, joined
// networks, secrets, methods, an upstream CA). The host's git
// configuration and the user's grants are not carried. An allowlist's
// gateway relays in user space (by SNI, Host, or its proxies), in a Pod
// of its own that is the sandbox's only way out.
func Kubernetes(p *profile.Profile, h Host, o Options, ko KubeOptions) (*KubeObjects, error) {
	switch ko.As {
	case "", KubeAsPod, KubeAsSandbox, KubeAsTemplate:
	default:
		return nil, fmt.Errorf("kubernetes objects as %q: choose %s, %s or %s", ko.As, KubeAsPod, KubeAsSandbox, KubeAsTemplate)
	}
	if err := kubeRefuse(p, h); err != nil {
		return nil, err
	}
	h.GitConfig, h.KnownHosts, h.Changeset = nil, "", nil
	if p.Network.Mode == "allowlist" {
		// A cluster's gateway relays in user space; its log is in a volume
		// of its Pod; the sandbox's resolver is set in its Pod's spec.
		h.Engine = EngineFacts{UserSpaceGateway: true}
		h.LogDir, h.ResolvDir, h.AskDir = GatewayLogDir, "", ""
		h.Grants, h.GrantsFile = nil, ""
	}
	project, err := Generate(p, h, o)
	if err != nil {
		return nil, err
	}
	svc := project.Services[Service]
	ext, err := readExtension(svc)
	if err != nil {
		return nil, err
	}
	name := KubeName(project.Name)
	k := &kubeBuild{p: p, h: h, name: name, ns: ko.Namespace, as: ko.As, svc: svc, ext: ext}
	if ext.Gateway != nil {
		k.gwAddr, k.gwPlaceholder = ko.GatewayAddress, !ko.GatewayAddress.IsValid()
		if k.gwPlaceholder {
			k.gwAddr = KubeGatewayPlaceholder
		}
		k.gwSvc = project.Services[GatewayService]
		// The compose project's gateway address is its sandbox network's:
		// the proxy variables name the gateway Pod's instead.
		compose := GatewayAddr(ext.Gateway.Subnet).String()
		k.svc.Environment = maps.Clone(k.svc.Environment)
		for n, v := range k.svc.Environment {
			if v != nil && strings.Contains(*v, "://"+compose+":") {
				k.svc.Environment[n] = ptr(strings.ReplaceAll(*v, "://"+compose+":", "://"+k.gwAddr.String()+":"))
			}
		}
	}
	return k.objects()
}

// kubeRefuse says what p asks for that a cluster cannot give, each with
// its place in the profile.
func kubeRefuse(p *profile.Profile, h Host) error {
	var errs profile.List
	refuse := func(field string, at []string, msg string) {
		errs = append(errs, &profile.Error{Pos: p.Pos(at...), Field: field, Msg: msg})
	}
	if p.Network.Mode == "allowlist" {
		n := p.Network
		for _, c := range []struct {
			field string
			set   bool
		}{{"unlisted", n.Asks()}, {"join", len(n.Join) > 0}, {"methods", len(n.Methods) > 0}, {"upstream_ca", n.UpstreamCA != ""}} {
			if c.set {
				refuse("network."+c.field, []string{"network", c.field}, "not available on Kubernetes yet: the allowlist's gateway there relays by name alone")
			}
		}
		for _, name := range ActiveSecrets(p, h) {
			refuse("secrets."+name, []string{"secrets", name}, "a secret given to the sandbox is brokered by its gateway, which Kubernetes does not do yet: leave its source unset (or choose another engine)")
		}
		if Opens(p, h) && len(ActiveSecrets(p, h)) == 0 && len(n.Methods) == 0 {
			refuse("network.allow", []string{"network", "allow"}, "a rule that limits requests needs the gateway to open TLS, which it does not on Kubernetes yet")
		}
	}
	if len(p.Ports) > 0 {
		refuse("ports", []string{"ports"}, "ports are published on the host, which a cluster's Pod is not on: remove them on Kubernetes")
	}
	for i := range p.Mounts {
		refuse(fmt.Sprintf("mounts[%d]", i), []string{"mounts", strconv.Itoa(i)}, "a host directory cannot be mounted on a cluster's node: the Kubernetes target takes the workspace only, by copy")
	}
	if h.SSHAgent.Source != "" {
		refuse("ssh_agent", []string{"ssh_agent"}, "the SSH agent cannot be forwarded to a cluster: set ssh_agent: off on Kubernetes")
	}
	if len(p.AgentRequests) > 0 {
		refuse("agent_requests", []string{"agent_requests"}, "agent requests are served by a launcher on the sandbox's host: not available on Kubernetes yet")
	}
	if len(h.ExtraMounts) > 0 {
		errs = append(errs, &profile.Error{Pos: profile.Pos{File: "PROPIO_SANDBOX_MOUNTS", Line: 1, Col: 1}, Msg: "extra mounts are host directories, which a cluster's node does not have"})
	}
	if len(errs) > 0 {
		return errs
	}
	return nil
}

// KubeName is the name of a sandbox's objects on a cluster for a project:
// a DNS label (lower case letters, digits and dashes, at most 57 characters,
// leaving room for the suffixes of its Secret and ConfigMap).
func KubeName(project string) string {
	name := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(project))
	if len(name) > 57 {
		name = name[:57]
	}
	name = strings.Trim(name, "-")
	if name == "" {
		name = "propio"
	}
	return name
}

type kubeBuild struct {
	p    *profile.Profile
	h    Host
	name string
	ns   string
	as   string // KubeOptions.As
	svc  types.ServiceConfig
	// The allowlist's gateway: its compose service, the address the
	// sandbox names it by, and whether that is KubeGatewayPlaceholder.
	gwSvc         types.ServiceConfig
	gwAddr        netip.Addr
	gwPlaceholder bool
	ext           Extension

	files   map[string]string // the ConfigMap's data
	volumes []KubeVolume
	mounts  []KubeVolumeMount
}

func (k *kubeBuild) meta(suffix, role string) KubeMeta {
	m := KubeMeta{
		Name:      k.name + suffix,
		Namespace: k.ns,
		Labels: map[string]string{
			KubeLabelManagedBy: KubeManagedBy,
			KubeLabelSandbox:   k.name,
			KubeLabelRole:      role,
		},
	}
	if role == "sandbox" {
		m.Annotations = map[string]string{
			KubeAnnProfile:   k.svc.Labels[LabelProfile],
			KubeAnnWorkspace: k.svc.Labels[LabelWorkspace],
		}
	}
	return m
}

func (k *kubeBuild) objects() (*KubeObjects, error) {
	out := &KubeObjects{}
	env, passed, err := k.env()
	if err != nil {
		return nil, err
	}
	if len(passed) > 0 {
		s := &KubeSecret{APIVersion: "v1", Kind: "Secret", Metadata: k.meta("-env", "environment"), Type: "Opaque", StringData: map[string]string{}}
		for _, n := range passed {
			s.StringData[n] = ""
		}
		out.Secret, out.EnvPassed = s, passed
	}
	k.files = map[string]string{}
	if err := k.layout(); err != nil {
		return nil, err
	}
	if len(k.files) > 0 {
		out.ConfigMap = &KubeConfigMap{APIVersion: "v1", Kind: "ConfigMap", Metadata: k.meta("-files", "files"), Data: k.files}
		k.volumes = append(k.volumes, KubeVolume{Name: KubeFilesVolume, ConfigMap: &KubeConfigRef{Name: k.name + "-files", DefaultMode: 0o444}})
	}
	switch k.p.Network.Mode {
	case "none":
		// Nothing in, nothing out, DNS included: the policy's empty rules.
		out.Policies = append(out.Policies, k.policy("-isolate", "sandbox", []KubePolicyRule{}, []KubePolicyRule{}))
	case "allowlist":
		// The sandbox reaches its gateway alone (its resolver and proxies
		// included); nothing reaches it. The gateway is reached by the
		// sandbox alone, and reaches out.
		out.Policies = append(out.Policies,
			k.policy("-isolate", "sandbox", []KubePolicyRule{}, []KubePolicyRule{{To: []KubePolicyPeer{{PodSelector: k.selector("gateway")}}}}),
			k.policy("-gateway", "gateway", []KubePolicyRule{{From: []KubePolicyPeer{{PodSelector: k.selector("sandbox")}}}}, []KubePolicyRule{{}}))
	}
	pod, err := k.pod(env)
	if err != nil {
		return nil, err
	}
	if k.gwSvc.Name != "" {
		gw := k.gateway()
		out.Gateway, out.GatewayPlaceholder, out.GatewayAddress = &gw, k.gwPlaceholder, k.gwAddr
		pod.Spec.DNSPolicy = "None"
		pod.Spec.DNSConfig = &KubeDNSConfig{Nameservers: []string{k.gwAddr.String()}, Options: []KubeDNSOption{{Name: "ndots", Value: "0"}}}
	}
	out.Pod = pod
	switch k.as {
	case KubeAsSandbox:
		out.Sandbox = k.sandbox(AgentSandboxAPI, "Sandbox", "sandbox", pod)
	case KubeAsTemplate:
		out.Sandbox = k.sandbox(AgentSandboxExtensionsAPI, "SandboxTemplate", "template", pod)
		out.Claim = &KubeSandboxClaim{
			APIVersion: AgentSandboxExtensionsAPI, Kind: "SandboxClaim", Metadata: k.meta("", "claim"),
			Spec: KubeSandboxClaimSpec{TemplateRef: KubeTemplateRef{Name: k.name}},
		}
	}
	return out, nil
}

// GatewayLogFollow is the command that copies the decision log of the
// allowlist's gateway out of its Pod (the log is in a volume there) as it
// grows, until the command's standard input ends: the hidden subcommand
// gateway-log of binary, the entrypoint of the gateway's image, on the file
// the gateway's --log names. It returns nil when there is no gateway.
func (o *KubeObjects) GatewayLogFollow(binary string) []string {
	if o.Gateway == nil {
		return nil
	}
	for _, c := range o.Gateway.Spec.Containers {
		if c.Name != GatewayService {
			continue
		}
		for i, a := range c.Args {
			if a == "--log" && i+1 < len(c.Args) {
				return []string{binary, "gateway-log", c.Args[i+1]}
			}
		}
	}
	return nil
}

// SetGatewayAddress makes the sandbox's Pod name addr as its gateway's
// address (its resolver, its proxy variables) in place of the one it
// names (KubeGatewayPlaceholder, in render's objects): run knows it once
// the gateway's Pod has one. The Pod's slices are copied, not changed.
func (o *KubeObjects) SetGatewayAddress(addr netip.Addr) {
	if o.Gateway == nil || !o.GatewayAddress.IsValid() {
		return
	}
	old, repl := "://"+o.GatewayAddress.String()+":", "://"+addr.String()+":"
	spec := &o.Pod.Spec
	spec.Containers = slices.Clone(spec.Containers)
	for ci := range spec.Containers {
		env := slices.Clone(spec.Containers[ci].Env)
		for i, e := range env {
			if e.Value != nil && strings.Contains(*e.Value, old) {
				env[i].Value = ptr(strings.ReplaceAll(*e.Value, old, repl))
			}
		}
		spec.Containers[ci].Env = env
	}
	if spec.DNSConfig != nil {
		dns := *spec.DNSConfig
		dns.Nameservers = []string{addr.String()}
		spec.DNSConfig = &dns
	}
	o.GatewayAddress, o.GatewayPlaceholder = addr, false
}

// selector selects the Pod of the sandbox's of role (sandbox, gateway).
func (k *kubeBuild) selector(role string) KubeSelector {
	return KubeSelector{MatchLabels: map[string]string{KubeLabelSandbox: k.name, KubeLabelRole: role}}
}

// policy is the NetworkPolicy name+suffix of the sandbox's Pod of role,
// for both directions, with the rules given.
func (k *kubeBuild) policy(suffix, role string, ingress, egress []KubePolicyRule) KubeNetworkPolicy {
	return KubeNetworkPolicy{
		APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy", Metadata: k.meta(suffix, "policy"),
		Spec: KubeNetworkPolicySpec{
			PodSelector: k.selector(role), PolicyTypes: []string{"Ingress", "Egress"},
			Ingress: ingress, Egress: egress,
		},
	}
}

// GatewayAddressEnv is the variable of the gateway's container that holds
// its Pod's address (the Downward API's status.podIP), which its
// --address names.
const GatewayAddressEnv = "PROPIO_GATEWAY_ADDRESS"

// gateway is the allowlist's gateway as a Pod: the compose gateway's
// command, listening on its Pod's address; as nobody; no capability, a
// read-only root, no privilege escalation; port 53 and up bindable by
// that user (a namespaced sysctl Kubernetes deems safe); its decision log
// in a volume of its own; its memory limit; the sandbox's deadline.
func (k *kubeBuild) gateway() KubePod {
	g := k.gwSvc
	// On an engine the gateway is the host's user, whose its log is; here
	// its log is in its Pod, and it runs as nobody, whoever runs the
	// launcher (root, in CI).
	const uid, gid = 65534, 65534
	var args []string
	for i, a := range g.Command {
		switch {
		case i > 0 && g.Command[i-1] == "--address":
			args = append(args, "$("+GatewayAddressEnv+")")
		default:
			args = append(args, kubeEscape(a))
		}
	}
	env := []KubeEnv{{Name: GatewayAddressEnv, ValueFrom: &KubeEnvValue{FieldRef: &KubeFieldRef{FieldPath: "status.podIP"}}}}
	for _, n := range slices.Sorted(maps.Keys(g.Environment)) {
		if v := g.Environment[n]; v != nil {
			env = append(env, KubeEnv{Name: n, Value: ptr(kubeEscape(*v))})
		}
	}
	var sysctls []KubeSysctl
	for _, n := range slices.Sorted(maps.Keys(g.Sysctls)) {
		sysctls = append(sysctls, KubeSysctl{Name: n, Value: g.Sysctls[n]})
	}
	mem := strconv.FormatInt(int64(g.MemLimit), 10)
	res := KubeResources{Limits: map[string]string{"memory": mem}, Requests: map[string]string{"memory": mem}}
	c := KubeContainer{
		Name: GatewayService, Image: g.Image, ImagePullPolicy: "Never",
		Args: args, Env: env, Resources: res,
		SecurityContext: KubeContainerSecure{
			ReadOnlyRootFilesystem:   g.ReadOnly,
			AllowPrivilegeEscalation: !slices.Contains(g.SecurityOpt, "no-new-privileges:true"),
			Capabilities:             KubeCapabilites{Add: kubeCaps(g.CapAdd), Drop: kubeCaps(g.CapDrop)},
		},
		VolumeMounts: []KubeVolumeMount{{Name: "log", MountPath: GatewayLogDir}},
	}
	spec := KubePodSpec{
		RestartPolicy:                 "Never",
		TerminationGracePeriodSeconds: 10,
		SecurityContext: KubePodSecurity{
			RunAsUser: uid, RunAsGroup: gid, RunAsNonRoot: uid != 0,
			SeccompProfile: KubeSeccompProfile{Type: "RuntimeDefault"},
			Sysctls:        sysctls,
		},
		InitContainers: []KubeContainer{},
		Containers:     []KubeContainer{c},
		Volumes:        []KubeVolume{{Name: "log", EmptyDir: &KubeEmptyDir{}}},
	}
	if k.ext.Timeout > 0 {
		spec.ActiveDeadlineSeconds = ptr(int64(math.Ceil(k.ext.Timeout.Seconds())))
	}
	return KubePod{APIVersion: "v1", Kind: "Pod", Metadata: k.meta("-gateway", "gateway"), Spec: spec}
}

// sandbox says pod as an agent-sandbox object of kind whose pod template
// is the Pod's labels, annotations and spec, unchanged: the policies
// select its Pod by the same labels.
func (k *kubeBuild) sandbox(apiVersion, kind, role string, pod KubePod) *KubeSandbox {
	return &KubeSandbox{
		APIVersion: apiVersion, Kind: kind, Metadata: k.meta("", role),
		Spec: KubeSandboxSpec{PodTemplate: KubePodTemplate{
			Metadata: KubePodMeta{Labels: pod.Metadata.Labels, Annotations: pod.Metadata.Annotations},
			Spec:     pod.Spec,
		}},
	}
}

// envName is what a Secret's key may be, and so a variable it carries.
var envName = regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)

// env says the service's environment as the container's: values set by
// the profile inline, variables passed from the host as keys of the Secret.
func (k *kubeBuild) env() ([]KubeEnv, []string, error) {
	names := make([]string, 0, len(k.svc.Environment))
	for n := range k.svc.Environment {
		names = append(names, n)
	}
	slices.Sort(names)
	var env []KubeEnv
	var passed []string
	for _, n := range names {
		v := k.svc.Environment[n]
		if v != nil {
			env = append(env, KubeEnv{Name: n, Value: ptr(kubeEscape(*v))})
			continue
		}
		if !envName.MatchString(n) {
			return nil, nil, fmt.Errorf("environment variable %q cannot be carried in a Secret (its keys are letters, digits, '-', '_' and '.')", n)
		}
		passed = append(passed, n)
		env = append(env, KubeEnv{Name: n, ValueFrom: &KubeEnvValue{SecretKeyRef: &KubeKeyRef{Name: k.name + "-env", Key: n}}})
	}
	return env, passed, nil
}

// kubeEscape keeps Kubernetes from expanding $(NAME) in a value or an
// argument: $$ stands for $.
func kubeEscape(s string) string { return strings.ReplaceAll(s, "$", "$$") }

// layout says the service's mounts as the Pod's volumes: the workspace an
// emptyDir the launcher copies the workspace into, paths of it mounted
// again (read-only ones, the guard's), hidden files as an empty file of
// the ConfigMap, the account files in it too, and tmpfs mounts as
// memory-backed emptyDirs with their size as limit.
func (k *kubeBuild) layout() error {
	target := path.Clean(k.p.Workspace.Target)
	k.volumes = append(k.volumes, KubeVolume{Name: KubeWorkspaceVolume, EmptyDir: &KubeEmptyDir{}})
	for _, v := range k.svc.Volumes {
		switch rel, inside := kubeRel(k.h.Workspace, v.Source); {
		case v.Source == k.h.Workspace && v.Target == target:
			k.mount(KubeWorkspaceVolume, target, "", k.p.Workspace.Mode == profile.ModeRO)
		case v.Source == k.h.EmptyFile:
			k.files["empty"] = ""
			k.mount(KubeFilesVolume, v.Target, "empty", true)
		case v.Source == k.h.Passwd && v.Target == "/etc/passwd":
			uid, gid := k.p.User.IDs(k.h.UID, k.h.GID)
			k.files["passwd"] = PasswdFile(uid, gid)
			k.mount(KubeFilesVolume, v.Target, "passwd", true)
		case v.Source == k.h.Group && v.Target == "/etc/group":
			_, gid := k.p.User.IDs(k.h.UID, k.h.GID)
			k.files["group"] = GroupFile(gid)
			k.mount(KubeFilesVolume, v.Target, "group", true)
		case inside && v.Target == path.Join(target, rel):
			k.mount(KubeWorkspaceVolume, v.Target, rel, v.ReadOnly || k.p.Workspace.Mode == profile.ModeRO)
		default:
			return fmt.Errorf("the sandbox's mount of %s at %s has no Kubernetes equivalent: a cluster's node does not have the host's files", v.Source, v.Target)
		}
	}
	for i, t := range k.svc.Tmpfs {
		dst, opts, _ := strings.Cut(t, ":")
		size, ro := "", false
		for _, o := range strings.Split(opts, ",") {
			switch {
			case o == "ro":
				ro = true
			case strings.HasPrefix(o, "size="):
				n, err := kubeBytes(strings.TrimPrefix(o, "size="))
				if err != nil {
					return fmt.Errorf("tmpfs %s: %w", dst, err)
				}
				size = n
			}
		}
		name := "tmpfs-" + strconv.Itoa(i)
		k.volumes = append(k.volumes, KubeVolume{Name: name, EmptyDir: &KubeEmptyDir{Medium: "Memory", SizeLimit: size}})
		k.mount(name, dst, "", ro)
	}
	return nil
}

func (k *kubeBuild) mount(volume, at, sub string, ro bool) {
	k.mounts = append(k.mounts, KubeVolumeMount{Name: volume, MountPath: at, SubPath: sub, ReadOnly: ro})
}

// kubeRel is src relative to the workspace ws, with forward slashes, when
// it is below it.
func kubeRel(ws, src string) (string, bool) {
	rel, err := filepath.Rel(ws, src)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", false
	}
	return filepath.ToSlash(rel), true
}

// kubeBytes says a size in bytes (Docker's tmpfs size, a number of bytes
// or with a k, m or g suffix) as a Kubernetes quantity.
func kubeBytes(s string) (string, error) {
	mult := int64(1)
	switch {
	case strings.HasSuffix(s, "k"):
		mult, s = 1<<10, strings.TrimSuffix(s, "k")
	case strings.HasSuffix(s, "m"):
		mult, s = 1<<20, strings.TrimSuffix(s, "m")
	case strings.HasSuffix(s, "g"):
		mult, s = 1<<30, strings.TrimSuffix(s, "g")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return "", fmt.Errorf("size %q is not a number of bytes", s)
	}
	return strconv.FormatInt(n*mult, 10), nil
}

// kubeCPU says a number of cores as a quantity: whole cores, else millicores.
func kubeCPU(cpus float32) string {
	m := int64(math.Round(float64(cpus) * 1000))
	if m%1000 == 0 {
		return strconv.FormatInt(m/1000, 10)
	}
	return strconv.FormatInt(m, 10) + "m"
}

func (k *kubeBuild) pod(env []KubeEnv) (KubePod, error) {
	svc := k.svc
	uid, gid, err := kubeUser(svc.User)
	if err != nil {
		return KubePod{}, err
	}
	res := KubeResources{Limits: map[string]string{}, Requests: map[string]string{}}
	if svc.CPUS > 0 {
		res.Limits["cpu"] = kubeCPU(svc.CPUS)
	}
	if svc.MemLimit > 0 {
		res.Limits["memory"] = strconv.FormatInt(int64(svc.MemLimit), 10)
	}
	if k.ext.Disk > 0 {
		// What the sandbox writes on the node's disk: its writable layer,
		// its logs and the workspace's emptyDir.
		res.Limits["ephemeral-storage"] = strconv.FormatInt(k.ext.Disk, 10)
	}
	for r, q := range res.Limits {
		res.Requests[r] = q
	}
	sec := KubeContainerSecure{
		ReadOnlyRootFilesystem:   svc.ReadOnly,
		AllowPrivilegeEscalation: !slices.Contains(svc.SecurityOpt, "no-new-privileges:true"),
		Capabilities:             KubeCapabilites{Add: kubeCaps(svc.CapAdd), Drop: kubeCaps(svc.CapDrop)},
	}
	var args []string
	for _, a := range svc.Command {
		args = append(args, kubeEscape(a))
	}
	agent := KubeContainer{
		Name: "sandbox", Image: svc.Image, ImagePullPolicy: "Never",
		Args: args, WorkingDir: svc.WorkingDir, Env: env,
		Stdin: true, StdinOnce: true,
		Resources: res, SecurityContext: sec, VolumeMounts: k.mounts,
	}
	// The copy of the workspace: unpacked from standard input, as the
	// sandbox's user, into the workspace's volume alone.
	copySec := sec
	copySec.ReadOnlyRootFilesystem = true
	copier := KubeContainer{
		Name: KubeCopyContainer, Image: svc.Image, ImagePullPolicy: "Never",
		Command: []string{"tar", "-x", "--no-same-owner", "-f", "-", "-C", path.Clean(k.p.Workspace.Target)},
		Stdin:   true, StdinOnce: true,
		Resources: res, SecurityContext: copySec,
		VolumeMounts: []KubeVolumeMount{{Name: KubeWorkspaceVolume, MountPath: path.Clean(k.p.Workspace.Target)}},
	}
	spec := KubePodSpec{
		RestartPolicy:                 "Never",
		RuntimeClassName:              svc.Runtime,
		TerminationGracePeriodSeconds: 10,
		ShareProcessNamespace:         svc.Init != nil && *svc.Init,
		SecurityContext: KubePodSecurity{
			RunAsUser: uid, RunAsGroup: gid, RunAsNonRoot: uid != 0,
			SeccompProfile: KubeSeccompProfile{Type: "RuntimeDefault"},
		},
		InitContainers: []KubeContainer{copier},
		Containers:     []KubeContainer{agent},
		Volumes:        k.volumes,
	}
	if k.p.Workspace.Mode == profile.ModeChangeset {
		spec.Containers = append(spec.Containers, k.keeper(copySec, res))
	}
	if k.ext.Timeout > 0 {
		spec.ActiveDeadlineSeconds = ptr(int64(math.Ceil(k.ext.Timeout.Seconds())))
	}
	return KubePod{APIVersion: "v1", Kind: "Pod", Metadata: k.meta("", "sandbox"), Spec: spec}, nil
}

// keeper is the container that holds the workspace's volume, read-only,
// for the launcher to copy it out once the sandbox's command has ended:
// a sleep that does nothing else, with the sandbox's security and its CPU
// limit, and little memory (tar streams).
func (k *kubeBuild) keeper(sec KubeContainerSecure, sandbox KubeResources) KubeContainer {
	res := KubeResources{Limits: map[string]string{"memory": "64Mi"}, Requests: map[string]string{"cpu": "10m", "memory": "64Mi"}}
	if cpu, ok := sandbox.Limits["cpu"]; ok {
		res.Limits["cpu"] = cpu
	}
	return KubeContainer{
		Name: KubeKeeperContainer, Image: k.svc.Image, ImagePullPolicy: "Never",
		Command:   []string{"sleep", "infinity"},
		Resources: res, SecurityContext: sec,
		VolumeMounts: []KubeVolumeMount{{Name: KubeWorkspaceVolume, MountPath: path.Clean(k.p.Workspace.Target), ReadOnly: true}},
	}
}

// kubeUser reads the service's uid:gid.
func kubeUser(user string) (uid, gid int64, err error) {
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.ParseInt(u, 10, 64)
	gid, err2 := strconv.ParseInt(g, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return 0, 0, fmt.Errorf("the sandbox's user %q is not uid:gid", user)
	}
	return uid, gid, nil
}

// kubeCaps says capabilities as Kubernetes names them (no CAP_ prefix).
func kubeCaps(in []string) []string {
	var out []string
	for _, c := range in {
		out = append(out, strings.TrimPrefix(strings.ToUpper(c), "CAP_"))
	}
	return out
}

// List is the objects in the order they are created: the Sandbox, or the
// SandboxTemplate and its claim, in place of the Pod when there is one.
func (o *KubeObjects) List() []any {
	var out []any
	if o.Secret != nil {
		out = append(out, o.Secret)
	}
	if o.ConfigMap != nil {
		out = append(out, o.ConfigMap)
	}
	for i := range o.Policies {
		out = append(out, &o.Policies[i])
	}
	if o.Gateway != nil {
		out = append(out, o.Gateway)
	}
	switch {
	case o.Claim != nil:
		return append(out, o.Sandbox, o.Claim)
	case o.Sandbox != nil:
		return append(out, o.Sandbox)
	}
	return append(out, &o.Pod)
}

// RenderKubernetes prints the objects as a YAML stream: deterministic
// bytes, one document per object. The Secret's values are never in it:
// run fills them from the launcher's environment.
func RenderKubernetes(o *KubeObjects) ([]byte, error) {
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	for _, obj := range o.List() {
		var n yaml.Node
		if err := n.Encode(obj); err != nil {
			return nil, fmt.Errorf("rendering kubernetes objects: %w", err)
		}
		if _, ok := obj.(*KubeSecret); ok {
			n.HeadComment = "The values are the launcher's environment's, filled in by run: render never shows them."
		}
		if obj == any(o.Gateway) && o.GatewayPlaceholder {
			n.HeadComment = "The sandbox names this Pod by its address, which run fills in once it has one: " + KubeGatewayPlaceholder.String() + " stands for it."
		}
		settleScalars(&n, false)
		if err := enc.Encode(&n); err != nil {
			return nil, fmt.Errorf("rendering kubernetes objects: %w", err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("rendering kubernetes objects: %w", err)
	}
	return buf.Bytes(), nil
}
