#!/usr/bin/env bash
# podman-setup.sh: prepares rootful Podman next to Docker, so that the tests
# can run propio-sandbox against Podman's Docker-compatible API
# (DOCKER_HOST=unix:///run/podman/podman.sock); with --rootless, a rootless
# Podman of a user of its own instead. Idempotent: each step checks first
# and says what it does, or that nothing was needed.
#
#   sudo bash e2e/podman-setup.sh [IMAGE...]
#   sudo bash e2e/podman-setup.sh --rootless [IMAGE...]
#
# IMAGE: images to copy from Docker into Podman's storage when Podman lacks
# them or has another version (no registry is needed: docker save | podman
# load). Default: propio-sandbox-e2e/probe:latest propio-sandbox/agent:latest.
#
# --rootless: the user PODMAN_ROOTLESS_USER (default propio-rootless) runs
# Podman: it is made when missing, with ranges in /etc/subuid and
# /etc/subgid, a runtime directory (/run/user/UID, its XDG_RUNTIME_DIR) and
# a storage configuration of its own (overlay; through fuse-overlayfs on a
# kernel before 5.13), and its API service listens on
# /run/user/UID/podman/podman.sock, for that user alone. Run the tests as
# that user (runuser -u propio-rootless -- env
# XDG_RUNTIME_DIR=/run/user/UID DOCKER_HOST=unix://... go test ...), as
# .ci/run does. No firewall rule: its networks are in a network namespace
# of its own, reaching out through slirp4netns.
#
# Environment:
#   PODMAN_SOCKET            the API socket (default /run/podman/podman.sock,
#                            rootless /run/user/UID/podman/podman.sock)
#   PODMAN_ROOTLESS_USER     the user of --rootless (default propio-rootless)
#   PODMAN_SETUP_TIMEOUT     seconds to wait for the service (default 30)
#   PODMAN_SETUP_FIREWALL=0  skip the two iptables rules below
#
# Steps:
#  1. apt-get install podman and what rootful sandboxes need (runc, conmon,
#     netavark, aardvark-dns, catatonit for init), when podman is missing;
#     with --rootless, what rootless ones need too (uidmap, slirp4netns,
#     fuse-overlayfs).
#  2. /etc/containers/containers.conf.d/50-propio-sandbox.conf, when this host
#     needs it: Podman's default ulimits (nofile 1048576, nproc 4194304) above
#     the hard limits make every container fail ("setrlimit RLIMIT_NOFILE:
#     Operation not permitted"), and crun refuses hybrid cgroups ("cgroups in
#     hybrid mode not supported"), so runc is used there.
#     The rootless user gets its limits from it too.
#  R. with --rootless, the user, its ranges, runtime directory and storage.
#  3. iptables, only when Docker's FORWARD policy is DROP (Docker installed):
#     accept traffic inside one Podman bridge (else an internal network, the
#     allowlist sandbox's, passes nothing: netavark adds no rule for it), and
#     reject connections from Podman bridges to the host's own addresses in
#     198.18.0.0/15, the sandbox networks: Podman gives the host an address on
#     them (it ignores com.docker.network.bridge.inhibit_ipv4) where host
#     services and aardvark-dns (which forwards any name) would answer.
#  4. starts `podman system service --time=0` on the socket when nothing
#     answers there, in the background (log and pid next to the socket), and
#     waits until it answers; restarts it when step 2 changed the config and
#     this script had started it. With --rootless, as the user.
#  5. copies the images.
#
# Stop the service: kill "$(cat /run/podman/podman-service.pid)"
# (rootless: /run/user/UID/podman/podman-service.pid)
set -euo pipefail

say() { printf 'podman-setup: %s\n' "$*"; }
die() { printf 'podman-setup: error: %s\n' "$*" >&2; exit 1; }

ROOTLESS=""
if [ "${1:-}" = --rootless ]; then
	ROOTLESS=1
	shift
fi
RUSER=${PODMAN_ROOTLESS_USER:-propio-rootless}
if [ -n "$ROOTLESS" ]; then
	# The user's id is known once it is made (step R); its socket's place
	# follows from it.
	RUID=$(id -u "$RUSER" 2>/dev/null || true)
	SOCKET=${PODMAN_SOCKET:-/run/user/${RUID:-UID}/podman/podman.sock}
