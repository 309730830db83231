// Package initgc keeps the garbage collector off while the launcher's
// packages initialize, and Restore puts it back as the environment set it
// (GOGC) once main starts.
//
// The launcher is started once per sandbox, and sometimes per command:
// its packages' initialization (the JSON Schema library compiles the
// meta-schemas of five drafts, and the Compose SDK's dependencies make
// their tables) allocates about 10 MB, over which the collector, started
// at 4 MB, would run a few times for nothing: all of it is kept. This
// package imports only runtime/debug, so that it is initialized before
// those (packages are initialized in the order of their import paths
// among those whose imports are ready; it is imported by main).
package initgc

import "runtime/debug"

// percent is the collector's setting before initialization turned it off.
var percent = debug.SetGCPercent(-1)

// Restore turns the collector back on as it was set before packages were
// initialized. main calls it first.
func Restore() { debug.SetGCPercent(percent) }
