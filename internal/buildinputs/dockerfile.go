package buildinputs

import (
	"encoding/json"
	"path"
	"regexp"
	"slices"
	"strings"
)

// Sources returns the context paths that the COPY and ADD instructions of a
// Dockerfile name literally, cleaned and relative to the context root, in
// order, each once. Left out, as trust does not record them: a source with a
// wildcard or a variable, a URL or git address, one of another stage or
// image (--from), a heredoc, and one that leaves the context. Line
// continuations, comments, the escape directive, flags (--chown, --chmod,
// --link, ...) and the JSON form are understood; heredoc bodies are skipped.
func Sources(dockerfile []byte) []string {
	var out []string
	seen := map[string]bool{}
	for _, inst := range instructions(string(dockerfile)) {
		for _, src := range literalSources(inst) {
			if !seen[src] {
				seen[src] = true
				out = append(out, src)
			}
		}
	}
	return out
}

var escapeDirective = regexp.MustCompile(`(?i)^#\s*escape\s*=\s*(\S)\s*$`)

// heredocMarker finds the heredocs an instruction opens: <<WORD, <<-WORD,
// <<"WORD", <<'WORD'.
var heredocMarker = regexp.MustCompile(`<<(-?)(["']?)([A-Za-z_][A-Za-z0-9_.-]*)(["']?)`)

// instructions splits a Dockerfile into its instructions, each one logical
// line: continuations joined, comment lines dropped, heredoc bodies skipped.
func instructions(text string) []string {
	lines := strings.Split(strings.ReplaceAll(text, "\r\n", "\n"), "\n")
	escape := `\`
	// Parser directives come first, before any comment or instruction.
	for _, l := range lines {
		if m := escapeDirective.FindStringSubmatch(strings.TrimSpace(l)); m != nil {
			escape = m[1]
			continue
		}
		if strings.HasPrefix(strings.TrimSpace(l), "#") && strings.Contains(l, "=") {
			continue // another directive (syntax=...)
		}
		break
	}
	var out []string
	var cur strings.Builder
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		trimmed := strings.TrimSpace(l)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue // blank lines and comments, within a continuation too
		}
		if body, cont := strings.CutSuffix(strings.TrimRight(l, " \t"), escape); cont {
			cur.WriteString(body)
			cur.WriteString(" ")
			continue
		}
		cur.WriteString(l)
		inst := strings.TrimSpace(cur.String())
		cur.Reset()
		out = append(out, inst)
		// Heredocs: their bodies follow the instruction's line, one after
		// another, each up to its terminator.
		if !strings.Contains(inst, "<<") {
			continue
		}
		for _, m := range heredocMarker.FindAllStringSubmatch(inst, -1) {
			strip := m[1] == "-"
			for i+1 < len(lines) {
				i++
				body := lines[i]
				if strip {
					body = strings.TrimLeft(body, "\t")
				}
				if body == m[3] {
					break
				}
			}
		}
	}
	if rest := strings.TrimSpace(cur.String()); rest != "" {
		out = append(out, rest)
	}
	return out
}

// literalSources returns the sources of a COPY or ADD instruction that name
// context paths literally.
func literalSources(inst string) []string {
	word, rest, _ := strings.Cut(inst, " ")
	word = strings.ToUpper(strings.TrimSpace(word))
	if word != "COPY" && word != "ADD" {
		return nil
	}
	rest = strings.TrimSpace(rest)
	// Flags come first: --chown=..., --chmod=..., --link, --from=...
	for strings.HasPrefix(rest, "--") {
		flag, after, _ := strings.Cut(rest, " ")
		if name, _, _ := strings.Cut(strings.TrimPrefix(flag, "--"), "="); strings.EqualFold(name, "from") {
			return nil // another stage's or image's files
		}
		rest = strings.TrimSpace(after)
	}
	var args []string
	if strings.HasPrefix(rest, "[") {
		if err := json.Unmarshal([]byte(rest), &args); err != nil {
			args = strings.Fields(rest)
		}
	} else {
		args = strings.Fields(rest)
	}
	if len(args) < 2 {
		return nil
	}
	var out []string
	for _, src := range args[:len(args)-1] {
		if p, ok := literal(src); ok {
			out = append(out, p)
		}
	}
	return out
}

// literal returns a source as a clean path relative to the context root,
// when it names one file or directory there literally.
func literal(src string) (string, bool) {
	switch {
	case strings.ContainsAny(src, "*?[\\$"), strings.HasPrefix(src, "<<"):
		return "", false
	case strings.Contains(src, "://"), strings.HasPrefix(src, "git@"):
		return "", false
	}
	p := path.Clean("/" + src)[1:]
	if p == "" || strings.HasPrefix(path.Clean(src), "../") || path.Clean(src) == ".." {
		return "", false // the whole context, or outside it
	}
	return p, true
}

// BaseImages returns the images the FROM instructions of a Dockerfile
// build on, in order, each once: not scratch, not an earlier stage, and
// none written with a variable (its value is the build's).
func BaseImages(dockerfile []byte) []string {
	var out []string
	stages := map[string]bool{"scratch": true}
	for _, inst := range instructions(string(dockerfile)) {
		fields := strings.Fields(inst)
		if len(fields) < 2 || !strings.EqualFold(fields[0], "FROM") {
			continue
		}
		args := fields[1:]
		for len(args) > 0 && strings.HasPrefix(args[0], "--") {
			args = args[1:] // --platform=...
		}
		if len(args) == 0 {
			continue
		}
		image := args[0]
		if !stages[strings.ToLower(image)] && !strings.Contains(image, "$") && !slices.Contains(out, image) {
			out = append(out, image)
		}
		if len(args) >= 3 && strings.EqualFold(args[1], "AS") {
			stages[strings.ToLower(args[2])] = true
		}
	}
	return out
}
