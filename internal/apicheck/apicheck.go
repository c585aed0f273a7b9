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
// The check reads the document more strictly than OpenAPI does, in the two
// ways the generated clients rely on:
//
//   - an object schema without a required list has every property required
//     (the UI's types are generated with --properties-required-by-default,
//     and the CLI's without optional pointers), so an object whose fields may
//     be left out must list the ones that may not;
//   - an object schema that does not set additionalProperties allows no
//     property it does not name.
//
// So a field a handler renames, drops or adds fails the test of every call
// that returns it. allOf of object schemas is merged into one object first,
// so the closed objects still compose.
package apicheck

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/sluicehq/sluice/backend/api"
)

// Spec is an OpenAPI document ready to check answers against.
type Spec struct {
	router routers.Router
	// errorBody is the strict Error schema, for error statuses an
	// operation does not list.
	errorBody *openapi3.Schema
}

// Load parses and validates an OpenAPI 3.0 document (YAML or JSON) and
// makes its response schemas strict as the package comment says.
func Load(src []byte) (*Spec, error) {
	doc, err := openapi3.NewLoader().LoadFromData(src)
	if err != nil {
		return nil, fmt.Errorf("load openapi: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	strict := strictifier{}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			for _, resp := range op.Responses.Map() {
				if resp.Value == nil {
					continue
				}
				for _, media := range resp.Value.Content {
					if media.Schema != nil {
						media.Schema = strict.ref(media.Schema)
					}
				}
			}
		}
	}
	errRef := doc.Components.Schemas["Error"]
	if errRef == nil || errRef.Value == nil {
		return nil, errors.New("openapi: no components/schemas/Error")
	}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi router: %w", err)
	}
	return &Spec{router: router, errorBody: strict.schema(errRef.Value)}, nil
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

// strictifier makes strict copies of schemas, each schema once (the
// document's schemas refer to each other, and to themselves).
type strictifier map[*openapi3.Schema]*openapi3.Schema

func (m strictifier) ref(r *openapi3.SchemaRef) *openapi3.SchemaRef {
	if r == nil || r.Value == nil {
		return r
	}
	return &openapi3.SchemaRef{Ref: r.Ref, Value: m.schema(r.Value)}
}

func (m strictifier) refs(rs openapi3.SchemaRefs) openapi3.SchemaRefs {
	if rs == nil {
		return nil
	}
	out := make(openapi3.SchemaRefs, len(rs))
	for i, r := range rs {
		out[i] = m.ref(r)
	}
	return out
}

func (m strictifier) schema(s *openapi3.Schema) *openapi3.Schema {
	if c, ok := m[s]; ok {
		return c
	}
	c := *s
	m[s] = &c
	if props, required, ok := merged(s); ok {
		c.AllOf = nil
		c.Type = &openapi3.Types{openapi3.TypeObject}
		c.Properties, c.Required = props, required
	}
	if c.Properties != nil {
		props := make(openapi3.Schemas, len(c.Properties))
		for name, p := range c.Properties {
			props[name] = m.ref(p)
		}
		c.Properties = props
		if c.Required == nil {
			c.Required = names(c.Properties)
		}
		if c.AdditionalProperties.Has == nil && c.AdditionalProperties.Schema == nil {
			c.AdditionalProperties = openapi3.AdditionalProperties{Has: openapi3.Ptr(false)}
		}
	}
	c.Items = m.ref(c.Items)
	c.AdditionalProperties.Schema = m.ref(c.AdditionalProperties.Schema)
	c.AllOf, c.AnyOf, c.OneOf = m.refs(c.AllOf), m.refs(c.AnyOf), m.refs(c.OneOf)
	return &c
}

// merged flattens an allOf whose members are all object schemas into one
// set of properties and the union of their required lists (a member
// without a list requires all its own properties).
func merged(s *openapi3.Schema) (openapi3.Schemas, []string, bool) {
	if len(s.AllOf) == 0 {
		return nil, nil, false
	}
	props := openapi3.Schemas{}
	for name, p := range s.Properties {
		props[name] = p
	}
	required := slices.Clone(s.Required)
	for _, member := range s.AllOf {
		if member.Value == nil {
			return nil, nil, false
		}
		mp, mr, ok := merged(member.Value)
		if !ok {
			if len(member.Value.Properties) == 0 {
				return nil, nil, false
			}
			mp, mr = member.Value.Properties, member.Value.Required
			if mr == nil {
				mr = names(mp)
			}
		}
		for name, p := range mp {
			props[name] = p
		}
		required = append(required, mr...)
	}
	slices.Sort(required)
	return props, slices.Compact(required), true
}

func names(props openapi3.Schemas) []string {
	out := make([]string, 0, len(props))
	for name := range props {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}
