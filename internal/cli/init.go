package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/propio/propio-sandbox/internal/fsutil"
	"github.com/propio/propio-sandbox/internal/profile"
	"github.com/propio/propio-sandbox/schema"
	"github.com/propio/propio-sandbox/templates"
	"github.com/spf13/cobra"
)

func newInit(a *app) *cobra.Command {
	var extends string
	cmd := &cobra.Command{
		Use:   "init [--extends NAME]",
		Short: "Write .propio/sandbox.yaml for this repository (never overwrites)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			e, err := loadEnv()
			if err != nil {
				return err
			}
			if _, err := e.locs.Source(extends); err != nil {
				return withHint(err, "run `"+name+" profiles` to list the profiles there are")
			}
			path := filepath.Join(e.workspace, profile.RepoProfile)
			if profile.IsPath(extends) {
				// extends is read relative to the new file, not to here.
				if extends, err = relativeTo(filepath.Dir(path), extends); err != nil {
					return err
				}
			}
			if _, err := os.Lstat(path); err == nil {
				return withHint(fmt.Errorf("%s already exists; init never overwrites", profile.RepoProfile),
					"edit it, or remove it first to start over")
			} else if !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			var buf bytes.Buffer
			if err := templates.Sandbox.Execute(&buf, templates.SandboxData{SchemaURL: schema.ProfileURL, Extends: extends}); err != nil {
				return fmt.Errorf("rendering the profile scaffold: %w", err)
			}
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return err
			}
			if err := fsutil.WriteFileAtomic(path, buf.Bytes(), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "wrote %s (extends %s)\n", profile.RepoProfile, extends)
			fmt.Fprintf(a.stdout, "next: review it, then `%s trust` to let run use it\n", name)
			return nil
		},
	}
	cmd.Flags().StringVar(&extends, "extends", profile.DefaultBuiltin, "the profile the new one builds on")
	return cmd
}

// relativeTo returns the path of an existing profile file, given relative
// to the current directory, as seen from dir.
func relativeTo(dir, file string) (string, error) {
	abs, err := filepath.Abs(file)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(abs); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("profile file %s: %w", file, profile.ErrNotFound)
	} else if err != nil {
		return "", err
	} else if st.IsDir() {
		return "", fmt.Errorf("profile %s is a directory, not a YAML file", file)
	}
	if real, err := filepath.EvalSymlinks(filepath.Dir(abs)); err == nil {
		abs = filepath.Join(real, filepath.Base(abs))
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil {
		return filepath.ToSlash(abs), nil
	}
	return filepath.ToSlash(rel), nil
}
