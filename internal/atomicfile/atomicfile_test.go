package atomicfile_test

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluicehq/sluice/internal/atomicfile"
)

// temps lists the temporary files Write may have left for name in dir.
func temps(t *testing.T, dir, name string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, atomicfile.TempPattern(name)))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestWriteFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	for _, tt := range []struct {
		data string
		perm fs.FileMode
	}{
		{"first", 0o600},
		{"second, longer than the first", 0o644},
		{"3", 0o640},
	} {
		if err := atomicfile.WriteFile(path, []byte(tt.data), tt.perm); err != nil {
			t.Fatalf("WriteFile %q: %v", tt.data, err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tt.data {
			t.Errorf("content %q, want %q", got, tt.data)
		}
		info, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := info.Mode().Perm(); got != tt.perm {
			t.Errorf("after writing %q: mode %v, want %v", tt.data, got, tt.perm)
		}
		if left := temps(t, dir, "state.json"); len(left) != 0 {
			t.Errorf("temporary files left: %v", left)
		}
	}
}

func TestWriteFailureKeepsOldContent(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "export.csv")
	if err := atomicfile.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("stream cut")
	err := atomicfile.Write(path, 0o600, func(w io.Writer) error {
		if _, err := io.WriteString(w, "half of the new"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Write = %v, want the write function's error", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "old" {
		t.Errorf("content %q after a failed write, want the old content", got)
	}
	if left := temps(t, dir, "export.csv"); len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
}

func TestWriteMissingDirectory(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "missing", "f")
	if err := atomicfile.WriteFile(path, []byte("x"), 0o600); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("WriteFile into a missing directory = %v, want fs.ErrNotExist", err)
	}
}
