// Package templates holds the text templates propio-sandbox writes out, such
// as the profile scaffold of `propio-sandbox init`. It only embeds them.
package templates

import (
	"embed"
	"text/template"
)

//go:embed *.tmpl
var files embed.FS

// Sandbox is the scaffold of .propio/sandbox.yaml. Its data is SandboxData.
var Sandbox = template.Must(template.ParseFS(files, "sandbox.yaml.tmpl"))

// SandboxData fills the Sandbox template.
type SandboxData struct {
	SchemaURL string // where the JSON Schema is published
	Extends   string // the profile the scaffold builds on
}
