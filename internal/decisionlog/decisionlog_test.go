package decisionlog

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC)

func header(project, workspace string, at time.Time) Header {
	return Header{Time: at, Project: project, Workspace: workspace, Profile: "builtin:standard"}
}

func TestStartWritesTheHeaderOwnerOnly(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	path, err := Start(dir, header("propio-demo-1", "/work", t0))
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, "propio-demo-1.jsonl") || path != Path(dir, "propio-demo-1") {
		t.Errorf("Start wrote %s", path)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"time":"2026-11-22T10:00:00Z","event":"start","project":"propio-demo-1","workspace":"/work","profile":"builtin:standard"}` + "\n"
	if string(data) != want {
		t.Errorf("the log is\n%s\nwant\n%s", data, want)
	}
	for p, mode := range map[string]os.FileMode{dir: 0o700, path: 0o600} {
		if info, err := os.Stat(p); err != nil || info.Mode().Perm() != mode {
			t.Errorf("%s: mode %v (%v), want %v", p, info.Mode().Perm(), err, mode)
		}
	}
	h, err := readHeader(path)
	if err != nil || h != (Header{Time: t0, Event: "start", Project: "propio-demo-1", Workspace: "/work", Profile: "builtin:standard"}) {
		t.Errorf("readHeader = %+v, %v", h, err)
	}
	// The name again (a later sandbox of the workspace): a new log, and
	// the first one kept beside it.
	if _, err := Start(dir, header("propio-demo-1", "/other", t0.Add(time.Minute))); err != nil {
		t.Fatal(err)
	}
	if h, _ := readHeader(path); h.Workspace != "/other" {
		t.Errorf("the new log's header is %+v", h)
	}
	kept, _ := filepath.Glob(filepath.Join(dir, "propio-demo-1.*.jsonl"))
	if len(kept) != 1 {
		t.Fatalf("want the first log kept aside, found %v", kept)
	}
	if h, _ := readHeader(kept[0]); h.Workspace != "/work" {
		t.Errorf("the first log's header became %+v", h)
	}
	if latest, err := Latest(dir, "/work"); err != nil || latest != kept[0] {
		t.Errorf("Latest(/work) = %s, %v; want the log kept aside, %s", latest, err, kept[0])
	}
}

func TestEntriesRoundTrip(t *testing.T) {
	dir := t.TempDir()
	path, err := Start(dir, header("p", "/w", t0))
	if err != nil {
		t.Fatal(err)
	}
	want := []Entry{
		{Time: t0.Add(time.Second), Client: "198.18.0.3:40000", Via: "connect", Host: "api.example.test", Port: 443, Allowed: true,
			Rule: "api.example.test", Reason: `allowed by network.allow "api.example.test"`, BytesUp: 517, BytesDown: 4096},
		{Time: t0.Add(2 * time.Second), Client: "198.18.0.3:40001", Via: "dns", Host: "denied.test", Port: 53, Reason: "no network.allow rule matches"},
		{Time: t0.Add(3 * time.Second), Via: "sni", Port: 443, Reason: "no server name", Error: "EOF"},
	}
	w, err := Append(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range want {
		if err := w.Write(e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := range want { // every line written says who decided: the rules, unless said
		want[i].DecidedBy = "rule"
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n%+v\nwant\n%+v", got, want)
	}
	// The format is what `logs --json` prints and the README shows.
	data, _ := os.ReadFile(path)
	line := strings.Split(string(data), "\n")[2]
	if line != `{"time":"2026-11-22T10:00:02Z","client":"198.18.0.3:40001","via":"dns","host":"denied.test","port":53,"allowed":false,"reason":"no network.allow rule matches","bytes_up":0,"bytes_down":0,"decided_by":"rule"}` {
		t.Errorf("an entry is written as %s", line)
	}
}

// An asked decision keeps who decided and its scope; a line of a log
// written before decided_by was (none) was decided by the rules.
func TestDecidedBy(t *testing.T) {
	var buf strings.Builder
	w := NewWriter(&buf)
	w.Write(Entry{Time: t0, Via: "connect", Host: "a.test", Port: 443, Allowed: true, DecidedBy: "user", Scope: "run"})
	if !strings.Contains(buf.String(), `"decided_by":"user","scope":"run"`) {
		t.Errorf("written as %s", buf.String())
	}
	path := filepath.Join(t.TempDir(), "old.jsonl")
	old := `{"time":"2026-11-22T10:00:00Z","event":"start","project":"p","workspace":"/w","profile":"x"}` + "\n" +
		`{"time":"2026-11-22T10:00:01Z","via":"dns","host":"a.test","allowed":true,"reason":"r","bytes_up":0,"bytes_down":0}` + "\n"
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil || len(got) != 1 || got[0].ByWho() != "rule" || got[0].Scope != "" {
		t.Fatalf("an old log reads as %+v, %v", got, err)
	}
}

func TestReadLeavesATornLastLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.jsonl")
	text := `{"time":"2026-11-22T10:00:00Z","event":"start","project":"p","workspace":"/w","profile":"x"}` + "\n" +
		`{"time":"2026-11-22T10:00:01Z","via":"dns","host":"a.test","port":53,"allowed":true,"reason":"r"}` + "\n" +
		"\n" +
		`{"time":"2026-11-22T10:00:02Z","via":"dns","host":"b.te`
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Host != "a.test" {
		t.Errorf("Read = %+v, want the one whole entry", got)
	}
	// A broken line that is whole is an error, with where it is.
	if err := os.WriteFile(path, []byte(text+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(path); err == nil || !strings.Contains(err.Error(), path+":4:") {
		t.Errorf("Read of a broken line: %v, want an error at line 4", err)
	}
	if _, err := Read(filepath.Join(t.TempDir(), "none.jsonl")); err == nil || !strings.HasPrefix(err.Error(), "reading the gateway log: ") {
		t.Errorf("Read of no file: %v", err)
	}
}

// TestReadInTimeOrder: a connection is written when it ends, after what was
// decided while it lasted; Read puts every entry where its time is, and
// keeps the written order of entries of one time. A log written before the
// outcome "failed" existed (allowed, with an error) reads as failures.
func TestReadInTimeOrder(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.jsonl")
	text := `{"time":"2026-11-22T10:00:00Z","event":"start","project":"p","workspace":"/w","profile":"x"}` + "\n" +
		`{"time":"2026-11-22T10:00:02Z","via":"dns","host":"b.test","allowed":false,"reason":"r"}` + "\n" +
		`{"time":"2026-11-22T10:00:01Z","via":"nat","host":"a.test","port":443,"allowed":true,"reason":"r","bytes_down":9}` + "\n" +
		`{"time":"2026-11-22T10:00:02Z","via":"dns","host":"c.test","allowed":true,"reason":"r","error":"no such host"}` + "\n" +
		`{"time":"2026-11-22T10:00:00.5Z","via":"dns","host":"a.test","allowed":true,"reason":"r"}` + "\n"
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, e := range got {
		order = append(order, e.Via+" "+e.Host+" "+string(e.Outcome()))
	}
	want := []string{"dns a.test allowed", "nat a.test allowed", "dns b.test denied", "dns c.test failed"}
	if !reflect.DeepEqual(order, want) {
		t.Errorf("Read in the order %q, want %q", order, want)
	}
}

func TestWriterKeepsLinesWhole(t *testing.T) {
	var buf strings.Builder
	w := NewWriter(&lockedWriter{w: &buf})
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() { w.Write(Entry{Via: "dns", Host: strings.Repeat("x", i) + ".test"}) })
	}
	wg.Wait()
	if err := w.Close(); err != nil {
		t.Errorf("Close of a NewWriter: %v", err)
	}
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 50 {
		t.Fatalf("%d lines, want 50", len(lines))
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "{") || !strings.HasSuffix(l, "}") {
			t.Errorf("a torn line: %q", l)
		}
	}
}

