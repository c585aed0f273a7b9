package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"sync"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// The gRPC transport speaks gRPC over cleartext HTTP/2 (prior knowledge,
// as grpc-go's insecure credentials do) with x/net's Framer, the way h2load
// does: one goroutine per connection owns it, keeps its share of the
// callers' checks in flight as streams, writes the next request as soon as
// one finishes, and flushes its buffered writes only when it is about to
// block on a read. Requests are encoded once at start: one header block
// (every field "without indexing", so the block does not depend on an
// encoder's dynamic table and can be sent again and again) and one
// length-prefixed RateLimitRequest per key. Of a response it decodes the
// header blocks (with one hpack.Decoder per connection, to keep the
// server's dynamic table in sync), overall_code and grpc-status.
//
// grpc-go's client, used before, spent about as much CPU per check as the
// server it loaded (stream setup, goroutine hand-offs, proto decoding, GC):
// 50-58 µs against a Sluice enforcer on 2 CPUs, where this transport
// spends 7-10 µs at 64 and 256 callers (13-17 µs at 16, where fewer
// responses share a read). It allocates little, so GC is left at its
// default.

// grpcStreamWindow is the flow-control window this client grants each
// stream. A response is small, so a stream never comes near it.
const grpcStreamWindow = 1 << 20

// grpcConnWindow is the window this client grants a connection (at least
// RFC 9113's 65,535), topped up when half of it is used. A variable so
// that a test can make it small.
var grpcConnWindow int64 = 1 << 24

// grpcMaxStreamID is the largest client stream ID; a connection that
// reaches it is replaced.
const grpcMaxStreamID = 1<<31 - 1

// errGoAway ends a connection the server sent GOAWAY on, once its last
// stream is done.
var errGoAway = errors.New("server sent GOAWAY")

// grpcLoad is what every connection of a gRPC run shares.
type grpcLoad struct {
	w      *window
	target string
	header []byte   // the request header block
	bodies [][]byte // per key: the length-prefixed request message
	maxLen int      // the longest of bodies
}

// runGRPC loads ShouldRateLimit over cfg.Connections connections, the
// callers spread evenly over them.
func runGRPC(cfg Config, w *window) error {
	l := &grpcLoad{w: w, target: cfg.Target}
	for _, v := range descriptorValues(cfg.Keys) {
		msg, err := proto.Marshal(&rlsv3.RateLimitRequest{
			Domain:      cfg.Domain,
			Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: cfg.Key, Value: v}}}},
			HitsAddend:  uint32(cfg.Hits),
		})
		if err != nil {
			return fmt.Errorf("bench: encode request: %w", err)
		}
		// One DATA frame of the smallest frame size every peer accepts.
		if 5+len(msg) > 16384 {
			return fmt.Errorf("bench: request of %d bytes: want at most 16 KiB (shorter --domain or --key)", len(msg))
		}
		body := make([]byte, 5, 5+len(msg)) // uncompressed, then the length
		binary.BigEndian.PutUint32(body[1:], uint32(len(msg)))
		l.bodies = append(l.bodies, append(body, msg...))
		l.maxLen = max(l.maxLen, len(body)+len(msg))
	}
	// The encoder's dynamic table is sized 0, so it indexes nothing and
	// the block opens with a table size update to 0: the block means the
	// same to the server's decoder every time it is sent.
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	enc.SetMaxDynamicTableSizeLimit(0)
	for _, f := range [][2]string{
		{":method", "POST"},
		{":scheme", "http"},
		{":path", "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"},
		{":authority", cfg.Target},
		{"content-type", "application/grpc"},
		{"te", "trailers"},
		{"user-agent", "sluice-bench"},
	} {
		enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	l.header = hb.Bytes()

	conns := min(cfg.Connections, cfg.Concurrency)
	seed := uint64(time.Now().UnixNano())
	var wg sync.WaitGroup
	for i := range conns {
		callers := cfg.Concurrency / conns
		if i < cfg.Concurrency%conns {
			callers++
		}
		wg.Go(func() { l.run(callers, rand.New(rand.NewPCG(uint64(i), seed))) })
	}
	wg.Wait()
	return nil
}

