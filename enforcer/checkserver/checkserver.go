// Package checkserver exposes the enforcer's engine to clients: the HTTP
// check endpoints (POST /json, Lyft-compatible, and POST /v1/check), the
// Envoy RLS v3 gRPC service, and the node's /healthz, /readyz and /metrics.
//
// HTTP answers: 200 when the request is allowed, 429 when it is over limit
// (both with the RateLimitResponse in protojson and rate-limit headers), 400
// with a JSON error for a malformed request, 413 for a body over
// MaxBodyBytes, and 503 while no ruleset is loaded: the node cannot decide
// yet, and a 503 lets the caller apply its own failure policy instead of
// being told a wrong "OK". gRPC maps the same cases to InvalidArgument and
// Unavailable (Envoy then applies its failure_mode_deny setting).
package checkserver

import (
	"context"
	"encoding/json"
	"errors"
	"io"
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
)

// MaxBodyBytes bounds the body of an HTTP check (and a gRPC check message).
const MaxBodyBytes = 1 << 20

// DefaultReadyTimeout bounds the store ping /readyz makes.
const DefaultReadyTimeout = time.Second

// Options configures a Server.
type Options struct {
	// Registry receives the check metrics and is what /metrics serves. A new
	// registry is created when nil (the global one is never used).
	Registry *prometheus.Registry
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
	metrics      *metrics
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
	m, err := newMetrics(s.reg)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	return s, nil
}

// Drain makes /readyz answer 503 from now on, so load balancers stop sending
// checks while the node shuts down. Checks are still answered.
func (s *Server) Drain() { s.draining.Store(true) }

// Handler returns the HTTP routes: POST /json, POST /v1/check, GET /healthz,
// GET /readyz and GET /metrics.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /json", s.handleCheck)
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
	s.metrics.observe(s.eng, transport, req.Domain, res, err, time.Since(start))
	if err != nil && !errors.Is(err, engine.ErrInvalidRequest) && !errors.Is(err, engine.ErrNoRuleset) {
		s.log.ErrorContext(ctx, "check failed", "transport", transport, "domain", req.Domain, "error", err)
	}
	return res, err
}

var (
	jsonIn  = protojson.UnmarshalOptions{}
	jsonOut = protojson.MarshalOptions{}
)

func (s *Server) handleCheck(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, "too_large", "request body exceeds 1 MiB")
			return
		}
		writeError(w, http.StatusBadRequest, "invalid_request", "read request body: "+err.Error())
		return
	}
	var msg rlsv3.RateLimitRequest
	if err := jsonIn.Unmarshal(body, &msg); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request", "malformed RateLimitRequest: "+err.Error())
		return
	}
	res, err := s.check(r.Context(), "http", &msg)
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
	out, err := jsonOut.Marshal(toResponse(res))
	if err != nil {
		s.log.ErrorContext(r.Context(), "encode check response", "error", err)
		writeError(w, http.StatusInternalServerError, "internal", "internal error")
		return
	}
	h := w.Header()
	headers.Set(h, res)
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	code := http.StatusOK
	if res.Code == engine.OverLimit {
		code = http.StatusTooManyRequests
	}
	w.WriteHeader(code)
	w.Write(out)
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
		return toResponse(res), nil
	case errors.Is(err, engine.ErrInvalidRequest):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, engine.ErrNoRuleset):
		return nil, status.Error(codes.Unavailable, "no ruleset loaded yet")
	default:
		return nil, status.Error(codes.Internal, "internal error")
	}
}