else
	SOCKET=${PODMAN_SOCKET:-/run/podman/podman.sock}
fi
TIMEOUT=${PODMAN_SETUP_TIMEOUT:-30}
FIREWALL=${PODMAN_SETUP_FIREWALL:-1}
RUNDIR=$(dirname "$SOCKET")
PIDFILE=$RUNDIR/podman-service.pid
LOGFILE=$RUNDIR/podman-service.log
CONF=/etc/containers/containers.conf.d/50-propio-sandbox.conf
if [ $# -gt 0 ]; then
	IMAGES=("$@")
else
	IMAGES=(propio-sandbox-e2e/probe:latest propio-sandbox/agent:latest)
fi

[ "$(id -u)" = 0 ] || die "run as root (it installs packages, and makes the rootless user): sudo bash $0 $*"
[[ $TIMEOUT =~ ^[0-9]+$ ]] || die "PODMAN_SETUP_TIMEOUT must be a number of seconds, not \"$TIMEOUT\""

# 1. Packages.
if command -v podman >/dev/null 2>&1; then
	say "podman is installed: $(podman --version)"
	# Its init (a sandbox runs with init: true) may be missing from an
	# install made without it.
	if [ ! -x /usr/libexec/podman/catatonit ] && command -v apt-get >/dev/null 2>&1; then
		say "installing catatonit, Podman's init (apt-get)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends catatonit >/dev/null 2>&1 ||
			{ apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends catatonit >/dev/null 2>&1; } ||
			die "apt-get install catatonit failed"
	fi
else
	command -v apt-get >/dev/null 2>&1 || die "podman is missing and there is no apt-get to install it"
	say "installing podman (apt-get)"
	start=$SECONDS
	export DEBIAN_FRONTEND=noninteractive
	aptlog=$(mktemp)
	{ apt-get update && apt-get install -y --no-install-recommends \
		podman runc conmon netavark aardvark-dns catatonit uidmap iptables; } >"$aptlog" 2>&1 ||
		die "apt-get install podman failed; the end of its output:
$(tail -n 20 "$aptlog")"
	rm -f "$aptlog"
	command -v podman >/dev/null 2>&1 || die "podman is still missing after apt-get install"
	say "installed $(podman --version) in $((SECONDS - start))s"
fi
if [ -n "$ROOTLESS" ]; then
	need=()
	command -v newuidmap >/dev/null 2>&1 || need+=(uidmap)
	command -v slirp4netns >/dev/null 2>&1 || need+=(slirp4netns)
	command -v fuse-overlayfs >/dev/null 2>&1 || need+=(fuse-overlayfs)
	if [ ${#need[@]} -gt 0 ]; then
		command -v apt-get >/dev/null 2>&1 || die "rootless Podman needs ${need[*]}, and there is no apt-get to install them"
		say "installing ${need[*]} for rootless Podman (apt-get)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 ||
			{ apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1; } ||
			die "apt-get install ${need[*]} failed"
	else
		say "uidmap, slirp4netns and fuse-overlayfs are installed"
	fi
fi

# 2. containers.conf for this host.
want_conf() {
	local nofile nproc pidmax ulimits=() runtime=""
	nofile=$(ulimit -Hn)
	nproc=$(ulimit -Hu)
	pidmax=$(cat /proc/sys/kernel/pid_max)
	# Rootful Podman runs its containers' monitors with nproc at most pid_max.
	if [ "$nproc" = unlimited ] || [ "$nproc" -gt "$pidmax" ]; then nproc=$pidmax; fi
	# Root without CAP_SYS_RESOURCE (a container, some VMs) cannot raise its
	# hard limits to Podman's defaults.
	if [ $(((0x$(sed -n 's/^CapEff:[[:space:]]*//p' /proc/self/status) >> 24) & 1)) = 0 ]; then
		if [ "$nofile" != unlimited ] && [ "$nofile" -lt 1048576 ]; then
			ulimits+=("\"nofile=$nofile:$nofile\"")
		fi
		if [ "$nproc" -lt 4194304 ]; then ulimits+=("\"nproc=$nproc:$nproc\""); fi
	fi
	if [ "$(stat -fc %T /sys/fs/cgroup)" != cgroup2fs ] && [ -n "$(cat /sys/fs/cgroup/unified/cgroup.controllers 2>/dev/null)" ]; then
		runtime=runc
	fi
	[ ${#ulimits[@]} -gt 0 ] || [ -n "$runtime" ] || return 0
	echo "# Written by propio-sandbox e2e/podman-setup.sh for this host."
	if [ ${#ulimits[@]} -gt 0 ]; then
		local IFS=,
		echo "[containers]"
		echo "# Podman's defaults exceed this host's hard limits."
		echo "default_ulimits = [${ulimits[*]}]"
	fi
	if [ -n "$runtime" ]; then
		echo "[engine]"
		echo "# Hybrid cgroups (v1 with a v2 mount holding controllers): crun 1.8 refuses them."
		echo "runtime = \"$runtime\""
	fi
}
conf_changed=0
wanted=$(want_conf)
if [ -z "$wanted" ]; then
	say "no containers.conf change needed on this host"
elif [ -f "$CONF" ] && [ "$(cat "$CONF")" = "$wanted" ]; then
	say "$CONF is up to date"
else
	say "writing $CONF:"
	printf '%s\n' "$wanted" | sed 's/^/    /'
	mkdir -p "$(dirname "$CONF")"
	{ printf "%s\n" "$wanted" >"$CONF.tmp" && mv "$CONF.tmp" "$CONF"; } || die "cannot write $CONF"
	conf_changed=1
fi

# R. The rootless user.
as_user() { # as_user CMD...: runs CMD as the rootless user, from /, in its environment
	(cd / && exec setpriv --reuid="$RUID" --regid="$RGID" --init-groups env -i HOME="$RHOME" USER="$RUSER" LOGNAME="$RUSER" \
		PATH="$PATH" XDG_RUNTIME_DIR="$RUNTIME" "$@")
}
pod() { # pod ARGS...: podman, as the user whose Podman this is
	if [ -n "$ROOTLESS" ]; then as_user podman "$@"; else podman "$@"; fi
}
free_range() { # free_range FILE: the first start past every range of FILE, at least 100000
	awk -F: 'BEGIN { n = 100000 } NF == 3 && $2 + $3 > n { n = $2 + $3 } END { print n }' "$1"
}
if [ -n "$ROOTLESS" ]; then
	if ! id -u "$RUSER" >/dev/null 2>&1; then
		say "making the user $RUSER"
		useradd --create-home --shell /bin/bash --user-group "$RUSER" || die "useradd $RUSER failed"
	else
		say "the user $RUSER exists"
	fi
	RUID=$(id -u "$RUSER")
	RGID=$(id -g "$RUSER")
	RHOME=$(getent passwd "$RUSER" | cut -d: -f6)
	RUNTIME=/run/user/$RUID
	SOCKET=${PODMAN_SOCKET:-$RUNTIME/podman/podman.sock}
	migrate=0
	for f in /etc/subuid /etc/subgid; do
		touch "$f"
		if grep -q "^$RUSER:" "$f"; then
			say "$f has a range for $RUSER: $(grep "^$RUSER:" "$f" | head -n 1)"
		else
			start=$(free_range "$f")
			say "adding the range $start:65536 for $RUSER to $f"
			echo "$RUSER:$start:65536" >>"$f"
			migrate=1
		fi
	done
	if [ ! -d "$RUNTIME" ]; then
		say "making $RUNTIME, the user's runtime directory"
		install -d -m 0700 -o "$RUID" -g "$RGID" "$RUNTIME"
	fi
	# Overlay storage: native on a kernel from 5.13, else through
	# fuse-overlayfs (vfs, Podman's fallback, copies every layer).
	storage="[storage]
driver = \"overlay\""
	if [ "$(printf '%s\n' 5.13 "$(uname -r | cut -d- -f1)" | sort -V | head -n 1)" != 5.13 ]; then
		storage="$storage
[storage.options.overlay]
mount_program = \"$(command -v fuse-overlayfs)\""
	fi
	sconf=$RHOME/.config/containers/storage.conf
	if [ -f "$sconf" ] && [ "$(cat "$sconf")" = "$storage" ]; then
		say "$sconf is up to date"
	else
		say "writing $sconf (overlay storage)"
		as_user mkdir -p "$(dirname "$sconf")"
		printf '%s\n' "$storage" | as_user sh -c 'cat >"$1.tmp" && mv "$1.tmp" "$1"' sh "$sconf" || die "cannot write $sconf"
		migrate=1
	fi
	if [ "$migrate" = 1 ]; then
		# New ranges or another storage driver: Podman's user namespace
		# and storage are made again (the test user's, holding only copies).
		if ! out=$(pod system migrate 2>&1); then
			say "podman system migrate failed ($out): resetting $RUSER's Podman storage"
			pod system reset -f >/dev/null 2>&1 || die "podman system reset as $RUSER failed"
		fi
	fi
	# (Its warnings, on stderr, are not the driver's name.)
	info_err=$(mktemp)
	driver=$(pod info --format '{{.Store.GraphDriverName}}' 2>"$info_err") || {
		say "podman info as $RUSER failed ($(tail -n 3 "$info_err")): resetting its storage"
		pod system reset -f >/dev/null 2>&1 || die "podman system reset as $RUSER failed"
		driver=$(pod info --format '{{.Store.GraphDriverName}}' 2>"$info_err") || die "podman info as $RUSER: $(tail -n 5 "$info_err")"
	}
	rm -f "$info_err"
	[ "$driver" = overlay ] || die "$RUSER's Podman storage is $driver, not overlay ($sconf); reset it: runuser -u $RUSER -- podman system reset"
	say "$RUSER's Podman: rootless, storage $driver"
	RUNDIR=$(dirname "$SOCKET")
	PIDFILE=$RUNDIR/podman-service.pid
	LOGFILE=$RUNDIR/podman-service.log
fi

# 3. Firewall, next to Docker's.
rule() { # rule TABLE-ARGS...: adds the rule unless it is there
	if iptables -C "$@" 2>/dev/null; then
		say "iptables rule present: $*"
	else
		say "adding iptables rule: $*"
		iptables -I "$@" || die "iptables -I $* failed"
	fi
}
if [ -n "$ROOTLESS" ]; then
	say "rootless: its networks are in a network namespace of $RUSER's, not on the host: no firewall rule"
elif [ "$FIREWALL" = 0 ]; then
	say "PODMAN_SETUP_FIREWALL=0: leaving iptables alone"
elif ! command -v iptables >/dev/null 2>&1; then
	say "no iptables: skipping the firewall rules"
elif iptables -S FORWARD 2>/dev/null | grep -qx -- '-P FORWARD DROP' && iptables -S DOCKER-USER >/dev/null 2>&1; then
	rule DOCKER-USER -i podman+ -o podman+ -m physdev --physdev-is-bridged \
		-m comment --comment "propio-sandbox podman-setup: inside a Podman bridge" -j ACCEPT
	rule INPUT -i podman+ -d 198.18.0.0/15 \
		-m comment --comment "propio-sandbox podman-setup: no host on sandbox networks" -j REJECT
else
	say "FORWARD policy is not Docker's DROP: no firewall rule needed"
fi

# 4. The API service.
answers() { curl -fsS --max-time 3 --unix-socket "$SOCKET" http://d/_ping >/dev/null 2>&1; }
command -v curl >/dev/null 2>&1 || die "curl is needed to check the service"
ours_running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null && grep -q podman "/proc/$(cat "$PIDFILE")/cmdline" 2>/dev/null; }
if answers && [ "$conf_changed" = 1 ]; then
	if ours_running; then
		say "restarting the service (pid $(cat "$PIDFILE")) for the new config"
		kill "$(cat "$PIDFILE")"
		for _ in $(seq 50); do answers || break; sleep 0.1; done
	else
		say "warning: the config changed but the service on $SOCKET was not started by this script: restart it yourself"
	fi
fi
if answers; then
	say "the Podman API answers on $SOCKET"
else
	[ -S "$SOCKET" ] && { say "removing the stale socket $SOCKET"; rm -f "$SOCKET"; }
	if [ -n "$ROOTLESS" ]; then
		as_user mkdir -p "$RUNDIR"
		say "starting podman system service as $RUSER on unix://$SOCKET (log $LOGFILE)"
		as_user sh -c 'setsid nohup podman system service --time=0 "unix://$1" >"$2" 2>&1 </dev/null & echo $! >"$3"' sh "$SOCKET" "$LOGFILE" "$PIDFILE"
	else
		mkdir -p "$RUNDIR"
		say "starting podman system service on unix://$SOCKET (log $LOGFILE)"
		# From /: Podman's conmon leaves files in the service's working directory
		# (an "oom" file when a container is killed for memory).
		setsid nohup sh -c 'cd / && exec podman system service --time=0 "unix://$1"' sh "$SOCKET" >"$LOGFILE" 2>&1 </dev/null &
		echo $! >"$PIDFILE"
	fi
	for ((i = 0; i < TIMEOUT * 10; i++)); do
		answers && break
		kill -0 "$(cat "$PIDFILE")" 2>/dev/null || die "the service exited at once; its log, $LOGFILE:
$(tail -n 20 "$LOGFILE")"
		sleep 0.1
	done
	answers || die "the service did not answer on $SOCKET within ${TIMEOUT}s; its log, $LOGFILE:
$(tail -n 20 "$LOGFILE")"
	say "the service answers (pid $(cat "$PIDFILE"))"
fi
# Non-root launchers (the tests run one as uid 4242) reach the socket through
# a group, as they reach Docker's through the docker group.
if [ -z "$ROOTLESS" ]; then
	getent group podman >/dev/null || groupadd --system podman || die "groupadd podman failed"
	chgrp podman "$SOCKET" && chmod 0660 "$SOCKET" && chmod o+x "$(dirname "$SOCKET")" ||
		die "giving the podman group the socket $SOCKET failed"
	say "socket $SOCKET: group podman, mode 0660"
fi
api=$(curl -fsS --max-time 5 --unix-socket "$SOCKET" http://d/version |
	sed -n 's/.*"ApiVersion":"\([^"]*\)".*/\1/p')
if [ -n "$ROOTLESS" ]; then
	say "Docker API version $api; use DOCKER_HOST=unix://$SOCKET as $RUSER (uid $RUID, XDG_RUNTIME_DIR=$RUNTIME)"
else
	say "Docker API version $api; use DOCKER_HOST=unix://$SOCKET"
fi

# 5. Images, from Docker.
command -v docker >/dev/null 2>&1 || die "no docker command: the images are copied from Docker"
id_of() { "$1" image inspect --format '{{.Id}}' "$2" 2>/dev/null | sed 's/^sha256://'; }
for image in "${IMAGES[@]}"; do
	docker_id=$(id_of docker "$image") ||
		die "image $image is not in Docker (build it there first: the probe with the e2e tests, the agent with bin/propio-sandbox build)"
	[ -n "$docker_id" ] || die "image $image is not in Docker"
	podman_id=$(id_of pod "$image" || true)
	if [ "$podman_id" = "$docker_id" ]; then
		say "image $image is in Podman (${docker_id:0:12})"
		continue
	fi
	if [ -z "$podman_id" ]; then why=missing; else why="Podman has ${podman_id:0:12}"; fi
	say "copying image $image (${docker_id:0:12}) from Docker into Podman ($why)"
	start=$SECONDS
	docker save "$image" | pod load -q >/dev/null || die "copying $image failed (docker save | podman load)"
	[ "$(id_of pod "$image")" = "$docker_id" ] || die "podman load did not give $image the id ${docker_id:0:12}"
	say "copied $image in $((SECONDS - start))s"
	if [ -n "$podman_id" ] && [ -z "$(pod image inspect --format '{{join .RepoTags ""}}' "$podman_id" 2>/dev/null)" ]; then
		if pod rmi "$podman_id" >/dev/null 2>&1; then
			say "removed the untagged previous version ${podman_id:0:12}"
		fi
	fi
done

# A container must start with this config.
probe=${IMAGES[0]}
if [ "$(pod image inspect --format '{{json .Config.Entrypoint}}' "$probe")" = '["/probe"]' ]; then
	cmd=(id)
else
	cmd=(true)
fi
out=$(pod run --rm --network none "$probe" "${cmd[@]}" 2>&1) ||
	die "a container of $probe does not start on Podman: $out"
say "ok: a container of $probe runs on Podman"
