package hub

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Buffer sizes of a node connection, held for its life. Node messages
// are small (an ack, a stats report); a longer one is read past the buffer
// in one more read. The library writes only control frames (pong, close:
// at most 127 bytes, so each goes out in one write from its buffer); the
// hub writes its data frames itself (frameWriter).
const (
	readBufferSize  = 256
	writeBufferSize = 128
)

// smallBuffers hands the websocket library smaller buffers than the HTTP
// server's (4 KiB each way, held for the connection's life once hijacked).
type smallBuffers struct {
	http.ResponseWriter
	out *frameWriter // under the library's write buffer, set by Hijack
	in  *lastRead    // under the library's read buffer, set by Hijack
}

// WriteHeaderNow makes the library send the handshake response through
// gin's writer, which delays it otherwise (the library looks for this
// method).
func (w *smallBuffers) WriteHeaderNow() {
	if g, ok := w.ResponseWriter.(interface{ WriteHeaderNow() }); ok {
		g.WriteHeaderNow()
	}
}

// Hijack takes over the connection with small buffers; the handshake
// response still waiting in the server's buffer is sent, and request bytes
// already read stay readable.
func (w *smallBuffers) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := w.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("connection cannot be hijacked")
	}
	nc, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if err := brw.Writer.Flush(); err != nil {
		nc.Close()
		return nil, nil, err
	}
	// The library resets the reader onto the connection, keeping only
	// what is buffered: the bytes read ahead must be in the new buffer.
	n := brw.Reader.Buffered()
	w.in = &lastRead{Conn: nc}
	w.in.at.Store(time.Now().UnixNano())
	br := bufio.NewReaderSize(w.in, readBufferSize)
	if n > 0 { // the node's hello often comes with the handshake
		ahead, _ := brw.Reader.Peek(n)
		br = bufio.NewReaderSize(&aheadReader{ahead: bytes.Clone(ahead), Conn: w.in}, max(readBufferSize, n))
		if _, err := br.Peek(n); err != nil {
			nc.Close()
			return nil, nil, err
		}
	}
	w.out = &frameWriter{Conn: nc}
	// The library reads from the connection it is given (past the bytes
	// buffered), so that is lastRead.
	return w.in, bufio.NewReadWriter(br, bufio.NewWriterSize(w.out, writeBufferSize)), nil
}

// frameWriter is what the websocket library's write buffer flushes to,
// and what the hub writes its own frames with: every data frame to a node
// (a snapshot, a quota ack) and its keepalive pings go out as one frame
// built beforehand, in one write (a snapshot's frame is built once per
// version and shared by every node: see encoded). A write to a net.Conn is
// never interleaved with another, and the library's control frames each
// fit its buffer, so frames never mix. Nothing of the hub's is written
// once the close handshake began (closing).
type frameWriter struct {
	net.Conn
	mu     sync.Mutex
	closed bool // closing was called
	// since is when the writeFrame in progress began (unix ns), 0 when
	// none: keepaliveLoop aborts a write that takes too long, so a write
	// holds no timer of its own.
	since atomic.Int64
}

// writeFrame writes one whole frame, unless the connection is closing.
func (w *frameWriter) writeFrame(frame []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return net.ErrClosed
	}
	w.since.Store(time.Now().UnixNano())
	_, err := w.Conn.Write(frame)
	w.since.Store(0)
	return err
}

// closing makes every later writeFrame fail, after the one in progress
// (if any) ended: call it before the close frame is written.
func (w *frameWriter) closing() {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
}

// Websocket opcodes (RFC 6455, 5.2) of the frames the hub builds.
const (
	opText = 0x1
	opPing = 0x9
)

// pingFrame is a keepalive ping, with no payload.
var pingFrame = []byte{0x80 | opPing, 0}

// textFrame returns payload as one unmasked, final text frame (a server's
// frame: RFC 6455, 5.2), built into a new slice; the payload starts at
// the frame's len(frame)-len(payload).
func textFrame(payload []byte) []byte {
	n := len(payload)
	frame := make([]byte, 0, 10+n)
	frame = append(frame, 0x80|opText)
	switch {
	case n <= 125:
		frame = append(frame, byte(n))
	case n <= 0xFFFF:
		frame = binary.BigEndian.AppendUint16(append(frame, 126), uint16(n))
	default:
		frame = binary.BigEndian.AppendUint64(append(frame, 127), uint64(n))
	}
	return append(frame, payload...)
}

// aheadReader reads the bytes the HTTP server read ahead of the handshake,
// then the connection; it lets go of those bytes once they are read.
type aheadReader struct {
	ahead []byte
	net.Conn
}

func (r *aheadReader) Read(p []byte) (int, error) {
	if len(r.ahead) == 0 {
		return r.Conn.Read(p)
	}
	n := copy(p, r.ahead)
	if r.ahead = r.ahead[n:]; len(r.ahead) == 0 {
		r.ahead = nil
	}
	return n, nil
}

// lastRead is what the websocket library's read buffer reads from: it
// notes when bytes last came from the node. Any frame (a message, the
// pong to the console's keepalive ping, or a ping of the node's own)
// shows the node is there, with no per-message timestamp or timer.
type lastRead struct {
	net.Conn
	at atomic.Int64 // unix nanoseconds
}

func (r *lastRead) Read(p []byte) (int, error) {
	n, err := r.Conn.Read(p)
	if n > 0 {
		r.at.Store(time.Now().UnixNano())
	}
	return n, err
}

// heard returns when bytes last came from the node.
func (r *lastRead) heard() time.Time { return time.Unix(0, r.at.Load()) }
