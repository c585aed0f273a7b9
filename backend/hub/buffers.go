package hub

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Buffer sizes of a node connection, held for its life. Node messages
// are small (an ack, a stats report); a longer one is read past the buffer
// in one more read. The console writes control frames (ping, pong, close:
// at most 127 bytes) and snapshots; a snapshot is longer than the write
// buffer whatever its size, and goes out in one write to the socket
// (see joinWriter).
const (
	readBufferSize  = 256
	writeBufferSize = 128
)

// smallBuffers hands the websocket library smaller buffers than the HTTP
// server's (4 KiB each way, held for the connection's life once hijacked).
// out is the writer under the library's write buffer, set by Hijack.
type smallBuffers struct {
	http.ResponseWriter
	out *joinWriter
	in  *lastRead // under the library's read buffer, set by Hijack
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
	w.out = &joinWriter{Conn: nc}
	// The library reads from the connection it is given (past the bytes
	// buffered), so that is lastRead.
	return w.in, bufio.NewReadWriter(br, bufio.NewWriterSize(w.out, writeBufferSize)), nil
}

// joinWriter is what the websocket library's write buffer flushes to. A
// message longer than the buffer reaches it as two writes: the buffer,
// filled with the frame header and the message's start, then the rest of
// the message straight from the caller. Each write is a packet for the
// node to take in, so once armed (just before such a message is written)
// joinWriter holds a first write that fills the buffer and sends it with
// the next in one writev. Any other write disarms it and goes out at once,
// so bytes never change order; what is still held when the message's write
// returns is sent by release.
type joinWriter struct {
	net.Conn
	mu    sync.Mutex
	armed bool
	held  *[writeBufferSize]byte // from heldBuffers; non-nil while holding
}

var heldBuffers = sync.Pool{New: func() any { return new([writeBufferSize]byte) }}

// arm makes the next write, if it fills the write buffer, wait for the one
// after it.
func (w *joinWriter) arm() {
	w.mu.Lock()
	w.armed = true
	w.mu.Unlock()
}

func (w *joinWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.armed && w.held == nil && len(p) == writeBufferSize {
		w.armed = false
		w.held = heldBuffers.Get().(*[writeBufferSize]byte)
		copy(w.held[:], p)
		return len(p), nil
	}
	w.armed = false
	if w.held == nil {
		return w.Conn.Write(p)
	}
	held := w.take()
	defer heldBuffers.Put(held)
	bufs := net.Buffers{held[:], p}
	n, err := bufs.WriteTo(w.Conn)
	return max(0, int(n)-writeBufferSize), err
}

// release disarms the writer and sends what it holds.
func (w *joinWriter) release() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	if w.held == nil {
		return nil
	}
	held := w.take()
	defer heldBuffers.Put(held)
	_, err := w.Conn.Write(held[:])
	return err
}

// take returns the held buffer and holds nothing; caller holds mu.
func (w *joinWriter) take() *[writeBufferSize]byte {
	held := w.held
	w.held = nil
	return held
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
// notes when bytes last came from the node. Any frame (a message, or the
// keepalive ping an idle node sends and the library answers by itself)
// shows the node is there, so the console needs no ping of its own while
// a node pings it, and no per-message timestamp or timer.
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
