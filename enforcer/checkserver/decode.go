package checkserver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/enforcer/engine"
)

// scanAbove is the body size past which a check body is scanned as it
// arrives, before protojson decodes it: a smaller body costs less to
// decode whole than to scan, and the engine refuses it after.
var scanAbove = 64 << 10

// readBody reads an HTTP check body of at most MaxBodyBytes and decodes it
// with protojson. A body declared over MaxBodyBytes is refused before any
// of it is read, and a large one is scanned as it arrives: the first
// descriptor past engine.MaxDescriptors (or entry past engine.MaxEntries)
// refuses it without reading or decoding the rest, so a 1 MiB body of
// 20,000 descriptors costs what its first 65 do. Whatever the scan lets
// through, protojson decodes (its semantics, errors included, are the
// answer's), and the engine applies every bound again.
func readBody(w http.ResponseWriter, r *http.Request, msg *rlsv3.RateLimitRequest) error {
	if r.ContentLength > MaxBodyBytes {
		return &http.MaxBytesError{Limit: MaxBodyBytes}
	}
	body := http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	head := make([]byte, 0, 512)
	head, err := readUpTo(body, head, scanAbove+1)
	if err != nil {
		return readError(err)
	}
	if len(head) > scanAbove {
		var rest bytes.Buffer
		rest.Grow(len(head) * 2)
		rest.Write(head)
		err := scanBounds(io.MultiReader(bytes.NewReader(head), io.TeeReader(body, &rest)))
		if errors.Is(err, engine.ErrInvalidRequest) {
			return err
		}
		if _, err := io.Copy(&rest, body); err != nil {
			return readError(err)
		}
		head = rest.Bytes()
	}
	if err := jsonIn.Unmarshal(head, msg); err != nil {
		return fmt.Errorf("malformed RateLimitRequest: %w", err)
	}
	return nil
}

// readError is a failed body read: a *http.MaxBytesError as it is (the
// caller answers 413), anything else named as a read error.
func readError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return err
	}
	return fmt.Errorf("read request body: %w", err)
}

// readUpTo appends from r to b until b holds n bytes or r ends.
func readUpTo(r io.Reader, b []byte, n int) ([]byte, error) {
	for len(b) < n {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		m, err := r.Read(b[len(b):min(cap(b), n)])
		b = b[:len(b)+m]
		if errors.Is(err, io.EOF) {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
	return b, nil
}

// scanBounds reads a RateLimitRequest's JSON token by token, counting the
// elements of "descriptors" and of each descriptor's "entries", and
// returns an *errOverBounds as soon as one is over the engine's bound. Any
// other error (malformed JSON) ends the scan; protojson then reports it.
// Member names are compared decoded, as protojson compares them, so an
// escaped name ("descr\u0069ptors") is counted too.
func scanBounds(r io.Reader) error {
	type frame struct {
		object  bool
		key     string // the member being read, in an object
		wantKey bool   // the next token of this object is a member name
		n       int    // elements so far, in an array
	}
	dec := json.NewDecoder(r)
	stack := make([]frame, 0, 8)
	// element counts one more element of the array on top of the stack.
	element := func() error {
		top := len(stack) - 1
		if top < 0 || stack[top].object {
			return nil
		}
		stack[top].n++
		switch {
		case top == 1 && stack[0].object && stack[0].key == "descriptors" && stack[top].n > engine.MaxDescriptors:
			return fmt.Errorf("%w: over %d descriptors, at most %d allowed", engine.ErrInvalidRequest, engine.MaxDescriptors, engine.MaxDescriptors)
		case top == 3 && stack[0].key == "descriptors" && stack[2].object && stack[2].key == "entries" && stack[top].n > engine.MaxEntries:
			return fmt.Errorf("%w: descriptors[%d]: over %d entries, at most %d allowed", engine.ErrInvalidRequest, stack[1].n-1, engine.MaxEntries, engine.MaxEntries)
		}
		return nil
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		top := len(stack) - 1
		switch tok {
		case json.Delim('{'), json.Delim('['):
			if err := element(); err != nil {
				return err
			}
			stack = append(stack, frame{object: tok == json.Delim('{'), wantKey: true})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:top]
			if top == 0 {
				return nil
			}
			if p := &stack[top-1]; p.object {
				p.wantKey = true
			}
			continue
		}
		if top < 0 {
			return nil
		}
		if f := &stack[top]; f.object {
			if f.wantKey {
				f.key, _ = tok.(string)
			}
			f.wantKey = !f.wantKey
			continue
		}
		if err := element(); err != nil {
			return err
		}
	}
}
