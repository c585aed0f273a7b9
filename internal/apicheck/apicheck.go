// Package apicheck holds the console's HTTP answers to its OpenAPI document
// (backend/api/openapi.yaml, the one definition of the API) in tests. Handler
// wraps a handler so that every answer it gives is validated against the
// operation the request matches; Check does the same for an answer a client
// received. An answer the document does not describe — a success status it
// does not list, a content type it does not declare, a body its schema
// refuses — is an error. Any operation may also answer an error status it
// does not list (a 400 for a malformed query, 413, 500, ...), as long as the
// body is the error envelope, components/schemas/Error.
//
// The document is read as apispec reads it for the generated clients: every
// property of an object without a required list is required, and no
// property it does not name is allowed. So a field a handler renames, drops
// or adds fails the test of every call that returns it.
package apicheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sluicehq/sluice/backend/api"
	"github.com/sluicehq/sluice/internal/apispec"
)

// Spec is an OpenAPI document ready to check answers against.
type Spec struct {
	router routers.Router
	// errorBody is the strict Error schema, for error statuses an
	// operation does not list.
	errorBody *openapi3.Schema
}

// Load makes a Spec of an OpenAPI 3.0 document (YAML or JSON), read as
// apispec.Load reads it.
func Load(src []byte) (*Spec, error) {
	doc, err := apispec.Load(src)
	if err != nil {
		return nil, err
	}
	errRef := doc.Components.Schemas["Error"]
	if errRef == nil || errRef.Value == nil {
		return nil, errors.New("openapi: no components/schemas/Error")
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi router: %w", err)
	}
	return &Spec{router: router, errorBody: errRef.Value}, nil
}

func init() {
	// The rule format's JSON Schema is JSON.
	openapi3filter.RegisterBodyDecoder("application/schema+json", openapi3filter.JSONBodyDecoder)
}

var console = sync.OnceValues(func() (*Spec, error) { return Load(api.OpenAPI()) })

// Console is the console's own document, loaded once.
func Console() (*Spec, error) { return console() }

// Check validates one answer to req: status, headers and body. A request
// that matches no operation of the document is not checked (the router's
// own tests keep routes and document in step).
func (s *Spec) Check(req *http.Request, status int, header http.Header, body []byte) error {
	// The router matches on the path alone.
	r := req.Clone(req.Context())
	r.URL.Scheme, r.URL.Host, r.Host = "", "", ""
	route, params, err := s.router.FindRoute(r)
	if err != nil {
		return nil
	}
	if status >= 400 && route.Operation.Responses.Status(status) == nil && route.Operation.Responses.Default() == nil {
		if err := s.checkError(header, body); err != nil {
			return fmt.Errorf("%s %s answered %d (not listed by %s) without the error envelope: %w",
				req.Method, req.URL.Path, status, route.Path, err)
		}
		return nil
	}
	opts := &openapi3filter.Options{
		IncludeResponseStatus: true,
		MultiError:            true,
		AuthenticationFunc:    openapi3filter.NoopAuthenticationFunc,
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: r, PathParams: params, Route: route, Options: opts,
		},
		Status:  status,
		Header:  header,
		Body:    io.NopCloser(bytes.NewReader(body)),
		Options: opts,
	}
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		return fmt.Errorf("%s %s answered %d, which %s does not describe: %w",
			req.Method, req.URL.Path, status, route.Path, flatten(err))
	}
	return nil
}

// checkError checks an error answer against the Error schema.
func (s *Spec) checkError(header http.Header, body []byte) error {
	if mt, _, _ := strings.Cut(header.Get("Content-Type"), ";"); strings.TrimSpace(mt) != "application/json" {
		return fmt.Errorf("content type %q", header.Get("Content-Type"))
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		return err
	}
	return flatten(s.errorBody.VisitJSON(v, openapi3.MultiErrors()))
}

// flatten makes kin-openapi's nested errors one short line each: where
// in the body, and what is wrong there (without the schema and value dumps).
func flatten(err error) error {
	var me openapi3.MultiError
	var se *openapi3.SchemaError
	var re *openapi3filter.ResponseError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &me):
		var lines []string
		for _, e := range me {
			lines = append(lines, flatten(e).Error())
		}
		return errors.New(strings.Join(lines, "; "))
	case errors.As(err, &se):
		return fmt.Errorf("at %q: %s", "/"+strings.Join(se.JSONPointer(), "/"), se.Reason)
	case errors.As(err, &re) && re.Err != nil:
		return fmt.Errorf("%s: %w", re.Reason, flatten(re.Err))
	}
	return err
}

// Handler serves h and fails t for every answer that the console's
// OpenAPI document does not describe. Websocket handshakes pass through
// unchecked: their answer is a protocol switch, not a document.
func Handler(t testing.TB, h http.Handler) http.Handler {
	t.Helper()
	spec, err := Console()
	if err != nil {
		t.Fatal(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
			h.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		if err := spec.Check(r, rec.Code, rec.Header(), rec.Body.Bytes()); err != nil {
			t.Error(err)
		}
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// CheckResponse validates an answer a client received against the
// console's document, failing t if it does not fit. body is what was read
// from resp.Body.
func CheckResponse(t testing.TB, resp *http.Response, body []byte) {
	t.Helper()
	spec, err := Console()
	if err != nil {
		t.Fatal(err)
	}
	if err := spec.Check(resp.Request, resp.StatusCode, resp.Header, body); err != nil {
		t.Error(err)
	}
}