// lockedWriter panics if Writer writes to it concurrently.
type lockedWriter struct {
	mu sync.Mutex
	w  *strings.Builder
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	if !l.mu.TryLock() {
		panic("concurrent Write")
	}
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func TestLatest(t *testing.T) {
	dir := t.TempDir()
	if _, err := Latest(filepath.Join(dir, "none"), "/w"); !errors.Is(err, ErrNoLog) {
		t.Errorf("Latest of no directory: %v, want ErrNoLog", err)
	}
	if _, err := Latest(dir, "/w"); !errors.Is(err, ErrNoLog) {
		t.Errorf("Latest of an empty directory: %v, want ErrNoLog", err)
	}
	for _, h := range []Header{
		header("old", "/w", t0),
		header("new", "/w", t0.Add(time.Hour)),
		header("elsewhere", "/other", t0.Add(2*time.Hour)),
		header("middle", "/w", t0.Add(time.Minute)),
	} {
		if _, err := Start(dir, h); err != nil {
			t.Fatal(err)
		}
	}
	// Not logs: a torn header, another event, another extension.
	os.WriteFile(filepath.Join(dir, "torn.jsonl"), []byte(`{"time":"2027-01-01T00:00:00Z","event":"start","workspace":"/w"`), 0o600)
	os.WriteFile(filepath.Join(dir, "other.jsonl"), []byte(`{"time":"2027-01-01T00:00:00Z","event":"stop","workspace":"/w"}`+"\n"), 0o600)
	os.WriteFile(filepath.Join(dir, "notes.json"), []byte(`{"time":"2027-01-01T00:00:00Z","event":"start","workspace":"/w"}`+"\n"), 0o600)
	// The newest by its header, not by its file's time.
	os.Chtimes(Path(dir, "middle"), time.Now().Add(time.Hour), time.Now().Add(time.Hour))

	for workspace, want := range map[string]string{"/w": "new", "/other": "elsewhere"} {
		got, err := Latest(dir, workspace)
		if err != nil || got != Path(dir, want) {
			t.Errorf("Latest(%s) = %s, %v; want %s", workspace, got, err, Path(dir, want))
		}
	}
	if _, err := Latest(dir, "/nowhere"); !errors.Is(err, ErrNoLog) {
		t.Errorf("Latest of a workspace without a log: %v, want ErrNoLog", err)
	}
}

func TestFind(t *testing.T) {
	dir := t.TempDir()
	if _, err := Start(dir, header("p", "/w", t0)); err != nil {
		t.Fatal(err)
	}
	if got, err := Find(dir, "p"); err != nil || got != Path(dir, "p") {
		t.Errorf("Find(p) = %s, %v", got, err)
	}
	if _, err := Find(dir, "q"); !errors.Is(err, ErrNoLog) {
		t.Errorf("Find(q) = %v, want ErrNoLog", err)
	}
}

func TestPruneKeepsTheNewest(t *testing.T) {
	dir := t.TempDir()
	base := time.Now().Add(-time.Hour)
	for i := range 10 {
		path := filepath.Join(dir, "propio-x-"+strconv.Itoa(i)+".jsonl")
		if err := os.WriteFile(path, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		at := base.Add(time.Duration(i) * time.Minute) // 9 is the newest
		os.Chtimes(path, at, at)
	}
	other := filepath.Join(dir, "notes.txt")
	os.WriteFile(other, []byte("not a log"), 0o600)
	sub := filepath.Join(dir, "old.jsonl")
	os.Mkdir(sub, 0o700)
	os.Chtimes(sub, base.Add(-time.Hour), base.Add(-time.Hour))

	Prune(dir, 4)
	for i := range 10 {
		_, err := os.Stat(filepath.Join(dir, "propio-x-"+strconv.Itoa(i)+".jsonl"))
		if kept := err == nil; kept != (i >= 6) {
			t.Errorf("log %d kept=%v, want kept only for the 4 newest", i, kept)
		}
	}
	for _, p := range []string{other, sub} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s, not a log, was removed: %v", p, err)
		}
	}
}

