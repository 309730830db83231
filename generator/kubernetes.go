package generator

import "net/netip"

// The Kubernetes objects of a sandbox, as typed values: the fields a sandbox
// sets, in the API's names. The API server's strict field validation (run
// and the e2e dry run ask for it) checks them against the real schema.

// Kubernetes label and annotation keys of the objects of a sandbox.
const (
	KubeLabelManagedBy = "app.kubernetes.io/managed-by"
	KubeLabelSandbox   = "propio-sandbox.dev/sandbox"
	KubeLabelRole      = "propio-sandbox.dev/role"
	KubeManagedBy      = "propio-sandbox"
	KubeAnnProfile     = "propio-sandbox.dev/profile"
	KubeAnnWorkspace   = "propio-sandbox.dev/workspace"
)

// KubeOptions are the choices of a Kubernetes rendering.
type KubeOptions struct {
	// Namespace the objects are put in; "" leaves it to the client's
	// context.
	Namespace string
	// As is what carries the sandbox's Pod: KubeAsPod ("" too), or one of
	// the kinds of kubernetes-sigs/agent-sandbox.
	As string
	// GatewayAddress is the address of the gateway's Pod (network.mode
	// allowlist), which the sandbox's resolver and proxy variables name:
	// run knows it once the gateway's Pod has one. Unset (render), the
	// objects name KubeGatewayPlaceholder in its place.
	GatewayAddress netip.Addr
}

// KubeGatewayPlaceholder stands for the gateway Pod's address in the
// objects render prints: 192.0.2.2, of TEST-NET-1 (RFC 5737), which is
// never routed.
var KubeGatewayPlaceholder = netip.MustParseAddr("192.0.2.2")

// What carries the sandbox's Pod (KubeOptions.As).
const (
	// KubeAsPod: a bare Pod, what run creates.
	KubeAsPod = "pod"
	// KubeAsSandbox: an agent-sandbox Sandbox whose pod template is the
	// Pod's metadata and spec.
	KubeAsSandbox = "sandbox"
	// KubeAsTemplate: an agent-sandbox SandboxTemplate with that pod
	// template, and a SandboxClaim of it.
	KubeAsTemplate = "template"
)

// The API versions of kubernetes-sigs/agent-sandbox's kinds (v0.1.0):
// Sandbox in the core group, SandboxTemplate and SandboxClaim in the
// extensions group.
const (
	AgentSandboxAPI           = "agents.x-k8s.io/v1alpha1"
	AgentSandboxExtensionsAPI = "extensions.agents.x-k8s.io/v1alpha1"
)

// KubeObjects are the objects that run a sandbox on a cluster, in the order
// they are created: what carries the environment and the files, the
// network policies, then the sandbox's Pod.
type KubeObjects struct {
	Secret    *KubeSecret
	ConfigMap *KubeConfigMap
	Policies  []KubeNetworkPolicy
	Pod       KubePod
	// Gateway is the allowlist's gateway Pod (network.mode allowlist),
	// created, and running, before the sandbox's Pod: the sandbox's only
	// way out.
	Gateway *KubePod
	// GatewayPlaceholder: the sandbox names the gateway by
	// KubeGatewayPlaceholder (KubeOptions.GatewayAddress was unset).
	GatewayPlaceholder bool
	// GatewayAddress is the address the sandbox names the gateway by.
	GatewayAddress netip.Addr
	// Sandbox, with KubeOptions.As sandbox or template, carries the Pod
	// in place of the bare Pod: a Sandbox, or a SandboxTemplate that
	// Claim claims.
	Sandbox *KubeSandbox
	Claim   *KubeSandboxClaim
	// EnvPassed are the host variables the Secret carries, by name: run
	// reads their values from the launcher's environment; render never
	// shows them.
	EnvPassed []string
}

// KubeMeta is an object's metadata.
type KubeMeta struct {
	Name        string            `yaml:"name" json:"name"`
	Namespace   string            `yaml:"namespace,omitempty" json:"namespace,omitempty"`
	Labels      map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty" json:"annotations,omitempty"`
}

// KubeSecret is a v1 Secret.
type KubeSecret struct {
	APIVersion string            `yaml:"apiVersion" json:"apiVersion"`
	Kind       string            `yaml:"kind" json:"kind"`
	Metadata   KubeMeta          `yaml:"metadata" json:"metadata"`
	Type       string            `yaml:"type" json:"type"`
	StringData map[string]string `yaml:"stringData" json:"stringData"`
}

