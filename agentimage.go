// Package propiosandbox ships inside the binary what of the repository's top
// level a launch needs without a checkout: the build context of the default
// image, propio-sandbox/agent, that the built-in profiles build (the
// top-level Dockerfile, which copies nothing else, and its .dockerignore).
// A `go install`ed propio-sandbox builds that image from this copy; see
// internal/hostinfo's BuiltinContext. It only embeds: no I/O, nothing of ours.
package propiosandbox

import "embed"

// AgentContext is the default image's build context: Dockerfile and
// .dockerignore at its root.
//
//go:embed Dockerfile .dockerignore
var AgentContext embed.FS
