// Package checkserver exposes the enforcer's engine to clients: the HTTP
// check endpoints (POST /json, Lyft-compatible, and POST /v1/check), the
// Envoy RLS v3 gRPC service, and the node's /healthz, /readyz and /metrics.
//
// POST /v1/check answers 200 when the request is allowed, with the
// RateLimitResponse in protojson, and 429 when it is over limit, with an
// RFC 9457 problem document (application/problem+json) that also carries
// the RateLimitResponse's members (overallCode, statuses), so a client
// reading either finds what it looks for; both with rate-limit headers.
// Errors are {"error":{"code","message"}}: 400 for a malformed request, 413
// for a body over MaxBodyBytes, 503 while no ruleset is loaded (the node
// cannot decide yet, and a 503 lets the caller apply its own failure policy
// instead of being told a wrong "OK").
//
// POST /json answers exactly as envoyproxy/ratelimit's /json does, so its
// clients work unchanged: the RateLimitResponse in protojson with 200 or
// 429 (500 for an UNKNOWN code), and a plain-text "Bad Request" 400 for any
// request it cannot answer, not-ready included. Rate-limit headers are added
// (a Lyft client ignores them); a body over MaxBodyBytes still gets 413.
//
// What one check may cost is bounded twice: the body (or gRPC message, the
// enforcer's grpc.MaxRecvMsgSize) by MaxBodyBytes (1 MiB), and its content
// by the engine's bounds, which every transport goes through (engine.Check:
// at most engine.MaxDescriptors 64 descriptors, engine.MaxEntries 32
// entries each, 1 KiB per key, 64 KiB per value, 1 MiB of keys and values
// in all). A request over the engine's bounds is an invalid request: 400
// (plain "Bad Request" on /json), gRPC InvalidArgument. An HTTP body over
// 64 KiB is scanned as it arrives, and refused at its 65th descriptor (or
// a descriptor's 33rd entry) without the rest being read or decoded; a
// body declared over MaxBodyBytes is refused before any of it is read.
//
// gRPC maps errors to InvalidArgument and Unavailable (Envoy then applies
// its failure_mode_deny setting) and returns the rate-limit headers as
// response_headers_to_add, which Envoy adds to the client's response.
package checkserver

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/enforcer/engine"
	"github.com/sluicehq/sluice/enforcer/headers"
	"github.com/sluicehq/sluice/enforcer/metrics"
)

// MaxBodyBytes bounds the body of an HTTP check (and a gRPC check message).
const MaxBodyBytes = 1 << 20

// DefaultReadyTimeout bounds the store ping /readyz makes.
const DefaultReadyTimeout = time.Second

// Options configures a Server.
type Options struct {
	// Registry is what /metrics serves. A new registry is created when nil
	// (the global one is never used).
	Registry *prometheus.Registry
	// Metrics records checks; when nil, New registers a fresh set on
	// Registry.
	Metrics *metrics.Metrics
	// Ping checks the counter store for /readyz; nil means always usable.
	Ping func(ctx context.Context) error
	// ReadyTimeout bounds Ping; DefaultReadyTimeout when zero.
	ReadyTimeout time.Duration
	// Log receives errors that are not the client's fault. Default: discard.
	Log *slog.Logger
}

// Server serves checks from one engine over HTTP and gRPC.
type Server struct {
	eng          *engine.Engine
	reg          *prometheus.Registry
	metrics      *metrics.Metrics
	ping         func(ctx context.Context) error
	readyTimeout time.Duration
	log          *slog.Logger
	draining     atomic.Bool
}