// run keeps callers checks in flight on one connection at a time, dialling
// a new one after a pause when one fails, until the window ends.
func (l *grpcLoad) run(callers int, rng *rand.Rand) {
	lat := make([]time.Duration, 0, 4096)
	defer func() { l.w.merge(lat) }()
	for !l.w.done(time.Now()) {
		c := &grpcConn{load: l, rng: rng, lat: &lat, idle: callers}
		err := c.serve()
		now := time.Now()
		if err == nil || l.w.done(now) {
			continue
		}
		// Every check in flight failed with the connection.
		for _, s := range c.streams {
			l.w.add(&lat, s.t0, now, false, err)
		}
		if len(c.streams) == 0 && !c.started {
			// The dial or the handshake failed: each caller's check did.
			for range callers {
				l.w.add(&lat, now, now, false, err)
			}
		}
		sleepUntil(l.w.ctx, now.Add(redialPause))
	}
}

// grpcConn is one HTTP/2 connection of a gRPC run and the callers whose
// checks it carries. Only its goroutine touches it.
type grpcConn struct {
	load *grpcLoad
	rng  *rand.Rand
	lat  *[]time.Duration

	idle   int         // callers without a check in flight
	paused []time.Time // callers pausing after a failed check, until these times (ascending)

	nc      net.Conn
	br      *bufio.Reader
	bw      *bufio.Writer
	fr      *http2.Framer
	dec     *hpack.Decoder
	started bool // the handshake succeeded

	streams      map[uint32]*grpcStream // in flight, by ID
	free         []*grpcStream
	nextID       uint32
	maxStreams   uint32      // the server's SETTINGS_MAX_CONCURRENT_STREAMS
	sendWindow   int64       // what the server lets this client send on the connection
	streamWindow int64       // the server's initial window of a stream
	unacked      int64       // DATA received since the last connection WINDOW_UPDATE
	goingAway    bool        // the server sent GOAWAY: no new stream
	cur          *grpcStream // the stream whose header block is being decoded
	scratch      grpcStream  // where the header block of an untracked stream is decoded
}

// grpcStream is one check in flight.
type grpcStream struct {
	id                              uint32
	t0                              time.Time // when its request was handed to the writer
	headers                         bool      // the response headers arrived
	status, grpcStatus, grpcMessage string
	msg                             []byte // the response's DATA
}

// serve dials and runs the connection until the window ends (nil) or the
// connection fails or is done. The checks still in flight are then in
// c.streams.
func (c *grpcConn) serve() error {
	w := c.load.w
	d := net.Dialer{Timeout: dialTimeout}
	nc, err := d.DialContext(w.ctx, "tcp", c.load.target)
	if err != nil {
		return err
	}
	defer nc.Close()
	// A read blocked when the run is interrupted must end at once.
	stop := context.AfterFunc(w.ctx, func() { nc.Close() })
	defer stop()
	c.nc = nc
	c.br = bufio.NewReaderSize(nc, 32<<10)
	c.bw = bufio.NewWriterSize(nc, 32<<10)
	c.fr = http2.NewFramer(c.bw, c.br)
	c.fr.SetReuseFrames()
	c.dec = hpack.NewDecoder(4096, c.onField)
	c.streams = make(map[uint32]*grpcStream)
	c.nextID = 1
	c.maxStreams = math.MaxUint32
	c.sendWindow, c.streamWindow = 65535, 65535 // RFC 9113's initial windows
	if err := c.handshake(); err != nil {
		return fmt.Errorf("http2 handshake with %s: %w", c.load.target, err)
	}
	c.started = true
	return c.loop()
}

// handshake sends the client preface, this client's SETTINGS and a
// connection window far above the default, then waits for the server's
// SETTINGS, so that no stream opens before its MAX_CONCURRENT_STREAMS is
// known.
func (c *grpcConn) handshake() error {
	c.bw.WriteString(http2.ClientPreface)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: grpcStreamWindow})
	if grpcConnWindow > 65535 {
		c.fr.WriteWindowUpdate(0, uint32(grpcConnWindow-65535))
	}
	f, err := c.readFrame()
	if err != nil {
		return err
	}
	if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
		return fmt.Errorf("server's first frame is %v, want SETTINGS", f.Header().Type)
	}
	return c.handle(f)
}

