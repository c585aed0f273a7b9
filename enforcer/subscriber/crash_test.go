package subscriber_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/subscriber"
	"github.com/sluicehq/sluice/rules/wire"
)

// writerHelperEnv makes the test binary write snapshots into a state dir in
// a loop until it is killed (see TestMain).
const writerHelperEnv = "SLUICE_SUBSCRIBER_TEST_WRITER_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(writerHelperEnv); dir != "" {
		os.Exit(runWriter(dir))
	}
	os.Exit(m.Run())
}

// crashSnapshot is version v: a few domains padded to sizes that vary with
// v (up to about 2 MB in all), so that writes take a while.
func crashSnapshot(v int64) *wire.Snapshot {
	r := rand.New(rand.NewPCG(uint64(v), 7))
	var domains []wire.DomainConfig
	for i := range 1 + r.IntN(4) {
		name := fmt.Sprintf("d%d", i)
		pad := "# " + strings.Repeat(string(rune('a'+v%26)), r.IntN(500<<10)) + "\n"
		domains = append(domains, wire.DomainConfig{Name: name, YAML: pad +
			fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: %d}\n", name, v)})
	}
	return &wire.Snapshot{Type: wire.TypeSnapshot, Version: v, Checksum: wire.Checksum(domains), Domains: domains}
}

func runWriter(dir string) int {
	sub, err := subscriber.New(subscriber.Config{ConsoleURL: "http://127.0.0.1:1", StateDir: dir}, engine.New(nil, ""), nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	for v := int64(1); ; v++ {
		if err := sub.Persist(crashSnapshot(v)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if v == 1 {
			fmt.Println("ready")
		}
	}
}

// TestStateFileSurvivesSIGKILL kills a process that is writing the state
// file over and over, at various moments: the file left behind always
// parses, verifies and compiles, and a restart applies it.
func TestStateFileSurvivesSIGKILL(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	last := int64(0)
	for round := range 15 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), writerHelperEnv+"="+dir)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		ready := make(chan bool, 1)
		go func() {
			sc := bufio.NewScanner(out)
			ready <- sc.Scan() && sc.Text() == "ready"
		}()
		select {
		case ok := <-ready:
			if !ok {
				cmd.Wait()
				t.Fatal("writer exited before its first write")
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			t.Fatal("writer not ready within 30s")
		}
		// Kill it somewhere in its loop; where is up to chance.
		time.Sleep(time.Duration(rand.IntN(20)+round) * time.Millisecond)
		cmd.Process.Signal(syscall.SIGKILL)
		cmd.Wait()

		data, err := os.ReadFile(filepath.Join(dir, subscriber.StateFile))
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		var snap wire.Snapshot
		if err := json.Unmarshal(data, &snap); err != nil {
			t.Fatalf("round %d: state file does not parse (%d bytes): %v", round, len(data), err)
		}
		if got := wire.Checksum(snap.Domains); got != snap.Checksum {
			t.Fatalf("round %d: state file version %d fails its checksum", round, snap.Version)
		}

		eng := engine.New(nil, "")
		sub, err := subscriber.New(subscriber.Config{ConsoleURL: "http://127.0.0.1:1", StateDir: dir}, eng, nil)
		if err != nil {
			t.Fatal(err)
		}
		v, err := sub.LoadState()
		if err != nil {
			t.Fatalf("round %d: load state: %v", round, err)
		}
		if v != snap.Version || eng.Version() != v || !eng.HasDomain("d0") {
			t.Fatalf("round %d: loaded version %d, engine %d; want %d with domain d0", round, v, eng.Version(), snap.Version)
		}
		last = v
		temps, _ := filepath.Glob(filepath.Join(dir, ".*.tmp"))
		if len(temps) != 0 {
			t.Errorf("round %d: temporary files left after load: %v", round, temps)
		}
	}
	t.Logf("last round killed the writer after version %d", last)
}