// KubeConfigMap is a v1 ConfigMap.
type KubeConfigMap struct {
	APIVersion string            `yaml:"apiVersion" json:"apiVersion"`
	Kind       string            `yaml:"kind" json:"kind"`
	Metadata   KubeMeta          `yaml:"metadata" json:"metadata"`
	Data       map[string]string `yaml:"data" json:"data"`
}

// KubeNetworkPolicy is a networking.k8s.io/v1 NetworkPolicy.
type KubeNetworkPolicy struct {
	APIVersion string                `yaml:"apiVersion" json:"apiVersion"`
	Kind       string                `yaml:"kind" json:"kind"`
	Metadata   KubeMeta              `yaml:"metadata" json:"metadata"`
	Spec       KubeNetworkPolicySpec `yaml:"spec" json:"spec"`
}

// KubeNetworkPolicySpec selects the sandbox's Pod and lists what it allows:
// nothing, for both directions, when the rules are empty.
type KubeNetworkPolicySpec struct {
	PodSelector KubeSelector     `yaml:"podSelector" json:"podSelector"`
	PolicyTypes []string         `yaml:"policyTypes" json:"policyTypes"`
	Ingress     []KubePolicyRule `yaml:"ingress" json:"ingress"`
	Egress      []KubePolicyRule `yaml:"egress" json:"egress"`
}

// KubePolicyRule allows traffic from (ingress) or to (egress) the Pods
// its peers select; a rule without peers allows any.
type KubePolicyRule struct {
	From []KubePolicyPeer `yaml:"from,omitempty" json:"from,omitempty"`
	To   []KubePolicyPeer `yaml:"to,omitempty" json:"to,omitempty"`
}

// KubePolicyPeer selects Pods of the policy's namespace by labels.
type KubePolicyPeer struct {
	PodSelector KubeSelector `yaml:"podSelector" json:"podSelector"`
}

// KubeSelector selects by labels.
type KubeSelector struct {
	MatchLabels map[string]string `yaml:"matchLabels" json:"matchLabels"`
}

// KubePod is a v1 Pod.
type KubePod struct {
	APIVersion string      `yaml:"apiVersion" json:"apiVersion"`
	Kind       string      `yaml:"kind" json:"kind"`
	Metadata   KubeMeta    `yaml:"metadata" json:"metadata"`
	Spec       KubePodSpec `yaml:"spec" json:"spec"`
}

// KubeSandbox is an agent-sandbox Sandbox, or a SandboxTemplate (the two
// specs' fields a sandbox sets are the same: the pod template).
type KubeSandbox struct {
	APIVersion string          `yaml:"apiVersion" json:"apiVersion"`
	Kind       string          `yaml:"kind" json:"kind"`
	Metadata   KubeMeta        `yaml:"metadata" json:"metadata"`
	Spec       KubeSandboxSpec `yaml:"spec" json:"spec"`
}

// KubeSandboxSpec is the spec of a Sandbox or a SandboxTemplate.
type KubeSandboxSpec struct {
	PodTemplate KubePodTemplate `yaml:"podTemplate" json:"podTemplate"`
}

// KubePodTemplate is the Pod a Sandbox runs: the bare Pod's labels,
// annotations and spec.
type KubePodTemplate struct {
	Metadata KubePodMeta `yaml:"metadata" json:"metadata"`
	Spec     KubePodSpec `yaml:"spec" json:"spec"`
}

// KubePodMeta is a pod template's metadata.
type KubePodMeta struct {
	Labels      map[string]string `yaml:"labels,omitempty" json:"labels,omitempty"`
	Annotations map[string]string `yaml:"annotations,omitempty" json:"annotations,omitempty"`
}

// KubeSandboxClaim is an agent-sandbox SandboxClaim: a Sandbox made from a
// SandboxTemplate.
type KubeSandboxClaim struct {
	APIVersion string               `yaml:"apiVersion" json:"apiVersion"`
	Kind       string               `yaml:"kind" json:"kind"`
	Metadata   KubeMeta             `yaml:"metadata" json:"metadata"`
	Spec       KubeSandboxClaimSpec `yaml:"spec" json:"spec"`
}

