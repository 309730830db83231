package engine

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
)

// The engine's info (GET /info) is the slowest answer a launch waits for
// before it may create anything: Docker runs its runtimes' and init's
// --version for it, about 9 ms, 4% of a whole `docker run`. What a launch
// reads from it (the data directory, the architecture, the runtimes, the
// storage) is fixed for the life of the engine's process, but for the
// runtimes, which a reload of its configuration file may change. So it is
// kept, for an engine on this host's unix socket, under the identity of
// the process that answers on the socket (its pid and start time, this
// boot) and of the configuration file it reads; another engine process,
// or a configuration file changed since, reads it afresh. An engine known
// only by its address (tcp, ssh, a socket whose process this host cannot
// see) is always asked.

// infoRecord is what the cache keeps for one engine address.
type infoRecord struct {
	Identity string `json:"identity"`
	Info     Info   `json:"info"`
}

// infoCacheFile is where the info of the engine at host is kept: in the
// user's cache directory, "" when there is none.
func infoCacheFile(host string) string {
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	sum := sha256.Sum256([]byte(host))
	return filepath.Join(dir, "propio-sandbox", "engine-info", hex.EncodeToString(sum[:8])+".json")
}

// cachedEngineInfo is the kept info of the engine at host when it was
// read from the engine process identity names.
func cachedEngineInfo(host, identity string) (Info, bool) {
	file := infoCacheFile(host)
	if identity == "" || file == "" {
		return Info{}, false
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return Info{}, false
	}
	var r infoRecord
	if json.Unmarshal(data, &r) != nil || r.Identity != identity || r.Info.Host != host {
		return Info{}, false
	}
	return r.Info, true
}

// keepEngineInfo keeps in for the engine process identity names, whole or
// not at all (written aside, then renamed); a failure only costs the next
// launch a read of the info.
func keepEngineInfo(identity string, in Info) {
	file := infoCacheFile(in.Host)
	if identity == "" || file == "" {
		return
	}
	data, err := json.Marshal(infoRecord{Identity: identity, Info: in})
	if err != nil {
		return
	}
	if os.MkdirAll(filepath.Dir(file), 0o700) != nil {
		return
	}
	tmp, err := os.CreateTemp(filepath.Dir(file), ".info-*")
	if err != nil {
		return
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr != nil || cerr != nil || os.Rename(tmp.Name(), file) != nil {
		os.Remove(tmp.Name())
	}
}
