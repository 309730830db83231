package sandbox

import (
	"path/filepath"
	"testing"
)

// TestClaimName: the first launch in a workspace takes the name render
// shows; while it holds it, the next takes NAME-2, and a name the engine's
// sandboxes hold is passed over; a released name is taken again.
func TestClaimName(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(t.TempDir(), "My Project")
	none := func(string) bool { return false }

	first, release1, err := claimName(dir, ws, none)
	if err != nil {
		t.Fatal(err)
	}
	if first != "propio-my-project" {
		t.Errorf("first name = %q, want propio-my-project (what render shows)", first)
	}
	second, release2, err := claimName(dir, ws, none)
	if err != nil {
		t.Fatal(err)
	}
	if second != "propio-my-project-2" {
		t.Errorf("second name while the first is held = %q, want propio-my-project-2", second)
	}
	onEngine := func(n string) bool { return n == "propio-my-project-3" }
	third, release3, err := claimName(dir, ws, onEngine)
	if err != nil {
		t.Fatal(err)
	}
	if third != "propio-my-project-4" {
		t.Errorf("third name with -3 on the engine = %q, want propio-my-project-4", third)
	}
	release1()
	again, release4, err := claimName(dir, ws, none)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Errorf("after the first is released: %q, want %q again", again, first)
	}
	release2()
	release3()
	release4()
}

// A name held by a process of this host (a launcher, or the background
// process its launcher handed it to) is busy; a released one, or one never
// claimed, is not.
func TestNameBusy(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(t.TempDir(), "ws")
	h, err := claimHeld(dir, ws, func(string) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	if !nameBusy(dir, h.Name) {
		t.Errorf("%s is held but not busy", h.Name)
	}
	if nameBusy(dir, h.Name+"-2") {
		t.Error("a name never claimed is busy")
	}
	h.release()
	if nameBusy(dir, h.Name) {
		t.Errorf("%s is released but busy", h.Name)
	}
}
