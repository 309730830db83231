package engine

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// daemonIdentity names the process that answers on the unix socket path:
// its pid and start time, this boot's ID, and the configuration file it
// reads (its path, size, mtime and inode), so that another process, or the
// same one after its configuration changed, has another name. "" when the
// process cannot be seen from here (another pid namespace) or is not
// known to be the engine (see daemonConfigFile).
func daemonIdentity(path string) string {
	conn, err := net.DialTimeout("unix", path, time.Second)
	if err != nil {
		return ""
	}
	defer conn.Close()
	raw, err := conn.(*net.UnixConn).SyscallConn()
	if err != nil {
		return ""
	}
	var cred *syscall.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	}); err != nil || cerr != nil || cred.Pid <= 0 {
		return ""
	}
	proc := "/proc/" + strconv.Itoa(int(cred.Pid))
	stat, err := os.ReadFile(proc + "/stat")
	if err != nil {
		return ""
	}
	// The fields after the command's name, which is in parentheses and
	// may hold anything: the start time is the 22nd field, the 20th after.
	_, rest, ok := bytes.Cut(stat, []byte(") "))
	fields := strings.Fields(string(rest))
	if !ok || len(fields) < 20 {
		return ""
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	cmdline, _ := os.ReadFile(proc + "/cmdline")
	id := fmt.Sprintf("pid %d start %s boot %s", cred.Pid, fields[19], strings.TrimSpace(string(boot)))
	conf, known := daemonConfigFile(cmdline, cred.Uid)
	if !known {
		return ""
	}
	if conf != "" {
		if fi, err := os.Stat(conf); err == nil {
			st, _ := fi.Sys().(*syscall.Stat_t)
			var ino uint64
			if st != nil {
				ino = st.Ino
			}
			id += fmt.Sprintf(" config %s %d %d %d", conf, fi.Size(), fi.ModTime().UnixNano(), ino)
		} else {
			id += " config " + conf + " none"
		}
	}
	return id
}

// daemonConfigFile is the configuration file a dockerd with this command
// line, run by uid, reads, and reads again on a reload: its
// --config-file, else the default; "" for Podman, which reads its
// configuration once, as it starts. known is false when that cannot be
// told: a rootless dockerd's default is in its user's home, and another
// program (systemd, which listens on the socket of an engine it starts on
// demand, and stays the same process when the engine starts again) does
// not name the engine.
func daemonConfigFile(cmdline []byte, uid uint32) (conf string, known bool) {
	args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00")
	switch filepath.Base(args[0]) {
	case "podman":
		return "", true
	case "dockerd":
	default:
		return "", false
	}
	for i, a := range args {
		if v, ok := strings.CutPrefix(a, "--config-file="); ok {
			conf = v
		} else if a == "--config-file" && i+1 < len(args) {
			conf = args[i+1]
		}
	}
	if conf == "" && uid != 0 {
		return "", false
	}
	if conf == "" {
		conf = "/etc/docker/daemon.json"
	}
	return conf, true
}
