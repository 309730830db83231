package guard

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// configEntry is one variable of a git configuration file.
type configEntry struct {
	Section    string // lower case
	Subsection string // as written (case matters), "" for none
	Name       string // lower case
	Value      string // unquoted; for a name without "=", "true"
	Bare       bool   // written without "=" (boolean true)
}

// key is section.name, or section.subsection.name, as git prints it.
func (e configEntry) key() string {
	if e.Subsection == "" {
		return e.Section + "." + e.Name
	}
	return e.Section + "." + e.Subsection + "." + e.Name
}

// parseGitConfig reads a git configuration file with git's syntax:
// [section], [section "subsection"] and the older [section.subsection],
// name = value lines with quoting, escapes and continuation lines, # and ;
// comments. It is strict: anything git would take differently, or refuse,
// is an error, and the caller treats the file as unsafe.
func parseGitConfig(data []byte) ([]configEntry, error) {
	if bytes.IndexByte(data, 0) >= 0 {
		return nil, errors.New("a NUL byte")
	}
	data = bytes.TrimPrefix(data, []byte("\xef\xbb\xbf")) // git skips a UTF-8 BOM
	p := &configParser{src: data, line: 1}
	return p.parse()
}

type configParser struct {
	src     []byte
	pos     int
	line    int
	section string
	sub     string
	out     []configEntry
}

func (p *configParser) errorf(format string, args ...any) error {
	return fmt.Errorf("line %d: %s", p.line, fmt.Sprintf(format, args...))
}

func (p *configParser) peek() int {
	if p.pos >= len(p.src) {
		return -1
	}
	return int(p.src[p.pos])
}

func (p *configParser) next() int {
	c := p.peek()
	if c >= 0 {
		p.pos++
		if c == '\n' {
			p.line++
		}
	}
	return c
}

func isSpace(c int) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f' }

func isAlpha(c int) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func isNameChar(c int) bool { return isAlpha(c) || c >= '0' && c <= '9' || c == '-' }

func (p *configParser) skipLine() {
	for c := p.peek(); c >= 0 && c != '\n'; c = p.peek() {
		p.next()
	}
}

func (p *configParser) parse() ([]configEntry, error) {
	for {
		c := p.peek()
		switch {
		case c < 0:
			return p.out, nil
		case c == '\n' || isSpace(c):
			p.next()
		case c == '#' || c == ';':
			p.skipLine()
		case c == '[':
			if err := p.header(); err != nil {
				return nil, err
			}
		case isAlpha(c):
			if p.section == "" {
				return nil, p.errorf("a variable before any section")
			}
			if err := p.variable(); err != nil {
				return nil, err
			}
		default:
			return nil, p.errorf("unexpected %q", rune(c))
		}
	}
}

// header reads [section], [section "sub"] or [section.sub].
func (p *configParser) header() error {
	p.next() // [
	var name strings.Builder
	for {
		c := p.peek()
		if isNameChar(c) || c == '.' {
			name.WriteByte(byte(p.next()))
			continue
		}
		break
	}
	section := strings.ToLower(name.String())
	if section == "" {
		return p.errorf("an empty section name")
	}
	sub := ""
	switch c := p.next(); {
	case c == ']':
		if dot := strings.IndexByte(section, '.'); dot >= 0 {
			// The older form: [section.sub], whose subsection git lower-cases.
			sub = section[dot+1:]
			section = section[:dot]
			if sub == "" || section == "" {
				return p.errorf("a malformed section header")
			}
		}
	case isSpace(c):
		for isSpace(p.peek()) {
			p.next()
		}
		if p.next() != '"' {
			return p.errorf("a malformed section header")
		}
		if strings.Contains(section, ".") {
			return p.errorf("a malformed section header")
		}
		var b strings.Builder
		for {
			c := p.next()
			switch c {
			case -1, '\n':
				return p.errorf("an unterminated subsection name")
			case '"':
				if p.next() != ']' {
					return p.errorf("a malformed section header")
				}
				sub = b.String()
				p.section, p.sub = section, sub
				return nil
			case '\\':
				c = p.next()
				if c < 0 || c == '\n' {
					return p.errorf("an unterminated subsection name")
				}
			}
			b.WriteByte(byte(c))
		}
	default:
		return p.errorf("a malformed section header")
	}
	p.section, p.sub = section, sub
	return nil
}

// variable reads name [= value] to the end of its (continued) line.
func (p *configParser) variable() error {
	var name strings.Builder
	for isNameChar(p.peek()) {
		name.WriteByte(byte(p.next()))
	}
	for isSpace(p.peek()) {
		p.next()
	}
	e := configEntry{Section: p.section, Subsection: p.sub, Name: strings.ToLower(name.String())}
	switch c := p.peek(); {
	case c < 0 || c == '\n':
		e.Value, e.Bare = "true", true
		p.out = append(p.out, e)
		return nil
	case c != '=':
		return p.errorf("a bad variable name %q", name.String()+string(rune(c)))
	}
	p.next() // =
	v, err := p.value()
	if err != nil {
		return err
	}
	e.Value = v
	p.out = append(p.out, e)
	return nil
}

