package hub

import (
	"bufio"
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"testing"

	"github.com/sluicehq/sluice/internal/testenv"
)

// recordingConn is a net.Conn that records what is written to it, one
// entry per Write.
type recordingConn struct {
	net.Conn
	writes [][]byte
}

func (c *recordingConn) Write(p []byte) (int, error) {
	c.writes = append(c.writes, bytes.Clone(p))
	return len(p), nil
}

// TestJoinWriterKeepsOrder writes frames the way the websocket library does
// (header and payload into the write buffer, then a flush), armed or not,
// with small frames between the arming and the long one as a ping or a pong
// could come, and checks that the bytes reach the connection in order and
// that nothing stays held.
func TestJoinWriterKeepsOrder(t *testing.T) {
	t.Parallel()
	rec := &recordingConn{}
	jw := &joinWriter{Conn: rec}
	bw := bufio.NewWriterSize(jw, writeBufferSize)
	r := rand.New(rand.NewPCG(1, 2))
	var want bytes.Buffer
	frame := func(n int) {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		hdr := p[:min(n, 2+r.IntN(9))]
		want.Write(p)
		if _, err := bw.Write(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := bw.Write(p[len(hdr):]); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	for range 2000 {
		switch r.IntN(5) {
		case 0: // a snapshot, as Hub.write sends it
			jw.arm()
			frame(writeBufferSize + 1 + r.IntN(5000))
		case 1: // a control frame between the arming and the snapshot
			jw.arm()
			frame(2 + r.IntN(126))
			frame(writeBufferSize + 1 + r.IntN(5000))
		case 2: // a frame that fills the buffer exactly, while armed
			jw.arm()
			frame(writeBufferSize)
		case 3: // a frame of exactly the buffer's size, not armed
			frame(writeBufferSize)
		default: // a long message written unarmed
			frame(writeBufferSize + 1 + r.IntN(300))
		}
		if err := jw.release(); err != nil {
			t.Fatal(err)
		}
		if jw.held != nil || jw.armed {
			t.Fatal("joinWriter holds bytes or stays armed after release")
		}
	}
	if got := bytes.Join(rec.writes, nil); !bytes.Equal(got, want.Bytes()) {
		t.Fatalf("the connection got %d bytes, not the %d written in order", len(got), want.Len())
	}
}

// TestJoinWriterOneWritePerSnapshot counts the write system calls (from
// /proc/self/io) that long frames take over a real TCP connection: one each
// when armed, two when not.
func TestJoinWriterOneWritePerSnapshot(t *testing.T) {
	t.Parallel()
	if _, err := testenv.WriteCalls(); err != nil {
		t.Skip("no /proc/self/io:", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	go io.Copy(io.Discard, client)
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	jw := &joinWriter{Conn: server}
	bw := bufio.NewWriterSize(jw, writeBufferSize)
	payload := bytes.Repeat([]byte("x"), 3000)
	send := func(armed bool, n int) int64 {
		before, _ := testenv.WriteCalls()
		for range n {
			if armed {
				jw.arm()
			}
			bw.Write([]byte{0x81, 126, 0x0b, 0xb8})
			bw.Write(payload)
			if err := bw.Flush(); err != nil {
				t.Fatal(err)
			}
			if err := jw.release(); err != nil {
				t.Fatal(err)
			}
		}
		after, _ := testenv.WriteCalls()
		return after - before
	}
	const n = 200
	armed, unarmed := send(true, n), send(false, n)
	t.Logf("%d frames: %d write calls armed, %d unarmed", n, armed, unarmed)
	if armed > n+n/10 || unarmed < 2*n {
		t.Fatalf("%d frames took %d write calls armed and %d unarmed; want about %d and %d", n, armed, unarmed, n, 2*n)
	}
}