// KubeSandboxClaimSpec names the template claimed.
type KubeSandboxClaimSpec struct {
	TemplateRef KubeTemplateRef `yaml:"sandboxTemplateRef" json:"sandboxTemplateRef"`
}

// KubeTemplateRef names a SandboxTemplate.
type KubeTemplateRef struct {
	Name string `yaml:"name" json:"name"`
}

// KubePodSpec is the part of a Pod's spec a sandbox sets.
type KubePodSpec struct {
	RestartPolicy                 string          `yaml:"restartPolicy" json:"restartPolicy"`
	RuntimeClassName              string          `yaml:"runtimeClassName,omitempty" json:"runtimeClassName,omitempty"`
	ActiveDeadlineSeconds         *int64          `yaml:"activeDeadlineSeconds,omitempty" json:"activeDeadlineSeconds,omitempty"`
	TerminationGracePeriodSeconds int64           `yaml:"terminationGracePeriodSeconds" json:"terminationGracePeriodSeconds"`
	AutomountServiceAccountToken  bool            `yaml:"automountServiceAccountToken" json:"automountServiceAccountToken"`
	EnableServiceLinks            bool            `yaml:"enableServiceLinks" json:"enableServiceLinks"`
	ShareProcessNamespace         bool            `yaml:"shareProcessNamespace,omitempty" json:"shareProcessNamespace,omitempty"`
	SecurityContext               KubePodSecurity `yaml:"securityContext" json:"securityContext"`
	InitContainers                []KubeContainer `yaml:"initContainers" json:"initContainers"`
	Containers                    []KubeContainer `yaml:"containers" json:"containers"`
	Volumes                       []KubeVolume    `yaml:"volumes" json:"volumes"`
	DNSPolicy                     string          `yaml:"dnsPolicy,omitempty" json:"dnsPolicy,omitempty"`
	DNSConfig                     *KubeDNSConfig  `yaml:"dnsConfig,omitempty" json:"dnsConfig,omitempty"`
	HostAliases                   []KubeHostAlias `yaml:"hostAliases,omitempty" json:"hostAliases,omitempty"`
}

// KubePodSecurity is a Pod's securityContext.
type KubePodSecurity struct {
	RunAsUser      int64              `yaml:"runAsUser" json:"runAsUser"`
	RunAsGroup     int64              `yaml:"runAsGroup" json:"runAsGroup"`
	RunAsNonRoot   bool               `yaml:"runAsNonRoot" json:"runAsNonRoot"`
	SeccompProfile KubeSeccompProfile `yaml:"seccompProfile" json:"seccompProfile"`
	Sysctls        []KubeSysctl       `yaml:"sysctls,omitempty" json:"sysctls,omitempty"`
}

// KubeSysctl is a namespaced sysctl of the Pod.
type KubeSysctl struct {
	Name  string `yaml:"name" json:"name"`
	Value string `yaml:"value" json:"value"`
}

// KubeSeccompProfile names a seccomp profile.
type KubeSeccompProfile struct {
	Type string `yaml:"type" json:"type"`
}

// KubeDNSConfig is a Pod's resolver configuration.
type KubeDNSConfig struct {
	Nameservers []string        `yaml:"nameservers,omitempty" json:"nameservers,omitempty"`
	Options     []KubeDNSOption `yaml:"options,omitempty" json:"options,omitempty"`
}

// KubeDNSOption is a resolver option.
type KubeDNSOption struct {
	Name  string `yaml:"name" json:"name"`
	Value string `yaml:"value,omitempty" json:"value,omitempty"`
}

// KubeHostAlias is an /etc/hosts entry.
type KubeHostAlias struct {
	IP        string   `yaml:"ip" json:"ip"`
	Hostnames []string `yaml:"hostnames" json:"hostnames"`
}