// New returns a Server answering from eng. It fails only when the metrics
// cannot be registered (e.g. registered twice in opts.Registry).
func New(eng *engine.Engine, opts Options) (*Server, error) {
	s := &Server{
		eng:          eng,
		reg:          opts.Registry,
		ping:         opts.Ping,
		readyTimeout: opts.ReadyTimeout,
		log:          opts.Log,
	}
	if s.reg == nil {
		s.reg = prometheus.NewRegistry()
	}
	if s.readyTimeout <= 0 {
		s.readyTimeout = DefaultReadyTimeout
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.metrics = opts.Metrics
	if s.metrics == nil {
		m, err := metrics.New(s.reg, metrics.Options{Engine: eng})
		if err != nil {
			return nil, err
		}
		s.metrics = m
	}
	return s, nil
}

// Drain makes /readyz answer 503 from now on, so load balancers stop sending
// checks while the node shuts down. Checks are still answered.
func (s *Server) Drain() { s.draining.Store(true) }

// Handler returns the HTTP routes: POST /json, POST /v1/check, GET /healthz,
// GET /readyz and GET /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /json", s.handleJSON)
	mux.HandleFunc("POST /v1/check", s.handleCheck)
	mux.HandleFunc("GET /healthz", s.handleHealthz)
	mux.HandleFunc("GET /readyz", s.handleReadyz)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{
		ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelError),
	}))
	return mux
}

// RegisterGRPC registers the envoy.service.ratelimit.v3.RateLimitService on g.
func (s *Server) RegisterGRPC(g *grpc.Server) {
	rlsv3.RegisterRateLimitServiceServer(g, rlsService{s: s})
}

func (s *Server) check(ctx context.Context, transport string, msg *rlsv3.RateLimitRequest) (engine.Result, error) {
	start := time.Now()
	req, err := toRequest(msg)
	var res engine.Result
	if err == nil {
		res, err = s.eng.Check(ctx, req)
	}
	s.metrics.Observe(transport, &req, &res, err, time.Since(start), s.eng.HasDomain(req.Domain))
	if err != nil && !errors.Is(err, engine.ErrInvalidRequest) && !errors.Is(err, engine.ErrNoRuleset) {
		s.log.ErrorContext(ctx, "check failed", "transport", transport, "domain", req.Domain, "error", err)
	}
	return res, err
}

var (
	jsonIn  = protojson.UnmarshalOptions{}
	jsonOut = protojson.MarshalOptions{}
)

// marshalResponse encodes r as protojson does, without its reflection when
// it can.
func marshalResponse(r *rlsv3.RateLimitResponse) ([]byte, error) {
	if out, ok := appendResponseJSON(make([]byte, 0, 256), r); ok {
		return out, nil
	}
	return jsonOut.Marshal(r)
}

// readRequest reads and decodes an HTTP check body. On failure it returns
// the status and the error's code and message.
func readRequest(w http.ResponseWriter, r *http.Request) (*rlsv3.RateLimitRequest, int, string, string) {
	msg := new(rlsv3.RateLimitRequest)
	err := readBody(w, r, msg)
	var tooBig *http.MaxBytesError
	if errors.Is(err, engine.ErrInvalidRequest) || errors.As(err, &tooBig) {
		// The rest of the body is not wanted: without this, net/http
		// would read up to 256 KiB more of it before answering.
		w.Header().Set("Connection", "close")
	}
	switch {
	case err == nil:
		return msg, 0, "", ""
	case errors.As(err, &tooBig):
		return nil, http.StatusRequestEntityTooLarge, "too_large", "request body exceeds 1 MiB"
	}
	return nil, http.StatusBadRequest, "invalid_request", err.Error()
}

