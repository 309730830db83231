package guard

import (
	"bytes"
	"path"
	"path/filepath"
	"regexp"
	"strings"
)

// A hook of the user's is held read-only, but what it runs may not be: a
// pre-commit hook that runs ./scripts/check.sh, husky v4's hooks that run
// node_modules/husky/run.js (which reads package.json). The guard cannot
// tell the sandbox's honest edits of those files from a payload, so it
// puts nothing aside: hookNamed lists, before the run, what each hook
// names by its path in the root, and Check reports each one the sandbox
// changed, naming the file and the hook.

// dirnameOfHook is the hook's own directory as shell scripts write it:
// $(dirname "$0"), $(dirname -- "$0"), `dirname $0`, ...
var dirnameOfHook = regexp.MustCompile("\\$\\(\\s*dirname\\s+(--\\s+)?\"?\\$0\"?\\s*\\)|`\\s*dirname\\s+(--\\s+)?\"?\\$0\"?\\s*`")

// scriptExts are the extensions of a bare name a hook may run as a script.
var scriptExts = []string{".sh", ".bash", ".js", ".cjs", ".mjs", ".ts", ".py", ".rb", ".pl"}

// huskyV4Config are the files husky v4's run.js reads the hooks' commands
// from, in the worktree.
var huskyV4Config = []string{"package.json", ".huskyrc", ".huskyrc.json", ".huskyrc.js", ".huskyrc.yaml", ".huskyrc.yml", "husky.config.js"}

// nodePackage finds node_modules/PACKAGE (or @SCOPE/PACKAGE) in a script.
var nodePackage = regexp.MustCompile(`(?:^|[\s"'/=])node_modules/((?:@[\w.-]+/)?\w[\w.-]*)/`)

// uncommented is a script without its comment lines.
func uncommented(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// packageManagers run what package.json's scripts say.
var packageManagers = regexp.MustCompile(`(^|[\s;&|(])(npm|npx|yarn|pnpm|bun)\s`)

// hookNamed finds what the held hooks name by path in the root, following
// the scripts they name (a few levels), and the configuration husky or a
// package manager reads.
func (rp *RootPlan) hookNamed() {
	if rp.GitDir == "" || rp.GitDir == "." {
		return // a bare repository has no worktree here
	}
	seen := map[string]bool{}
	for _, hook := range rp.hooks() {
		if top, ok := rp.topOf(hook); ok {
			clear(seen)
			rp.namedBy(hook, hook, top, 0, seen)
		}
	}
}

// topOf is the top of the worktree a hook runs in: the root's, or for a
// submodule's hook the one its git directory's core.worktree names; ok is
// false when that is not in the root.
func (rp *RootPlan) topOf(hook string) (string, bool) {
	for _, gd := range rp.Protected {
		if gd == rp.GitDir || !strings.HasPrefix(hook, gd+"/hooks/") {
			continue
		}
		data, err := readFile(rp.Source, path.Join(gd, "config"))
		if err != nil {
			return "", false
		}
		entries, err := parseGitConfig(data)
		if err != nil {
			return "", false
		}
		wts := configValues(entries, "core", "", "worktree")
		if len(wts) == 0 {
			return "", false
		}
		return rp.inside(gd, wts[len(wts)-1])
	}
	return path.Dir(rp.GitDir), true
}

// namedBy adds what file (the hook, or a script it runs) names.
func (rp *RootPlan) namedBy(hook, file, top string, depth int, seen map[string]bool) {
	if depth > 3 || seen[file] || len(seen) > 64 {
		return
	}
	seen[file] = true
	data, err := readFile(rp.Source, file)
	if err != nil || bytes.IndexByte(data, 0) >= 0 {
		return // gone, or not a script
	}
	text := string(data)
	for _, p := range scriptPaths(text, filepath.Join(rp.Source, path.Dir(file))) {
		rel, ok := rp.inside(top, p)
		if !ok || rel == "." {
			continue
		}
		rp.name(hook, rel)
		if target, ok := resolveLink(rp.Source, rel); ok && target != rel {
			rp.name(hook, target) // node_modules/.bin/x leads into its package
			rel = target
		}
		if isShell(rp.Source, rel) {
			rp.namedBy(hook, rel, top, depth+1, seen)
		}
	}
	// A package a hook runs from the worktree's node_modules, however it
	// spells the way there ("$dir/node_modules/lefthook/bin/index.js").
	for _, m := range nodePackage.FindAllStringSubmatch(uncommented(text), -1) {
		rp.name(hook, path.Join(top, "node_modules", m[1]))
	}
	if strings.Contains(text, "husky") {
		for _, f := range huskyV4Config {
			rp.name(hook, path.Join(top, f))
		}
	} else if packageManagers.MatchString(text) {
		rp.name(hook, path.Join(top, "package.json"))
	}
}

// name adds rel (or the package it lies in, under node_modules: its files
// require each other) as named by hook, unless the held surface covers it.
func (rp *RootPlan) name(hook, rel string) {
	rel = packageDir(rel)
	for _, ro := range rp.ReadOnly {
		if rel == ro || strings.HasPrefix(rel, ro+"/") {
			return
		}
	}
	for _, n := range rp.Named {
		if n.Path == rel {
			return
		}
	}
	rp.Named = append(rp.Named, Named{Hook: hook, Path: rel})
}

// packageDir is the package a path under node_modules lies in
// (node_modules/husky, node_modules/@scope/pkg), or the path itself.
func packageDir(rel string) string {
	parts := strings.Split(rel, "/")
	for i := len(parts) - 2; i >= 0; i-- {
		if parts[i] != "node_modules" {
			continue
		}
		n := i + 2
		if strings.HasPrefix(parts[i+1], "@") && len(parts) > i+2 {
			n = i + 3
		}
		if strings.HasPrefix(parts[i+1], ".") || n > len(parts) {
			return rel // node_modules/.bin/x: the link, followed by namedBy
		}
		return strings.Join(parts[:n], "/")
	}
	return rel
}

// scriptPaths are the words of a shell script that name a file by its
// path: with a slash, or a bare name with a script's extension; never a
// word with an expansion, a pattern, an option or a URL. hookDir replaces
// the script's own directory ($(dirname "$0")). Comments are skipped.
func scriptPaths(text, hookDir string) []string {
	var out []string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = dirnameOfHook.ReplaceAllLiteralString(line, hookDir)
		line = strings.NewReplacer(`"`, "", `'`, "").Replace(line)
		words := strings.FieldsFunc(line, func(r rune) bool {
			return strings.ContainsRune(" \t;|&()<>=`", r)
		})
		for _, w := range words {
			switch {
			case strings.ContainsAny(w, "$*?[{~\\") || strings.HasPrefix(w, "-") || strings.Contains(w, "://"):
			case strings.Contains(w, "/"):
				out = append(out, w)
			default:
				for _, ext := range scriptExts {
					if strings.HasSuffix(w, ext) && len(w) > len(ext) {
						out = append(out, w)
						break
					}
				}
			}
		}
	}
	return out
}

// isShell reports whether the file rel is a shell script (by its name or
// its #! line): the paths its words name are read as a hook's are.
func isShell(root, rel string) bool {
	if strings.HasSuffix(rel, ".sh") || strings.HasSuffix(rel, ".bash") {
		return true
	}
	data, err := readFile(root, rel)
	if err != nil {
		return false
	}
	first, _, _ := strings.Cut(string(data), "\n")
	return strings.HasPrefix(first, "#!") && strings.Contains(first, "sh")
}
