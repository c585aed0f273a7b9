package checkserver

import (
	"strconv"
	"unicode/utf8"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
)

// appendResponseJSON appends r to b as protojson encodes it (lowerCamelCase
// names, enums by name, fields at their zero value left out, a Duration as
// "1.500s"), for the fields toResponse sets. ok is false when r holds
// anything else, or a value protojson would write differently (an unknown
// enum number, invalid UTF-8, a Duration out of range); the caller then
// uses protojson itself.
//
// It exists for speed alone: protojson walks the message by reflection and
// cost about an eighth of the CPU of an HTTP check. A test and a fuzz
// target hold it to protojson's output.
func appendResponseJSON(b []byte, r *rlsv3.RateLimitResponse) ([]byte, bool) {
	if len(r.ResponseHeadersToAdd) > 0 || len(r.RequestHeadersToAdd) > 0 || len(r.RawBody) > 0 ||
		r.DynamicMetadata != nil || r.Quota != nil || len(r.ProtoReflect().GetUnknown()) > 0 {
		return b, false
	}
	b = append(b, '{')
	first := true
	b, ok := appendCodeJSON(b, &first, "overallCode", r.OverallCode)
	if !ok {
		return b, false
	}
	if len(r.Statuses) > 0 {
		b = appendKey(b, &first, "statuses")
		b = append(b, '[')
		for i, s := range r.Statuses {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendStatusJSON(b, s); !ok {
				return b, false
			}
		}
		b = append(b, ']')
	}
	return append(b, '}'), true
}

func appendStatusJSON(b []byte, s *rlsv3.RateLimitResponse_DescriptorStatus) ([]byte, bool) {
	if s == nil || s.Quota != nil || len(s.ProtoReflect().GetUnknown()) > 0 {
		return b, false
	}
	b = append(b, '{')
	first := true
	b, ok := appendCodeJSON(b, &first, "code", s.Code)
	if !ok {
		return b, false
	}
	if l := s.CurrentLimit; l != nil {
		if l.UnitMultiplier != nil || len(l.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(l.Name) {
			return b, false
		}
		b = appendKey(b, &first, "currentLimit")
		b = append(b, '{')
		inner := true
		if l.Name != "" {
			b = appendKey(b, &inner, "name")
			b = appendJSONString(b, l.Name)
		}
		if l.RequestsPerUnit != 0 {
			b = appendKey(b, &inner, "requestsPerUnit")
			b = strconv.AppendUint(b, uint64(l.RequestsPerUnit), 10)
		}
		if l.Unit != rlsv3.RateLimitResponse_RateLimit_UNKNOWN {
			name, ok := rlsv3.RateLimitResponse_RateLimit_Unit_name[int32(l.Unit)]
			if !ok {
				return b, false
			}
			b = appendKey(b, &inner, "unit")
			b = strconv.AppendQuote(b, name)
		}
		b = append(b, '}')
	}
	if s.LimitRemaining != 0 {
		b = appendKey(b, &first, "limitRemaining")
		b = strconv.AppendUint(b, uint64(s.LimitRemaining), 10)
	}
	if d := s.DurationUntilReset; d != nil {
		if d.CheckValid() != nil || d.Seconds < 0 || d.Nanos < 0 || len(d.ProtoReflect().GetUnknown()) > 0 {
			return b, false
		}
		b = appendKey(b, &first, "durationUntilReset")
		b = appendDurationJSON(b, d)
	}
	return append(b, '}'), true
}

// appendKey writes an object member's name (and the comma before it unless
// *first, which it clears).
// appendCodeJSON writes member name with code's name, unless code is
// UNKNOWN (protojson leaves zero values out); false for a number the enum
// does not name.
func appendCodeJSON(b []byte, first *bool, name string, code rlsv3.RateLimitResponse_Code) ([]byte, bool) {
	if code == rlsv3.RateLimitResponse_UNKNOWN {
		return b, true
	}
	s, ok := rlsv3.RateLimitResponse_Code_name[int32(code)]
	if !ok {
		return b, false
	}
	b = appendKey(b, first, name)
	return strconv.AppendQuote(b, s), true
}

func appendKey(b []byte, first *bool, name string) []byte {
	if !*first {
		b = append(b, ',')
	}
	*first = false
	b = append(b, '"')
	b = append(b, name...)
	return append(b, '"', ':')
}

// appendDurationJSON writes a non-negative, valid Duration the way
// protojson does: seconds with 0, 3, 6 or 9 fractional digits, then "s".
func appendDurationJSON(b []byte, d *durationpb.Duration) []byte {
	b = append(b, '"')
	b = strconv.AppendInt(b, d.Seconds, 10)
	if n := d.Nanos; n != 0 {
		digits, div := 9, int32(1)
		for digits > 3 && n%(div*1000) == 0 {
			digits -= 3
			div *= 1000
		}
		frac := strconv.AppendInt(nil, int64(n/div)+pow10(digits), 10) // leading 1 keeps the zeros
		b = append(b, '.')
		b = append(b, frac[1:]...)
	}
	return append(b, 's', '"')
}

func pow10(n int) int64 {
	p := int64(1)
	for range n {
		p *= 10
	}
	return p
}

// appendJSONString quotes valid UTF-8 s as JSON: '"', '\' and control
// characters escaped, everything else as is (as protojson writes it).
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c == '\n':
			b = append(b, '\\', 'n')
		case c == '\r':
			b = append(b, '\\', 'r')
		case c == '\t':
			b = append(b, '\\', 't')
		case c == '\b':
			b = append(b, '\\', 'b')
		case c == '\f':
			b = append(b, '\\', 'f')
		case c < 0x20:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