// KubeContainer is a container of the Pod.
type KubeContainer struct {
	Name            string              `yaml:"name" json:"name"`
	Image           string              `yaml:"image" json:"image"`
	ImagePullPolicy string              `yaml:"imagePullPolicy" json:"imagePullPolicy"`
	Command         []string            `yaml:"command,omitempty" json:"command,omitempty"`
	Args            []string            `yaml:"args,omitempty" json:"args,omitempty"`
	WorkingDir      string              `yaml:"workingDir,omitempty" json:"workingDir,omitempty"`
	Env             []KubeEnv           `yaml:"env,omitempty" json:"env,omitempty"`
	Stdin           bool                `yaml:"stdin" json:"stdin"`
	StdinOnce       bool                `yaml:"stdinOnce" json:"stdinOnce"`
	TTY             bool                `yaml:"tty" json:"tty"`
	Resources       KubeResources       `yaml:"resources" json:"resources"`
	SecurityContext KubeContainerSecure `yaml:"securityContext" json:"securityContext"`
	VolumeMounts    []KubeVolumeMount   `yaml:"volumeMounts,omitempty" json:"volumeMounts,omitempty"`
}

// KubeEnv is an environment variable: a value, or a key of the Secret.
type KubeEnv struct {
	Name      string        `yaml:"name" json:"name"`
	Value     *string       `yaml:"value,omitempty" json:"value,omitempty"`
	ValueFrom *KubeEnvValue `yaml:"valueFrom,omitempty" json:"valueFrom,omitempty"`
}

// KubeEnvValue takes a variable's value from a key of a Secret, or from a
// field of the Pod.
type KubeEnvValue struct {
	SecretKeyRef *KubeKeyRef   `yaml:"secretKeyRef,omitempty" json:"secretKeyRef,omitempty"`
	FieldRef     *KubeFieldRef `yaml:"fieldRef,omitempty" json:"fieldRef,omitempty"`
}

// KubeFieldRef names a field of the Pod (the Downward API).
type KubeFieldRef struct {
	FieldPath string `yaml:"fieldPath" json:"fieldPath"`
}

// KubeKeyRef names a key of a Secret.
type KubeKeyRef struct {
	Name string `yaml:"name" json:"name"`
	Key  string `yaml:"key" json:"key"`
	// Optional: a key the Secret lacks leaves the variable unset (run
	// leaves out a passed variable the host does not have).
	Optional bool `yaml:"optional,omitempty" json:"optional,omitempty"`
}

// KubeResources are a container's requests and limits.
type KubeResources struct {
	Requests map[string]string `yaml:"requests,omitempty" json:"requests,omitempty"`
	Limits   map[string]string `yaml:"limits,omitempty" json:"limits,omitempty"`
}

// KubeContainerSecure is a container's securityContext.
type KubeContainerSecure struct {
	Privileged               bool            `yaml:"privileged" json:"privileged"`
	AllowPrivilegeEscalation bool            `yaml:"allowPrivilegeEscalation" json:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   bool            `yaml:"readOnlyRootFilesystem" json:"readOnlyRootFilesystem"`
	Capabilities             KubeCapabilites `yaml:"capabilities" json:"capabilities"`
}

// KubeCapabilites are the capabilities dropped and added.
type KubeCapabilites struct {
	Add  []string `yaml:"add,omitempty" json:"add,omitempty"`
	Drop []string `yaml:"drop,omitempty" json:"drop,omitempty"`
}

// KubeVolumeMount mounts a volume (or a path of it) in a container.
type KubeVolumeMount struct {
	Name      string `yaml:"name" json:"name"`
	MountPath string `yaml:"mountPath" json:"mountPath"`
	SubPath   string `yaml:"subPath,omitempty" json:"subPath,omitempty"`
	ReadOnly  bool   `yaml:"readOnly,omitempty" json:"readOnly,omitempty"`
}

// KubeVolume is a volume of the Pod: an emptyDir, or the ConfigMap.
type KubeVolume struct {
	Name      string         `yaml:"name" json:"name"`
	EmptyDir  *KubeEmptyDir  `yaml:"emptyDir,omitempty" json:"emptyDir,omitempty"`
	ConfigMap *KubeConfigRef `yaml:"configMap,omitempty" json:"configMap,omitempty"`
}

// KubeEmptyDir is an emptyDir volume; in memory (a tmpfs) when Medium is Memory.
type KubeEmptyDir struct {
	Medium    string `yaml:"medium,omitempty" json:"medium,omitempty"`
	SizeLimit string `yaml:"sizeLimit,omitempty" json:"sizeLimit,omitempty"`
}

// KubeConfigRef is a ConfigMap volume's source.
type KubeConfigRef struct {
	Name        string `yaml:"name" json:"name"`
	DefaultMode int    `yaml:"defaultMode" json:"defaultMode"`
}
