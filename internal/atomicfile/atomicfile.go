// Package atomicfile replaces files so that a crash at any point leaves
// either the old content or the new, never part of either: the data goes to
// a temporary file in the same directory, which is fsynced and renamed over
// the target, and the directory is then fsynced so the rename itself
// survives a crash.
package atomicfile

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// TempPattern is the os.CreateTemp pattern of the temporary files Write
// creates for a file named name (a base name). A crash can leave one behind;
// a reader may remove what matches it.
func TempPattern(name string) string { return "." + name + ".*.tmp" }

// WriteFile replaces path with data, with permissions perm.
func WriteFile(path string, data []byte, perm fs.FileMode) error {
	return Write(path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write replaces path with what write writes, with permissions perm. If
// write or any step up to the rename fails, path is left as it was, the
// temporary file is removed and the error returned (write's own error as it
// is). An error after the rename (syncing the directory) leaves the new
// content in place, but a crash could still undo it.
func Write(path string, perm fs.FileMode, write func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, TempPattern(filepath.Base(path)))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := write(tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), perm); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
