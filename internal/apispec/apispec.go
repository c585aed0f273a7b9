// Package apispec loads the console's OpenAPI document
// (backend/api/openapi.yaml, the one definition of its REST API) as
// everything derived from it reads it: the Go client types
// (internal/consoleapi), the UI's TypeScript types (openapi-typescript with
// --properties-required-by-default) and the tests' check of every answer
// (internal/apicheck). Two rules make the document say exactly what the
// console sends:
//
//   - an object schema without a required list has every property required,
//     so an object whose fields may be left out lists the ones that may not
//     (an empty list: all may be);
//   - an object schema that does not set additionalProperties allows no
//     property it does not name.
//
// allOf of several object schemas is merged into one object first, so the
// closed objects still compose.
package apispec

import (
	"context"
	"fmt"
	"slices"

	"github.com/getkin/kin-openapi/openapi3"
)

// Load parses and validates an OpenAPI 3.0 document (YAML or JSON) and
// applies the package's two rules to every schema in it.
func Load(src []byte) (*openapi3.T, error) {
	doc, err := openapi3.NewLoader().LoadFromData(src)
	if err != nil {
		return nil, fmt.Errorf("load openapi: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("openapi: %w", err)
	}
	s := strictifier{}
	if doc.Components != nil {
		for _, ref := range doc.Components.Schemas {
			if ref.Value != nil {
				ref.Value = s.schema(ref.Value)
			}
		}
		for _, ref := range doc.Components.Responses {
			s.response(ref)
		}
		for _, ref := range doc.Components.RequestBodies {
			if ref.Value != nil {
				s.content(ref.Value.Content)
			}
		}
	}
	for _, item := range doc.Paths.Map() {
		for _, op := range item.Operations() {
			if op.RequestBody != nil && op.RequestBody.Value != nil {
				s.content(op.RequestBody.Value.Content)
			}
			for _, ref := range op.Responses.Map() {
				s.response(ref)
			}
		}
	}
	return doc, nil
}

func (m strictifier) response(ref *openapi3.ResponseRef) {
	if ref != nil && ref.Value != nil {
		m.content(ref.Value.Content)
	}
}

func (m strictifier) content(c openapi3.Content) {
	for _, media := range c {
		if media.Schema != nil {
			media.Schema = m.ref(media.Schema)
		}
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
//
// A lone member without properties beside it (`allOf: [$ref], nullable:
// true`, a nullable reference) is left as it is: it names a type.
func merged(s *openapi3.Schema) (openapi3.Schemas, []string, bool) {
	if len(s.AllOf) == 0 || len(s.AllOf) == 1 && len(s.Properties) == 0 {
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
