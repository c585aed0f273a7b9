package hub_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testenv"
	"github.com/sluicehq/sluice/rules/wire"
)

// floorEnv makes the test binary run the floor's peers (see runFloorPeers).
const floorEnv = "SLUICE_HUB_FLOOR_PEERS"

// floorPublish measures the transport floor of a publish to n nodes: the
// CPU this process spends writing a frame of size bytes (the snapshot
// BenchmarkPush's console wrote to each node) to each of n loopback TCP
// connections, one write each, and reading each peer's ack (a wire.Ack as
// JSON), one read each, with a goroutine per connection blocked in Read as
// the console has. The peers are another process, as the fleet is. No
// websocket framing, JSON, registry or Postgres: what is left is what the
// kernel charges the writer of a loopback socket (it delivers the bytes to
// the reader and wakes it) and the Go runtime's netpoller. It returns the
// CPU per publish, the median of rounds publishes after a warm-up one.
func floorPublish(b *testing.B, n, size, rounds int) time.Duration {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^$", "-test.bench=^$")
	cmd.Env = append(os.Environ(), "GOGC=400", floorEnv+"="+ln.Addr().String(),
		"SLUICE_HUB_FLOOR_N="+strconv.Itoa(n), "SLUICE_HUB_FLOOR_BYTES="+strconv.Itoa(size))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()

	var wg sync.WaitGroup
	defer wg.Wait() // after the connections close (defers run last first)
	conns := make([]net.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var acked atomic.Int64
	done := make(chan struct{}, 1)
	for len(conns) < n {
		c, err := ln.Accept()
		if err != nil {
			b.Fatal(err)
		}
		conns = append(conns, c)
		wg.Go(func() {
			// The console's read buffer size (buffers.go).
			r := bufio.NewReaderSize(c, 256)
			for {
				if _, err := r.ReadSlice('}'); err != nil {
					return
				}
				if acked.Add(1) == int64(n) {
					done <- struct{}{}
				}
			}
		})
	}
	frame := make([]byte, size)
	publish := func() time.Duration {
		acked.Store(0)
		c0 := testenv.ProcessCPU(os.Getpid())
		for _, c := range conns {
			if _, err := c.Write(frame); err != nil {
				b.Fatal(err)
			}
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			b.Fatalf("%d of %d peers acked in a minute", acked.Load(), n)
		}
		return testenv.ProcessCPU(os.Getpid()) - c0
	}
	publish()
	cpu := make([]time.Duration, rounds)
	for i := range cpu {
		cpu[i] = publish()
	}
	return time.Duration(quantile(cpu, 0.5) * float64(time.Millisecond))
}

// runFloorPeers dials $SLUICE_HUB_FLOOR_N connections to $SLUICE_HUB_FLOOR_PEERS
// and answers each frame of $SLUICE_HUB_FLOOR_BYTES bytes with an ack, until
// stdin closes.
func runFloorPeers(addr string) int {
	raiseFileLimit()
	n, _ := strconv.Atoi(os.Getenv("SLUICE_HUB_FLOOR_N"))
	size, _ := strconv.Atoi(os.Getenv("SLUICE_HUB_FLOOR_BYTES"))
	ack, _ := json.Marshal(wire.Ack{Type: wire.TypeAck, Version: 1})
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "floor peer:", err)
			return 1
		}
		go func() {
			buf := make([]byte, size)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write(ack); err != nil {
					return
				}
			}
		}()
	}
	io.Copy(io.Discard, os.Stdin)
	return 0
}