// value reads a value as git does: leading space dropped, trailing space
// outside quotes dropped, comments ended, escapes and continuations applied.
func (p *configParser) value() (string, error) {
	var b strings.Builder
	quoted := false
	pending := 0 // spaces seen outside quotes, written only if more follows
	for {
		c := p.next()
		switch {
		case c < 0 || c == '\n':
			if quoted {
				return "", p.errorf("an unterminated quoted value")
			}
			return b.String(), nil
		case !quoted && (c == '#' || c == ';'):
			p.skipLine()
			return b.String(), nil
		case !quoted && isSpace(c):
			if b.Len() > 0 {
				pending++
			}
			continue
		}
		if pending > 0 {
			b.WriteString(strings.Repeat(" ", pending))
			pending = 0
		}
		switch c {
		case '"':
			quoted = !quoted
		case '\\':
			e := p.next()
			switch e {
			case '\n':
				// A continuation line.
			case 'n':
				b.WriteByte('\n')
			case 't':
				b.WriteByte('\t')
			case 'b':
				b.WriteByte('\b')
			case '\\', '"':
				b.WriteByte(byte(e))
			case '\r':
				if p.peek() == '\n' {
					p.next()
					continue
				}
				return "", p.errorf("a bad escape")
			default:
				return "", p.errorf("a bad escape")
			}
		default:
			b.WriteByte(byte(c))
		}
	}
}

// safeConfig are the variables a repository's own configuration may keep
// when the sandbox made or changed it: none of them makes git run a
// program, read another file, or contact anything but the remotes named.
// Section and name are lower case; "*" stands for any subsection.
var safeConfig = map[string][]string{
	"core":        {"repositoryformatversion", "filemode", "bare", "logallrefupdates", "ignorecase", "precomposeunicode", "symlinks", "autocrlf", "eol", "safecrlf", "quotepath", "compression", "loosecompression", "bigfilethreshold", "sparsecheckout", "sparsecheckoutcone", "checkstat", "trustctime"},
	"extensions":  {"objectformat", "refstorage", "preciousobjects", "partialclone", "noop"},
	"remote.*":    {"url", "pushurl", "fetch", "push", "tagopt", "prune", "prunetags", "mirror", "skipdefaultupdate", "skipfetchall", "promisor", "partialclonefilter"},
	"branch.*":    {"remote", "pushremote", "merge", "rebase", "description"},
	"submodule.*": {"url", "active", "branch", "fetchrecursesubmodules", "ignore", "shallow"},
	"user":        {"name", "email"},
	"init":        {"defaultbranch"},
	"pull":        {"rebase", "ff"},
	"push":        {"default", "autosetupremote"},
	"fetch":       {"prune", "prunetags"},
	"merge":       {"ff", "conflictstyle"},
	"rebase":      {"autosquash", "autostash"},
	"gc":          {"auto", "autopacklimit"},
	"index":       {"version"},
}

func (e configEntry) safe() bool {
	section := e.Section
	if e.Subsection != "" {
		section += ".*"
	}
	return slices.Contains(safeConfig[section], e.Name)
}

// sanitizeConfig returns the configuration with only its safe variables,
// and the keys it dropped. A file that does not parse keeps nothing: git
// might read it otherwise than this parser.
func sanitizeConfig(data []byte) (clean []byte, dropped []string) {
	entries, err := parseGitConfig(data)
	if err != nil {
		return minimalConfig, []string{"(unreadable: " + err.Error() + ")"}
	}
	var kept []configEntry
	for _, e := range entries {
		if e.safe() {
			kept = append(kept, e)
		} else if !slices.Contains(dropped, e.key()) {
			dropped = append(dropped, e.key())
		}
	}
	if len(dropped) == 0 {
		return data, nil
	}
	return formatConfig(kept), dropped
}

// minimalConfig is what a repository whose configuration could not be read
// is left with.
var minimalConfig = []byte("[core]\n\trepositoryformatversion = 0\n\tbare = false\n")

// formatConfig writes entries back in git's syntax, each value quoted.
func formatConfig(entries []configEntry) []byte {
	var buf bytes.Buffer
	w := bufio.NewWriter(&buf)
	cur := "\x00"
	for _, e := range entries {
		header := e.Section + "\x00" + e.Subsection
		if header != cur {
			cur = header
			if e.Subsection == "" {
				fmt.Fprintf(w, "[%s]\n", e.Section)
			} else {
				fmt.Fprintf(w, "[%s %s]\n", e.Section, quoteConfig(e.Subsection))
			}
		}
		if e.Bare {
			fmt.Fprintf(w, "\t%s\n", e.Name)
			continue
		}
		fmt.Fprintf(w, "\t%s = %s\n", e.Name, quoteConfig(e.Value))
	}
	w.Flush()
	return buf.Bytes()
}

func quoteConfig(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`, "\b", `\b`)
	return `"` + r.Replace(s) + `"`
}

// configValues returns the values of section.name (any subsection when
// sub is "*"), in file order.
func configValues(entries []configEntry, section, sub, name string) []string {
	var out []string
	for _, e := range entries {
		if e.Section == section && e.Name == name && (sub == "*" && e.Subsection != "" || sub == e.Subsection) {
			out = append(out, e.Value)
		}
	}
	return out
}
