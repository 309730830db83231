#!/usr/bin/env bash
# A real one-node Kubernetes cluster for the kube e2e tests, built from
# Debian's packages and the Go module proxy (no registry, no release download;
# see the README's "Kubernetes" section).
#
#   bash e2e/kube-cluster.sh build         build the binaries into the cache (idempotent: seconds when cached)
#   bash e2e/kube-cluster.sh start         build if needed, then start the cluster; prints the kubeconfig's path
#   bash e2e/kube-cluster.sh stop          stop it and put the host back (processes, pods, mounts,
#                                          iptables chains, ipsets, the bridge, cgroups, sysctls)
#   bash e2e/kube-cluster.sh status        exit 0 when the API server answers /readyz
#   bash e2e/kube-cluster.sh load IMAGE... copy images from the Docker engine into the node's containerd
#
# Run as root. One cluster per machine. Every wait is bounded. start installs
# what it needs from Debian when missing (etcd-server, containerd, runc,
# containernetworking-plugins, ipset, conntrack).
#
# The parts: etcd (Debian's etcd-server), kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy and kubectl (k8s.io/kubernetes from the module
# proxy), a containerd of its own (Debian's containerd and runc; its own socket and
# directories, never Docker's), Debian's CNI plugins (bridge, host-local, portmap,
# loopback, firewall), kube-router for NetworkPolicy, CoreDNS as a host process
# behind the kube-dns Service, and a pause image made from a static Go program.
#
# Environment:
#   PROPIO_KUBE_CACHE  where built binaries are kept, keyed by version
#                      (default /var/cache/propio-sandbox/kube)
#   PROPIO_KUBE_STATE  the cluster's data (default /var/lib/propio-sandbox-kube)
#   PROPIO_KUBE_RUN    its sockets and pid files (default /run/propio-sandbox-kube)
set -euo pipefail

K8S_VERSION=v1.35.4
KUBE_ROUTER_VERSION=v2.1.0
COREDNS_VERSION=v1.15.0
PAUSE_IMAGE=propio.test/pause:1

here=$(cd "$(dirname "$0")" && pwd)
cache=${PROPIO_KUBE_CACHE:-/var/cache/propio-sandbox/kube}
state=${PROPIO_KUBE_STATE:-/var/lib/propio-sandbox-kube}
rundir=${PROPIO_KUBE_RUN:-/run/propio-sandbox-kube}
bin=$cache/bin-k8s-$K8S_VERSION-router-$KUBE_ROUTER_VERSION-coredns-$COREDNS_VERSION
pki=$state/pki
logs=$state/logs
kubeconfig=$state/admin.kubeconfig

node=propio-node
bridge=propio-kube0
cni_name=propio-kube
pod_cidr=10.244.0.0/16
node_pod_cidr=10.244.0.0/24
service_cidr=10.96.0.0/16
kubernetes_svc_ip=10.96.0.1
dns_ip=10.96.0.10
api_port=16443
etcd_port=12379
etcd_peer_port=12380

