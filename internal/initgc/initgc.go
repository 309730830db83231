// Package initgc holds the garbage collector off from the launcher's
// start until Restore puts it back as the environment set it (GOGC,
// GOMEMLIMIT): through the packages' initialization, and, for a launch,
// until its sandbox has started.
//
// The launcher is started once per sandbox, and sometimes per command,
// and its start is what a user waits for. Its packages' initialization
// (the JSON Schema library compiles the meta-schemas of five drafts, the
// Compose SDK's dependencies make their tables) and a launch up to the
// sandbox's start allocate about 7 MB, nearly all of it kept: the
// collector, which starts at 4 MB, would run two or three times for next
// to nothing, on the CPU the launch needs. While it is held, a memory
// limit of 64 MiB still has it run, should a command allocate more.
//
// This package imports only runtime/debug and sync, so that it is
// initialized before the heavy packages (packages are initialized in the
// order of their import paths among those whose imports are ready).
package initgc

import (
	"runtime/debug"
	"sync"
)

// held is the memory limit while the collector is held.
const held = 64 << 20

var (
	// percent and limit are the collector's settings before it was held.
	percent = debug.SetGCPercent(-1)
	limit   = debug.SetMemoryLimit(min(debug.SetMemoryLimit(-1), held))
)

// Restore turns the collector back on as it was set before; it may be
// called any number of times.
var Restore = sync.OnceFunc(func() {
	debug.SetGCPercent(percent)
	debug.SetMemoryLimit(limit)
})
