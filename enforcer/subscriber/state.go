package subscriber

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/sluicehq/sluice/internal/atomicfile"
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
	temps, _ := filepath.Glob(filepath.Join(dir, atomicfile.TempPattern(StateFile)))
	for _, t := range temps {
		os.Remove(t)
	}
}

// persist writes snap to the state dir atomically (see atomicfile), so a
// crash leaves the previous state file or the new one, never part of one.
func (s *Subscriber) persist(snap *wire.Snapshot) error {
	if s.cfg.StateDir == "" {
		return nil
	}
	data, err := json.Marshal(snap)
	if err != nil {
		return fmt.Errorf("encode snapshot: %w", err)
	}
	if err := os.MkdirAll(s.cfg.StateDir, 0o700); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(s.cfg.StateDir, StateFile), data, 0o600); err != nil {
		return fmt.Errorf("write state file: %w", err)
	}
	return nil
}