say() { printf 'kube-cluster: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

need_root() { [[ $(id -u) -eq 0 ]] || die "run as root: the cluster's node changes iptables, mounts and cgroups"; }

# ---------------------------------------------------------------- build

build() {
  if [[ -x $bin/kube-apiserver && -x $bin/kubectl && -x $bin/kubelet && -x $bin/kube-proxy &&
    -x $bin/kube-controller-manager && -x $bin/kube-scheduler && -x $bin/kube-router &&
    -x $bin/coredns && -x $bin/pause ]]; then
    say "binaries cached in $bin"
    return
  fi
  command -v go >/dev/null || die "go is missing: the cluster's binaries are built from the Go module proxy"
  mkdir -p "$cache"
  local work
  work=$(mktemp -d "$cache/build.XXXXXX")
  # A half-built set is never taken for a whole one: binaries land in $work
  # and the directory is renamed into place only when all are there. The
  # trap removes itself: a RETURN trap set in a function outlives it and
  # would fire again when its caller (start) returns, where $work is unset
  # (set -u: the script then failed after a build that had succeeded).
  trap 'rm -rf "$work"; trap - RETURN' RETURN
  mkdir -p "$work/mod" "$work/out"
  local start=$SECONDS

  say "building kubernetes $K8S_VERSION (about 6 minutes on 2 cores with an empty Go cache)"
  local upstream_mod
  upstream_mod=$(cd "$work/mod" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",*$/\1/p')
  [[ -f $upstream_mod ]] || die "could not download k8s.io/kubernetes@$K8S_VERSION's go.mod from the module proxy"
  {
    echo "module propio.test/kubebuild"
    echo
    echo "go 1.25.0"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    # k8s.io/kubernetes replaces its staging modules with ./staging/...: a
    # module outside its tree takes their published versions instead.
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*#replace \1 => \1 v0.'"${K8S_VERSION#v1.}"'#p' "$upstream_mod"
  } >"$work/mod/go.mod"
  local minor=${K8S_VERSION#v1.}
  minor=${minor%%.*}
  local v=k8s.io/component-base/version
  local ldflags="-s -w -X $v.gitVersion=$K8S_VERSION -X $v.gitMajor=1 -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
  (cd "$work/mod" && GOFLAGS=-mod=mod CGO_ENABLED=0 nice go build -trimpath -ldflags "$ldflags" -o "$work/out/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl) ||
    die "building kubernetes failed"

  say "building kube-router $KUBE_ROUTER_VERSION (NetworkPolicy) and CoreDNS $COREDNS_VERSION"
  GOBIN=$work/out CGO_ENABLED=0 nice go install -trimpath -ldflags "-s -w" \
    "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" ||
    die "building kube-router failed"
  GOBIN=$work/out CGO_ENABLED=0 nice go install -trimpath -ldflags "-s -w" \
    "github.com/coredns/coredns@$COREDNS_VERSION" || die "building coredns failed"

  say "building the pause program (static, for the pause image)"
  mkdir -p "$work/pause"
  cat >"$work/pause/main.go" <<'EOF'
// pause holds a pod's namespaces: it waits for SIGTERM or SIGINT and exits 0.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
EOF
  (cd "$work/pause" && printf 'module propio.test/pause\n\ngo 1.25.0\n' >go.mod &&
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$work/out/pause" .) || die "building pause failed"

  rm -rf "$bin"
  mv "$work/out" "$bin"
  say "built in $((SECONDS - start))s into $bin"
}


# ---------------------------------------------------------------- start

pidfile() { echo "$rundir/$1.pid"; }

running() {
  local f
  f=$(pidfile "$1")
  [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

# launch NAME CMD...: starts CMD in the background with its log under $logs,
# unless it runs already.
launch() {
  local name=$1
  shift
  if running "$name"; then
    return
  fi
  setsid "$@" >"$logs/$name.log" 2>&1 </dev/null &
  echo $! >"$(pidfile "$name")"
}

# wait_for WHAT SECONDS CMD...: runs CMD until it succeeds, for at most SECONDS.
wait_for() {
  local what=$1 limit=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      say "$what did not come up within ${limit}s; the end of its log:"
      tail -30 "$logs/$what.log" >&2 2>/dev/null || true
      return 1
    fi
    sleep 0.5
  done
}

kubectl_() { "$bin/kubectl" --kubeconfig "$kubeconfig" --request-timeout 20s "$@"; }

node_ip() { ip -4 -o route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1; }

# cert NAME CN [O] [SANS]: a client or server certificate signed by the cluster's CA.
cert() {
  local name=$1 cn=$2 o=${3:-} sans=${4:-}
  [[ -f $pki/$name.crt ]] && return
  local subj="/CN=$cn"
  [[ -n $o ]] && subj="/O=$o$subj"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  local ext="$pki/$name.ext"
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=serverAuth,clientAuth"
    if [[ -n $sans ]]; then echo "subjectAltName=$sans"; fi
  } >"$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 3650 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$ext"
}

# write_kubeconfig FILE CERTNAME: a kubeconfig for a component or the admin.
write_kubeconfig() {
  local file=$1 name=$2
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: propio-test
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $pki/$name.crt
    client-key: $pki/$name.key
contexts:
- name: propio-test
  context:
    cluster: propio-test
    user: $name
    namespace: default
current-context: propio-test
EOF
}

pki_setup() {
  local ip=$1
  mkdir -p "$pki"
  if [[ ! -f $pki/ca.crt ]]; then
    openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$pki/ca.key" -subj "/CN=propio-sandbox-test-ca" \
      -days 3650 -out "$pki/ca.crt" 2>/dev/null
  fi
  cert apiserver kube-apiserver "" \
    "IP:127.0.0.1,IP:$ip,IP:$kubernetes_svc_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert admin propio-admin system:masters
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters
  cert controller-manager system:kube-controller-manager
  cert scheduler system:kube-scheduler
  cert kubelet "system:node:$node" system:nodes
  cert kubelet-serving "$node" "" "IP:127.0.0.1,IP:$ip,DNS:$node"
  cert proxy system:kube-proxy
  # kube-router and CoreDNS run on the host as cluster-wide readers; the
  # admin's group keeps this script short.
  cert router propio-kube-router system:masters
  cert coredns propio-coredns system:masters
  [[ -f $pki/sa.key ]] || openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
  [[ -f $pki/sa.pub ]] || openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
  local c
  for c in admin controller-manager scheduler kubelet proxy router coredns; do
    write_kubeconfig "$state/$c.kubeconfig" "$c"
  done
}

containerd_config() {
  mkdir -p "$state/cni/net.d" "$state/cni/ipam" "$state/containerd" "$rundir/containerd"
  cat >"$state/containerd.toml" <<EOF
version = 2
root = "$state/containerd"
state = "$rundir/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "$rundir/containerd.sock"
[ttrpc]
  address = "$rundir/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$state/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$state/cni/net.d"
EOF
  cat >"$state/cni/net.d/10-$cni_name.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "$cni_name",
  "plugins": [
    {"type": "bridge", "bridge": "$bridge", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$node_pod_cidr"}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": "$state/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "firewall"}
  ]
}
EOF
}

kubelet_config() {
  cat >"$state/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $pki/ca.crt}
authorization: {mode: AlwaysAllow}
tlsCertFile: $pki/kubelet-serving.crt
tlsPrivateKeyFile: $pki/kubelet-serving.key
cgroupDriver: cgroupfs
cgroupRoot: /propio-kube
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$rundir/containerd.sock
clusterDomain: cluster.local
clusterDNS: [$dns_ip]
resolvConf: /etc/resolv.conf
port: 10250
readOnlyPort: 0
healthzPort: 0
serializeImagePulls: false
protectKernelDefaults: false
makeIPTablesUtilChains: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
}

save_sysctls() {
  [[ -f $state/sysctls.saved ]] && return
  local k v
  for k in net.ipv4.ip_forward net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables \
    net.ipv4.conf.all.route_localnet vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops \
    kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.netfilter.nf_conntrack_max; do
    if v=$(sysctl -n "$k" 2>/dev/null); then
      printf '%s=%s\n' "$k" "$v"
    fi
  done >"$state/sysctls.saved"
}

ctr_() { ctr -a "$rundir/containerd.sock" -n k8s.io "$@"; }

load_images() {
  local img d
  d=$(mktemp -d)
  for img in "$@"; do
    if ! docker save "$img" -o "$d/image.tar"; then
      rm -rf "$d"
      die "docker save $img failed"
    fi
    if ! ctr_ images import "$d/image.tar" >/dev/null; then
      rm -rf "$d"
      die "importing $img into the node's containerd failed"
    fi
    say "loaded $img"
  done
  rm -rf "$d"
}

pause_image() {
  ctr_ images ls -q | grep -qx "$PAUSE_IMAGE" && return
  if ! docker image inspect "$PAUSE_IMAGE" >/dev/null 2>&1; then
    local d
    d=$(mktemp -d)
    cp "$bin/pause" "$d/pause"
    printf 'FROM scratch\nCOPY pause /pause\nENTRYPOINT ["/pause"]\n' >"$d/Dockerfile"
    docker build -q -t "$PAUSE_IMAGE" "$d" >/dev/null
    rm -rf "$d"
  fi
  load_images "$PAUSE_IMAGE"
}

# cgroup_root makes the kubelet's cgroupRoot in each cgroup v1 hierarchy
# (it refuses to start without them), the cpuset's with its parent's CPUs
# and memory nodes; on cgroup v2, the one directory.
cgroup_root() {
  local h
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    mkdir -p /sys/fs/cgroup/propio-kube
    return
  fi
  for h in /sys/fs/cgroup/*/; do
    [[ -L ${h%/} ]] && continue # cpu,cpuacct's aliases
    mkdir -p "$h/propio-kube"
    if [[ -f $h/cpuset.cpus ]]; then
      [[ -n $(cat "$h/propio-kube/cpuset.cpus") ]] || cat "$h/cpuset.cpus" >"$h/propio-kube/cpuset.cpus"
      [[ -n $(cat "$h/propio-kube/cpuset.mems") ]] || cat "$h/cpuset.mems" >"$h/propio-kube/cpuset.mems"
    fi
  done
}

readyz() { kubectl_ get --raw /readyz; }
node_ready() { [[ $(kubectl_ get node "$node" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]; }

# packages installs, from Debian, what the node needs and this machine lacks.
packages() {
  local missing=()
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/firewall ]] || missing+=(containernetworking-plugins)
  command -v ipset >/dev/null || missing+=(ipset)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v openssl >/dev/null || missing+=(openssl)
  if ((${#missing[@]})); then
    say "installing ${missing[*]} from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

start() {
  need_root
  rm -f "$kubeconfig.failed"
  # A failed start says so next to the kubeconfig: the tests waiting for
  # the cluster (testenv.Kube) stop waiting and say why.
  trap 'rc=$?; if ((rc)); then mkdir -p "$state"; echo "e2e/kube-cluster.sh start failed ($rc); logs in $logs" >"$kubeconfig.failed"; fi' EXIT
  packages
  build
  local ip
  ip=$(node_ip)
  [[ -n $ip ]] || die "no IPv4 address with a default route for the node"
  mkdir -p "$state" "$rundir" "$logs"
  chmod 700 "$state" "$rundir"
  save_sysctls
  modprobe br_netfilter 2>/dev/null || true
  sysctl -qw net.ipv4.ip_forward=1 2>/dev/null || true
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
  pki_setup "$ip"
  local start=$SECONDS

  launch etcd etcd --name propio --data-dir "$state/etcd" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "propio=http://127.0.0.1:$etcd_peer_port"
  wait_for etcd 60 curl -fsS "http://127.0.0.1:$etcd_port/health"

  launch kube-apiserver "$bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
    --bind-address 0.0.0.0 --advertise-address "$ip" --secure-port "$api_port" \
    --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
    --client-ca-file "$pki/ca.crt" --authorization-mode Node,RBAC \
    --service-cluster-ip-range "$service_cidr" \
    --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --enable-admission-plugins NodeRestriction --allow-privileged=true --profiling=false
  wait_for kube-apiserver 120 readyz

  launch kube-controller-manager "$bin/kube-controller-manager" --kubeconfig "$state/controller-manager.kubeconfig" \
    --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
    --use-service-account-credentials --controllers '*,-nodeipam' \
    --bind-address 127.0.0.1 --secure-port 10257 --profiling=false
  launch kube-scheduler "$bin/kube-scheduler" --kubeconfig "$state/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port 10259 --profiling=false

  containerd_config
  launch containerd containerd --config "$state/containerd.toml"
  wait_for containerd 30 ctr -a "$rundir/containerd.sock" version
  pause_image

  kubelet_config
  cgroup_root
  launch kubelet "$bin/kubelet" --config "$state/kubelet.yaml" --kubeconfig "$state/kubelet.kubeconfig" \
    --root-dir "$state/kubelet" --hostname-override "$node" --node-ip "$ip"
  wait_for kubelet 120 kubectl_ get node "$node"

  launch kube-proxy "$bin/kube-proxy" --kubeconfig "$state/proxy.kubeconfig" --hostname-override "$node" \
    --cluster-cidr "$pod_cidr" --proxy-mode iptables --conntrack-max-per-core 0 \
    --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
  # kube-router enforces NetworkPolicy by saving the host's whole filter
  # table, changing it and restoring it whole (iptables-restore -T filter):
  # the rules a Docker engine adds meanwhile for a network it makes (its
  # FORWARD accept for traffic inside the network's bridge) are lost, and
  # with bridge-nf-call-iptables on and FORWARD's policy DROP, containers on
  # that network no longer reach each other (the e2e tests beside the
  # cluster: a sandbox's DNS to its gateway timed out). While the cluster
  # runs, what stays inside one Docker bridge is accepted in DOCKER-USER, a
  # chain Docker never rewrites, as Docker's own rules do (no network made
  # here turns off inter-container traffic); routed traffic is untouched.
  docker_bridge_rule -I
  launch kube-router "$bin/kube-router" --kubeconfig "$state/router.kubeconfig" --hostname-override "$node" \
    --run-firewall=true --run-router=false --run-service-proxy=false --enable-cni=false \
    --metrics-port 0 --health-port 0

  # Cluster DNS: CoreDNS on the node's address, behind the kube-dns Service.
  # It answers the cluster's names only: nothing is forwarded.
  cat >"$state/Corefile" <<EOF
.:53 {
    bind $ip
    errors
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $state/coredns.kubeconfig propio-test
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
}
EOF
  launch coredns "$bin/coredns" -conf "$state/Corefile"
  kubectl_ apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: $dns_ip
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: kube-dns-node, namespace: kube-system, labels: {kubernetes.io/service-name: kube-dns}}
addressType: IPv4
endpoints:
- addresses: [$ip]
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
EOF
  wait_for kubelet 120 node_ready
  # The default service account exists once the controller manager made it:
  # Pods are refused in a namespace without it.
  wait_for kube-controller-manager 60 kubectl_ get serviceaccount default -n default
  say "cluster ready in $((SECONDS - start))s; kubeconfig: $kubeconfig"
  echo "$kubeconfig"
}

# ---------------------------------------------------------------- stop

stop_process() { # stop_process NAME: SIGTERM, then SIGKILL after 15s
  local f pid
  f=$(pidfile "$1")
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 30); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.5
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# shims lists the PIDs of the containerd shims of this cluster's containerd
# (they outlive it): those whose command line names its socket.
shims() {
  local p
  for p in /proc/[0-9]*; do
    if { tr "\\0" " " <"$p/cmdline"; } 2>/dev/null | grep -q -- "-address $rundir/containerd.sock"; then
      echo "${p#/proc/}"
    fi
  done
}

# docker_bridge_rule -I|-D: insert (once) or delete the DOCKER-USER rule that
# accepts traffic inside one of a Docker engine's bridges, when there is such
# a chain (a Docker engine runs here); see start.
docker_bridge_rule() {
  local rule=(DOCKER-USER -i br-+ -o br-+ -m physdev --physdev-is-bridged
    -m comment --comment "propio-sandbox kube-cluster: inside a Docker bridge" -j ACCEPT)
  iptables -S DOCKER-USER >/dev/null 2>&1 || return 0
  case $1 in
    -I) iptables -C "${rule[@]}" 2>/dev/null || iptables -I "${rule[@]}" ;;
    -D) while iptables -D "${rule[@]}" 2>/dev/null; do :; done ;;
  esac
}

# remove_chains TABLE REGEX: every chain of TABLE whose whole name matches
# the extended REGEX, and first the rules that jump to them.
remove_chains() {
  local table=$1 re=$2 chains c rule
  chains=$(iptables -t "$table" -S 2>/dev/null | sed -n 's/^-N \(.*\)$/\1/p' | grep -xE "$re" || true)
  [[ -n $chains ]] || return 0
  { iptables -t "$table" -S 2>/dev/null | grep -E -- "^-A .* -j ($re)( |\$)" || true; } | while read -r rule; do
    eval "iptables -t $table ${rule/-A/-D}" 2>/dev/null || true
  done
  for c in $chains; do iptables -t "$table" -F "$c" 2>/dev/null || true; done
  for c in $chains; do iptables -t "$table" -X "$c" 2>/dev/null || true; done
}

stop() {
  need_root
  # Best effort to the end: one step that fails must not leave the rest.
  set +e
  if running kubelet && [[ -x $bin/kubectl ]]; then
    # Pods first, so that their containers and network namespaces go the
    # way they came (bounded: whatever is left is removed below).
    kubectl_ delete pods --all --all-namespaces --grace-period 0 --force --wait=false >/dev/null 2>&1 || true
  fi
  local c
  for c in coredns kube-router kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver; do
    stop_process "$c"
  done
  if running containerd; then
    local t
    for t in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
  fi
  stop_process containerd
  local p
  for p in $(shims); do kill -9 "$p" 2>/dev/null || true; done
  stop_process etcd

  # Network: the CNI's namespaces (cni-*, containerd's names), the bridge,
  # the chains of kube-proxy, kube-router and the CNI plugins, ipsets.
  if [[ -d /var/run/netns ]]; then
    local ns
    for ns in /var/run/netns/cni-*; do
      [[ -e $ns ]] || continue
      ip netns delete "$(basename "$ns")" 2>/dev/null || true
    done
  fi
  ip link delete "$bridge" 2>/dev/null || true
  local table
  for table in filter nat mangle raw; do
    remove_chains "$table" 'KUBE-[A-Za-z0-9_-]+'
  done
  # The CNI's chains: the bridge plugin's masquerade chains carry this
  # network's name in their comment; the firewall plugin's are shared names
  # (CNI-FORWARD, CNI-ADMIN) that only CNI users make (Podman here uses netavark).
  local cnichains
  cnichains=$(iptables -t nat -S 2>/dev/null | grep -F -- "$cni_name" | sed -n 's/^-A \(CNI-[0-9a-f]*\) .*/\1/p' | sort -u | paste -sd'|' || true)
  if [[ -n $cnichains ]]; then remove_chains nat "$cnichains"; fi
  remove_chains nat 'CNI-HOSTPORT-[A-Z]+|CNI-DN-[0-9a-f]+'
  remove_chains filter 'CNI-FORWARD|CNI-ADMIN'
  docker_bridge_rule -D
  local set
  for set in $(ipset list -n 2>/dev/null | grep -E '^(KUBE-|kube-router)' || true); do
    ipset destroy "$set" 2>/dev/null || true
  done

  # Mounts below the cluster's directories, deepest first.
  local m
  for m in $(awk '{print $5}' /proc/self/mountinfo | grep -E "^($state|$rundir)(/|$)" | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  # Cgroups the kubelet made (its cgroupRoot), deepest first.
  local d
  for d in $(find /sys/fs/cgroup -mindepth 1 -maxdepth 2 -type d -name propio-kube 2>/dev/null); do
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  if [[ -f $state/sysctls.saved ]]; then
    while IFS== read -r k v; do sysctl -qw "$k=$v" 2>/dev/null || true; done <"$state/sysctls.saved"
    rm -f "$state/sysctls.saved"
  fi
  # The data goes (the next start is a fresh cluster); the PKI stays.
  rm -rf "$state/etcd" "$state/containerd" "$state/kubelet" "$state/cni/ipam" "$rundir"
  say "stopped"
}

status() { [[ -f $kubeconfig && -x $bin/kubectl ]] && readyz >/dev/null 2>&1; }

case ${1:-} in
build) build ;;
start) start ;;
stop) stop ;;
status) status ;;
load)
  shift
  need_root
  load_images "$@"
  ;;
kubeconfig) echo "$kubeconfig" ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