// handleCheck serves POST /v1/check.
func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	msg, status, code, message := readRequest(w, r)
	if msg == nil {
		writeError(w, status, code, message)
		return
	}
	res, err := s.check(r.Context(), "http", msg)
	switch {
	case err == nil:
	case errors.Is(err, engine.ErrInvalidRequest):
		writeError(w, http.StatusBadRequest, "invalid_request", err.Error())
		return
	case errors.Is(err, engine.ErrNoRuleset):
		writeError(w, http.StatusServiceUnavailable, "not_ready", "no ruleset loaded yet")
		return
	default:
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	out, err := marshalResponse(toResponse(res))
	if err != nil {
		s.log.ErrorContext(r.Context(), "encode check response", "error", err)
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	h := w.Header()
	headers.Set(h, res)
	h.Set("Cache-Control", "no-store")
	if res.Code != engine.OverLimit {
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write(out)
		return
	}
	// A problem document whose extension members are the response's.
	p, err := json.Marshal(headers.RateLimited(res, http.StatusTooManyRequests, r.URL.Path))
	if err != nil || len(p) < 2 || len(out) < 2 {
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	body := make([]byte, 0, len(p)+len(out))
	body = append(body, p[:len(p)-1]...) // without its closing brace
	if rest := bytes.TrimSpace(out[1:]); len(rest) > 1 {
		body = append(body, ',')
		body = append(body, rest...)
	} else {
		body = append(body, '}')
	}
	h.Set("Content-Type", headers.ProblemContentType)
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(body)
}

// handleJSON serves POST /json the way envoyproxy/ratelimit does.
func (s *Server) handleJSON(w http.ResponseWriter, r *http.Request) {
	msg, status, code, message := readRequest(w, r)
	if msg == nil {
		if status == http.StatusRequestEntityTooLarge {
			writeError(w, status, code, message)
			return
		}
		lyftError(w, http.StatusBadRequest)
		return
	}
	res, err := s.check(r.Context(), "http", msg)
	if err != nil {
		lyftError(w, http.StatusBadRequest)
		return
	}
	resp := toResponse(res)
	out, err := marshalResponse(resp)
	if err != nil {
		s.log.ErrorContext(r.Context(), "encode check response", "error", err)
		lyftError(w, http.StatusInternalServerError)
		return
	}
	h := w.Header()
	headers.Set(h, res)
	h.Set("Content-Type", "application/json")
	switch resp.OverallCode {
	case rlsv3.RateLimitResponse_UNKNOWN:
		w.WriteHeader(http.StatusInternalServerError)
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// lyftError answers like envoyproxy/ratelimit's /json on errors: the status
// text as a plain-text body.
func lyftError(w http.ResponseWriter, code int) {
	http.Error(w, http.StatusText(code), code)
}

func (s *Server) handleHealthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
}

func (s *Server) handleReadyz(w http.ResponseWriter, r *http.Request) {
	notReady := func(reason string) {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "not_ready", "reason": reason})
	}
	if s.draining.Load() {
		notReady("shutting down")
		return
	}
	if !s.eng.Loaded() {
		notReady("no ruleset loaded yet")
		return
	}
	if s.ping != nil {
		ctx, cancel := context.WithTimeout(r.Context(), s.readyTimeout)
		err := s.ping(ctx)
		cancel()
		if err != nil {
			// The reason stays generic: /readyz may be reachable by more
			// than operators. The log has the detail.
			s.log.WarnContext(r.Context(), "readiness: store unreachable", "error", err)
			notReady("counter store unreachable")
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ready", "version": s.eng.Version()})
}

// writeError writes the error body every Sluice HTTP API uses:
// {"error":{"code":"...","message":"..."}}.
func writeError(w http.ResponseWriter, status int, code, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"code": code, "message": message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// rlsService is the gRPC face of a Server.
type rlsService struct {
	rlsv3.UnimplementedRateLimitServiceServer
	s *Server
}

// ShouldRateLimit implements envoy.service.ratelimit.v3.RateLimitService.
func (g rlsService) ShouldRateLimit(ctx context.Context, msg *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	res, err := g.s.check(ctx, "grpc", msg)
	switch {
	case err == nil:
		resp := toResponse(res)
		resp.ResponseHeadersToAdd = toHeaders(res)
		return resp, nil
	case errors.Is(err, engine.ErrInvalidRequest):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, engine.ErrNoRuleset):
		return nil, status.Error(codes.Unavailable, "no ruleset loaded yet")
	default:
		return nil, status.Error(codes.Internal, "internal error")
	}
}