func TestStartPrunes(t *testing.T) {
	dir := t.TempDir()
	old := time.Now().Add(-time.Hour)
	for i := range Keep {
		path := filepath.Join(dir, "propio-old-"+strconv.Itoa(i)+".jsonl")
		if err := os.WriteFile(path, []byte("{}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		os.Chtimes(path, old, old)
	}
	path, err := Start(dir, header("propio-new", "/w", t0))
	if err != nil {
		t.Fatal(err)
	}
	files, _ := os.ReadDir(dir)
	if len(files) != Keep {
		t.Errorf("%d logs after Start, want %d", len(files), Keep)
	}
	if _, err := os.Stat(path); err != nil {
		t.Errorf("Start pruned its own log: %v", err)
	}
}

func TestFileNameIsPure(t *testing.T) {
	if got := FileName("propio-demo-0a1b2c3d"); got != "propio-demo-0a1b2c3d.jsonl" {
		t.Errorf("FileName = %s", got)
	}
}

// TestPrepareThenBegin: a log made ahead is empty, the user's alone, and
// passed over by Latest, an earlier log of the name kept aside; Begin
// makes it the run's, with the header first and the gateway's entries
// after it; a log that is not empty any more is refused, untouched.
func TestPrepareThenBegin(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	old, err := Start(dir, header("propio-demo-2", "/work", t0))
	if err != nil {
		t.Fatal(err)
	}
	path, err := Prepare(dir, "propio-demo-2")
	if err != nil {
		t.Fatal(err)
	}
	if path != old {
		t.Errorf("Prepare made %s, want %s", path, old)
	}
	if info, err := os.Stat(path); err != nil || info.Size() != 0 || info.Mode().Perm() != 0o600 {
		t.Fatalf("the prepared log: %v, %v; want empty, 0600", info, err)
	}
	if matches, _ := filepath.Glob(filepath.Join(dir, "propio-demo-2.*.jsonl")); len(matches) != 1 {
		t.Errorf("the earlier log is not kept aside: %v", matches)
	}
	if got, err := Latest(dir, "/work"); err != nil || got == path {
		t.Errorf("Latest = %s, %v: want the earlier log, not the prepared one", got, err)
	}
	if err := Begin(dir, header("propio-demo-2", "/work", t0.Add(time.Hour))); err != nil {
		t.Fatal(err)
	}
	w, err := Append(path)
	if err != nil {
		t.Fatal(err)
	}
	w.Write(Entry{Time: t0.Add(time.Hour), Host: "allowed.test", Port: 443, Allowed: true})
	if got, err := Latest(dir, "/work"); err != nil || got != path {
		t.Errorf("Latest = %s, %v: want the begun log %s", got, err, path)
	}
	entries, err := Read(path)
	if err != nil || len(entries) != 1 || entries[0].Host != "allowed.test" {
		t.Errorf("entries %v, %v: want the gateway's one", entries, err)
	}
	before, _ := os.ReadFile(path)
	if err := Begin(dir, header("propio-demo-2", "/work", t0.Add(2*time.Hour))); err == nil {
		t.Error("Begin started a log that is not empty")
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("a refused Begin changed the log")
	}
}
