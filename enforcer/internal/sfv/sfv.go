// Package sfv parses HTTP structured-field lists (RFC 8941 §4.2.1), the
// syntax of the IETF RateLimit and RateLimit-Policy fields. Tests use it to
// read the enforcer's headers the way a strict client would.
package sfv

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Token is a structured-field token (an unquoted identifier).
type Token string

// Param is one parameter of an item.
type Param struct {
	Key   string
	Value any
}

// Item is a bare item with its parameters. Value is a string, Token, int64,
// float64, bool or []byte. Inner lists are parsed as an Item whose Value is
// []Item.
type Item struct {
	Value  any
	Params []Param
}

// Param returns the value of parameter key, and whether it is present.
func (it Item) Param(key string) (any, bool) {
	for _, p := range it.Params {
		if p.Key == key {
			return p.Value, true
		}
	}
	return nil, false
}

// ErrSyntax is wrapped by every parse error.
var ErrSyntax = errors.New("structured field syntax error")

// ParseList parses the field lines of a List field (joined with ", " as
// RFC 9110 combines them).
func ParseList(lines ...string) ([]Item, error) {
	p := &parser{s: strings.Join(lines, ", ")}
	p.skipSP()
	var out []Item
	for !p.done() {
		it, err := p.member()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.skipOWS()
		if p.done() {
			return out, nil
		}
		if p.peek() != ',' {
			return nil, p.fail("expected ',' after list member")
		}
		p.i++
		p.skipOWS()
		if p.done() {
			return nil, p.fail("trailing ','")
		}
	}
	if p.i < len(p.s) {
		return nil, p.fail("unexpected input")
	}
	return out, nil
}

type parser struct {
	s string
	i int
}

func (p *parser) done() bool { return p.i >= len(p.s) }
func (p *parser) peek() byte { return p.s[p.i] }

func (p *parser) fail(msg string) error {
	return fmt.Errorf("%w at %d in %q: %s", ErrSyntax, p.i, p.s, msg)
}

func (p *parser) skipSP() {
	for !p.done() && p.peek() == ' ' {
		p.i++
	}
}

func (p *parser) skipOWS() {
	for !p.done() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

func (p *parser) member() (Item, error) {
	if !p.done() && p.peek() == '(' {
		return p.innerList()
	}
	return p.item()
}

func (p *parser) innerList() (Item, error) {
	p.i++ // (
	var items []Item
	for !p.done() {
		p.skipSP()
		if p.done() { // "( ": spaces, then the end
			break
		}
		if p.peek() == ')' {
			p.i++
			params, err := p.params()
			return Item{Value: items, Params: params}, err
		}
		it, err := p.item()
		if err != nil {
			return Item{}, err
		}
		items = append(items, it)
		if p.done() || (p.peek() != ' ' && p.peek() != ')') {
			return Item{}, p.fail("expected ' ' or ')' in inner list")
		}
	}
	return Item{}, p.fail("unterminated inner list")
}

func (p *parser) item() (Item, error) {
	v, err := p.bare()
	if err != nil {
		return Item{}, err
	}
	params, err := p.params()
	return Item{Value: v, Params: params}, err
}

func (p *parser) params() ([]Param, error) {
	var out []Param
	for !p.done() && p.peek() == ';' {
		p.i++
		p.skipSP()
		k, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if !p.done() && p.peek() == '=' {
			p.i++
			if v, err = p.bare(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for j := range out {
			if out[j].Key == k {
				out[j].Value, replaced = v, true
			}
		}
		if !replaced {
			out = append(out, Param{k, v})
		}
	}
	return out, nil
}

func (p *parser) key() (string, error) {
	start := p.i
	if p.done() || !(isLower(p.peek()) || p.peek() == '*') {
		return "", p.fail("key must start with a lowercase letter or '*'")
	}
	for !p.done() {
		c := p.peek()
		if !(isLower(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*') {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *parser) bare() (any, error) {
	if p.done() {
		return nil, p.fail("expected a value")
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || isAlpha(c):
		return p.token()
	case c == ':':
		return p.bytes()
	case c == '?':
		return p.boolean()
	}
	return nil, p.fail("unrecognised value")
}

func (p *parser) number() (any, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	if p.done() || !isDigit(p.peek()) {
		return nil, p.fail("expected a digit")
	}
	decimal := false
	for !p.done() {
		c := p.peek()
		if isDigit(c) {
			p.i++
			continue
		}
		if c == '.' && !decimal {
			if p.i-start > 12 {
				return nil, p.fail("decimal integer part too long")
			}
			decimal = true
			p.i++
			continue
		}
		break
	}
	num := p.s[start:p.i]
	digits := strings.TrimPrefix(num, "-")
	if !decimal {
		if len(digits) > 15 {
			return nil, p.fail("integer too long")
		}
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, p.fail("bad integer")
		}
		return n, nil
	}
	if strings.HasSuffix(num, ".") {
		return nil, p.fail("decimal ends with '.'")
	}
	if _, frac, _ := strings.Cut(digits, "."); len(frac) > 3 {
		return nil, p.fail("decimal has more than 3 fraction digits")
	}
	f, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return nil, p.fail("bad decimal")
	}
	return f, nil
}

func (p *parser) str() (any, error) {
	p.i++ // "
	var b strings.Builder
	for !p.done() {
		c := p.peek()
		p.i++
		switch {
		case c == '\\':
			if p.done() {
				return nil, p.fail("dangling escape")
			}
			n := p.peek()
			if n != '"' && n != '\\' {
				return nil, p.fail("bad escape")
			}
			b.WriteByte(n)
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return nil, p.fail("non-printable character in string")
		default:
			b.WriteByte(c)
		}
	}
	return nil, p.fail("unterminated string")
}

func (p *parser) token() (any, error) {
	start := p.i
	p.i++
	for !p.done() {
		c := p.peek()
		if !(isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0) {
			break
		}
		p.i++
	}
	return Token(p.s[start:p.i]), nil
}

func (p *parser) bytes() (any, error) {
	p.i++ // :
	end := strings.IndexByte(p.s[p.i:], ':')
	if end < 0 {
		return nil, p.fail("unterminated byte sequence")
	}
	b, err := base64.StdEncoding.DecodeString(p.s[p.i : p.i+end])
	if err != nil {
		return nil, p.fail("bad base64")
	}
	p.i += end + 1
	return b, nil
}

func (p *parser) boolean() (any, error) {
	p.i++ // ?
	if p.done() {
		return nil, p.fail("expected 0 or 1")
	}
	c := p.peek()
	p.i++
	switch c {
	case '1':
		return true, nil
	case '0':
		return false, nil
	}
	return nil, p.fail("expected 0 or 1")
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isAlpha(c byte) bool { return isLower(c) || (c >= 'A' && c <= 'Z') }
