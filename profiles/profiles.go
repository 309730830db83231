// Package profiles holds the built-in sandbox profiles. It only embeds them;
// the profile package parses and checks them.
package profiles

import (
	"embed"
	"io/fs"
	"sort"
	"strings"
)

// FS holds NAME.yaml for every built-in profile.
//
//go:embed *.yaml
var FS embed.FS

// Names lists the built-in profiles, sorted.
func Names() []string {
	entries, _ := fs.ReadDir(FS, ".")
	var names []string
	for _, e := range entries {
		if name, ok := strings.CutSuffix(e.Name(), ".yaml"); ok {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names
}
