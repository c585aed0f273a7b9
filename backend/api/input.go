package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"reflect"
	"strings"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

// maxTextBytes bounds a free-text field: a change message, a review
// message, a break-glass reason, and every query parameter.
const maxTextBytes = 4096

// freeText trims s and checks it as the free-text field named field: at
// most maxTextBytes, and present when required. (checkText's NUL and UTF-8
// checks ran on the whole body already.)
func freeText(field, s string, required bool) (string, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "" && required:
		return "", badRequest("%s is required", field)
	case len(s) > maxTextBytes:
		return "", badRequest("%s is over %d bytes", field, maxTextBytes)
	}
	return s, nil
}

// checkText refuses text that holds a NUL byte or is not valid UTF-8,
// naming the field. Postgres stores neither in a text column, so without
// this check such input reached the database and came back as a 500.
func checkText(field, s string) error {
	if !utf8.ValidString(s) {
		return badRequest("%s is not valid UTF-8", field)
	}
	if strings.IndexByte(s, 0) >= 0 {
		return badRequest("%s holds a NUL byte", field)
	}
	return nil
}

// decode reads a JSON body strictly: bounded size, unknown fields refused.
func decode(c *gin.Context, v any) error { return decodeLimit(c, v, maxBodyBytes, false) }

// decodeOptional is decode for bodies that may be empty (all fields optional).
func decodeOptional(c *gin.Context, v any) error { return decodeLimit(c, v, maxBodyBytes, true) }

// decodeLimit reads a JSON body of at most limit bytes into v, refusing
// unknown fields, trailing data, invalid UTF-8 (which encoding/json would
// silently replace with U+FFFD) and NUL bytes in any string (which it
// decodes from \u0000). Both errors name the field. Every JSON body of the
// API goes through here, so no handler has to remember either check.
func decodeLimit(c *gin.Context, v any, limit int64, optional bool) error {
	raw, err := io.ReadAll(http.MaxBytesReader(c.Writer, c.Request.Body, limit))
	if err != nil {
		return bodyReadError(err)
	}
	if !utf8.Valid(raw) {
		return badRequest("%s is not valid UTF-8", fieldAt(raw, invalidUTF8At(raw)))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		switch {
		case errors.Is(err, io.EOF) && optional:
			return nil
		case errors.Is(err, io.EOF):
			return badRequest("request body is empty")
		}
		return badRequest("invalid JSON: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if dec.More() {
		return badRequest("invalid JSON: trailing data after the object")
	}
	return checkStrings("", reflect.ValueOf(v))
}

// bodyReadError is the answer to a request whose body could not be read:
// 413 over the limit, 408 when the client sent it too slowly for the
// server's read timeout, and 400 for a body cut short (a connection closed
// before Content-Length bytes, a broken chunked encoding). All three are
// the client's doing, so none is a 500.
func bodyReadError(err error) error {
	var (
		tooBig *http.MaxBytesError
		netErr net.Error
	)
	switch {
	case errors.As(err, &tooBig):
		return httpError(http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("request body over %d bytes", tooBig.Limit))
	case errors.As(err, &netErr) && netErr.Timeout():
		return httpError(http.StatusRequestTimeout, "request_timeout", "the request body did not arrive in time")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return badRequest("request body ended before its declared length")
	}
	return badRequest("request body could not be read")
}

// isJSON reports whether a Content-Type header names JSON
// (application/json, parameters such as charset allowed).
func isJSON(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == "application/json"
}

// checkStrings runs checkText on every string reachable from v (struct
// fields, map keys and values, slice elements), naming each by its JSON
// path, e.g. "rollout.labels".
func checkStrings(path string, v reflect.Value) error {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return checkStrings(path, v.Elem())
	case reflect.String:
		return checkText(orBody(path), v.String())
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" {
				name = f.Name
			}
			if f.Anonymous && f.Tag.Get("json") == "" {
				name = ""
			}
			if err := checkStrings(join(path, name), v.Field(i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		iter := v.MapRange()
		for iter.Next() {
			if err := checkStrings(path, iter.Key()); err != nil {
				return err
			}
			if err := checkStrings(path, iter.Value()); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return nil // []byte and json.RawMessage: not text
		}
		for i := range v.Len() {
			if err := checkStrings(path, v.Index(i)); err != nil {
				return err
			}
		}
	}
	return nil
}

func join(path, name string) string {
	switch {
	case path == "":
		return name
	case name == "":
		return path
	}
	return path + "." + name
}

func orBody(path string) string {
	if path == "" {
		return "the request body"
	}
	return path
}

// invalidUTF8At is the offset of the first byte of raw that is not part of
// a valid UTF-8 sequence.
func invalidUTF8At(raw []byte) int {
	for i := 0; i < len(raw); {
		r, n := utf8.DecodeRune(raw[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(raw)
}

// fieldAt names the JSON member whose key or value holds byte off of raw,
// by reading raw's tokens up to it; "the request body" when there is none
// (or the JSON is broken before off).
func fieldAt(raw []byte, off int) string {
	type frame struct {
		object bool
		key    string
		isKey  bool // the next token in this object is a key
	}
	var stack []frame
	path := func() string {
		var parts []string
		for _, f := range stack {
			if f.object && f.key != "" {
				parts = append(parts, f.key)
			}
		}
		return orBody(strings.Join(parts, "."))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	for {
		tok, err := dec.Token()
		if err != nil {
			return path()
		}
		top := len(stack) - 1
		if int(dec.InputOffset()) > off {
			if top >= 0 && stack[top].object && stack[top].isKey {
				if s, ok := tok.(string); ok {
					stack[top].key = s
				}
			}
			return path()
		}
		switch tok {
		case json.Delim('{'):
			if top >= 0 && stack[top].object {
				stack[top].isKey = true
			}
			stack = append(stack, frame{object: true, isKey: true})
			continue
		case json.Delim('['):
			if top >= 0 && stack[top].object {
				stack[top].isKey = true
			}
			stack = append(stack, frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
			continue
		}
		if top >= 0 && stack[top].object {
			if stack[top].isKey {
				stack[top].key, _ = tok.(string)
			}
			stack[top].isKey = !stack[top].isKey
		}
	}
}
