package subscriber

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/rules/wire"
)

// StateFile is the name of the last applied snapshot inside the state dir.
const StateFile = "snapshot.json"

// ErrNoState is returned by LoadState when there is no state file (or no
// state dir is configured).
var ErrNoState = errors.New("no saved ruleset snapshot")

// LoadState applies the snapshot saved in the state dir, if any, so that a
// restarted node enforces its last known good rules before it reaches the
// console. The file is verified (checksum) and compiled like a pushed
// snapshot; when it cannot be used, the engine is left untouched and the
// error says why. It returns the applied version.
func (s *Subscriber) LoadState() (int64, error) {
	if s.cfg.StateDir == "" {
		return 0, ErrNoState
	}
	removeTemps(s.cfg.StateDir)
	path := filepath.Join(s.cfg.StateDir, StateFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, ErrNoState
	}
	if err != nil {
		return 0, fmt.Errorf("read state: %w", err)
	}
	var snap wire.Snapshot
	if err := json.Unmarshal(data, &snap); err != nil {
		return 0, fmt.Errorf("decode state %s: %w", path, err)
	}
	if snap.Version <= 0 {
		return 0, fmt.Errorf("state %s: invalid version %d", path, snap.Version)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if snap.Version <= s.applied {
		return s.applied, nil
	}
	if err := s.apply(&snap); err != nil {
		return 0, fmt.Errorf("state %s: %w", path, err)
	}
	return snap.Version, nil
}

// removeTemps deletes temporary files that a write interrupted by a crash
// left behind; the state file itself is always whole.
func removeTemps(dir string) {
	temps, _ := filepath.Glob(filepath.Join(dir, tempPattern(StateFile)))
	for _, t := range temps {
		os.Remove(t)
	}
}

// tempPattern is the os.CreateTemp pattern of name's temporary files.
func tempPattern(name string) string { return "." + name + ".*.tmp" }

// persist writes snap to the state dir atomically: a temporary file in the
// same directory, fsynced, renamed over the old one, then the directory
// fsynced so the rename itself survives a crash.
func (s *Subscriber) persist(snap *wire.Snapshot) error {
	if s.cfg.StateDir == "" {
		return nil
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encode snapshot: %w", err)
	}
	return writeFileAtomic(s.cfg.StateDir, StateFile, data)
}

func writeFileAtomic(dir, name string, data []byte) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, tempPattern(name))
	if err != nil {
		return fmt.Errorf("create temp file: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return fmt.Errorf("rename state file: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open state dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync state dir: %w", err)
	}
	return nil
}