// loop starts a check for every idle caller the server's limits allow,
// then reads and handles one frame, until the window ends.
func (c *grpcConn) loop() error {
	w := c.load.w
	for {
		now := time.Now()
		if w.done(now) {
			return nil
		}
		for len(c.paused) > 0 && !now.Before(c.paused[0]) {
			c.paused = c.paused[1:]
			c.idle++
		}
		for c.idle > 0 && c.canStart() {
			if err := c.start(); err != nil {
				return err
			}
			c.idle--
		}
		if len(c.streams) == 0 {
			if c.goingAway {
				// Redialled after a pause, so that a server that sends
				// GOAWAY at once is not spun on.
				return errGoAway
			}
			if c.nextID > grpcMaxStreamID {
				return nil // the caller dials anew
			}
			if len(c.paused) > 0 {
				// Every caller here is pausing: nothing to read until one resumes.
				if err := c.bw.Flush(); err != nil {
					return err
				}
				sleepUntil(w.ctx, c.paused[0])
				continue
			}
		}
		f, err := c.readFrame()
		if err != nil {
			return err
		}
		if err := c.handle(f); err != nil {
			return err
		}
	}
}

// canStart reports whether the server's limits let one more stream open
// and send the longest request. (A server whose initial stream window is
// below one request never gets one; the connection then times out.)
func (c *grpcConn) canStart() bool {
	n := int64(c.load.maxLen)
	return !c.goingAway && c.nextID <= grpcMaxStreamID && uint32(len(c.streams)) < c.maxStreams &&
		c.sendWindow >= n && c.streamWindow >= n
}

// start opens a stream with the request of a key drawn at random.
func (c *grpcConn) start() error {
	var s *grpcStream
	if n := len(c.free); n > 0 {
		s, c.free = c.free[n-1], c.free[:n-1]
	} else {
		s = new(grpcStream)
	}
	s.id = c.nextID
	c.nextID += 2
	body := c.load.bodies[pickKey(c.rng, len(c.load.bodies))]
	c.streams[s.id] = s
	c.sendWindow -= int64(len(body))
	s.t0 = time.Now()
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: s.id, BlockFragment: c.load.header, EndHeaders: true}); err != nil {
		return err
	}
	return c.fr.WriteData(s.id, true, body)
}

// readFrame reads the next frame. When that may block it first flushes the
// buffered writes and sets the deadline: callTimeout without a frame
// fails the connection, and the end of the window ends the run (a check
// then in flight would not be counted anyway).
func (c *grpcConn) readFrame() (http2.Frame, error) {
	if !c.frameBuffered() {
		c.nc.SetDeadline(earlier(time.Now().Add(callTimeout), c.load.w.end))
		if err := c.bw.Flush(); err != nil {
			return nil, err
		}
	}
	return c.fr.ReadFrame()
}

// frameBuffered reports whether a whole frame is already buffered.
func (c *grpcConn) frameBuffered() bool {
	n := c.br.Buffered()
	if n < 9 {
		return false
	}
	h, _ := c.br.Peek(9)
	return n >= 9+int(h[0])<<16|int(h[1])<<8|int(h[2])
}

func (c *grpcConn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.DataFrame:
		// Flow control counts the whole payload, padding included.
		c.unacked += int64(f.Length)
		if c.unacked >= grpcConnWindow/2 {
			if err := c.fr.WriteWindowUpdate(0, uint32(c.unacked)); err != nil {
				return err
			}
			c.unacked = 0
		}
		if s := c.streams[f.StreamID]; s != nil {
			s.msg = append(s.msg, f.Data()...)
			if f.StreamEnded() {
				c.finish(s, false, errors.New("response ended without trailers"))
			}
		}
	case *http2.HeadersFrame:
		return c.onHeaders(f)
	case *http2.RSTStreamFrame:
		if s := c.streams[f.StreamID]; s != nil {
			c.finish(s, false, fmt.Errorf("stream reset by the server: %v", f.ErrCode))
		}
	case *http2.SettingsFrame:
		if f.IsAck() {
			return nil
		}
		f.ForeachSetting(func(s http2.Setting) error {
			switch s.ID {
			case http2.SettingMaxConcurrentStreams:
				c.maxStreams = s.Val
			case http2.SettingInitialWindowSize:
				c.streamWindow = int64(s.Val) // open streams have sent all they send
			}
			return nil
		})
		return c.fr.WriteSettingsAck()
	case *http2.PingFrame:
		if !f.IsAck() {
			return c.fr.WritePing(true, f.Data)
		}
	case *http2.WindowUpdateFrame:
		if f.StreamID == 0 {
			c.sendWindow += int64(f.Increment)
		}
	case *http2.GoAwayFrame:
		// Streams above LastStreamID were not processed; those below finish.
		c.goingAway = true
		err := fmt.Errorf("server sent GOAWAY %v %q", f.ErrCode, f.DebugData())
		for id, s := range c.streams {
			if id > f.LastStreamID {
				c.finish(s, false, err)
			}
		}
	}
	return nil
}

// onHeaders decodes a header block (with its CONTINUATION frames), whether
// its stream is still tracked or not, to keep the decoder's dynamic table
// in sync with the server's encoder. A response must have :status 200; the
// block that ends the stream (trailers, or headers of a trailers-only
// response) decides the check.
func (c *grpcConn) onHeaders(f *http2.HeadersFrame) error {
	id, ended := f.StreamID, f.StreamEnded()
	s := c.streams[id]
	c.cur = s
	if s == nil {
		c.scratch = grpcStream{}
		c.cur = &c.scratch
	}
	if _, err := c.dec.Write(f.HeaderBlockFragment()); err != nil {
		return err
	}
	for done := f.HeadersEnded(); !done; {
		next, err := c.readFrame()
		if err != nil {
			return err
		}
		cf, ok := next.(*http2.ContinuationFrame)
		if !ok || cf.StreamID != id {
			return errors.New("header block interrupted by another frame")
		}
		if _, err := c.dec.Write(cf.HeaderBlockFragment()); err != nil {
			return err
		}
		done = cf.HeadersEnded()
	}
	if err := c.dec.Close(); err != nil {
		return err
	}
	c.cur = nil
	if s == nil {
		return nil
	}
	if !s.headers {
		s.headers = true
		if s.status != "200" {
			c.finish(s, false, fmt.Errorf("HTTP status %q", s.status))
			if !ended {
				return c.fr.WriteRSTStream(id, http2.ErrCodeCancel)
			}
			return nil
		}
	}
	if ended {
		allowed, err := s.result()
		c.finish(s, allowed, err)
	}
	return nil
}

// onField is the decoder's emit function.
func (c *grpcConn) onField(f hpack.HeaderField) {
	switch f.Name {
	case ":status":
		c.cur.status = f.Value
	case "grpc-status":
		c.cur.grpcStatus = f.Value
	case "grpc-message":
		c.cur.grpcMessage = f.Value
	}
}

// finish records the check of s and frees its caller (after a pause when
// the check failed).
func (c *grpcConn) finish(s *grpcStream, allowed bool, err error) {
	now := time.Now()
	c.load.w.add(c.lat, s.t0, now, allowed, err)
	delete(c.streams, s.id)
	if err != nil {
		c.paused = append(c.paused, now.Add(errorPause))
	} else {
		c.idle++
	}
	*s = grpcStream{msg: s.msg[:0]}
	c.free = append(c.free, s)
}

// result is the outcome of a stream that ended with its trailers: a
// grpc-status other than 0 is an error (worded like grpc-go's), else the
// one message must be a RateLimitResponse; allowed reports OK.
func (s *grpcStream) result() (allowed bool, err error) {
	if s.grpcStatus != "0" {
		if s.grpcStatus == "" {
			return false, errors.New("response ended without grpc-status")
		}
		code, err := strconv.ParseUint(s.grpcStatus, 10, 32)
		if err != nil {
			return false, fmt.Errorf("bad grpc-status %q", s.grpcStatus)
		}
		msg, err := url.PathUnescape(s.grpcMessage) // gRPC percent-encodes it
		if err != nil {
			msg = s.grpcMessage
		}
		return false, status.Error(codes.Code(code), msg)
	}
	m := s.msg
	if len(m) < 5 || m[0] != 0 || int(binary.BigEndian.Uint32(m[1:5])) != len(m)-5 {
		return false, fmt.Errorf("malformed gRPC response message (%d bytes)", len(m))
	}
	code, err := overallCode(m[5:])
	return code == rlsv3.RateLimitResponse_OK, err
}

// overallCode reads field 1 of an encoded RateLimitResponse, skipping the
// rest (statuses and headers, which bench does not report).
func overallCode(b []byte) (rlsv3.RateLimitResponse_Code, error) {
	var code uint64
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, fmt.Errorf("decode RateLimitResponse: %w", protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			code, n = protowire.ConsumeVarint(b)
		} else {
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return 0, fmt.Errorf("decode RateLimitResponse: %w", protowire.ParseError(n))
		}
		b = b[n:]
	}
	return rlsv3.RateLimitResponse_Code(code), nil
}
